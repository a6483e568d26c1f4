#!/usr/bin/env bash
# bench/mixed_heldout.sh: every policy on two workloads sharing one pool
# (docs/benchmarks.md, held-out traces).
#
# bench/mixed_traces.py writes each pair of shared traces as one trace, the two
# interleaved event by event (CHUNKS=1) or in turns of about 1000 events
# (CHUNKS=1000), both on stream 0 or on two streams (STREAMS=same,separate).
# Each is replayed with --min-capacity under classic, vmm, pytorch and
# pytorch-expandable, and the script prints one Markdown row per trace (peak
# reserved / peak live and minimum capacity / peak live for each policy, and
# the peak of the ideal-remap yardstick), then a summary: the traces where
# classic's minimum capacity is above the pytorch model's, those where vmm is
# above 1.01 x live on either figure, and which of them ideal-remap keeps
# within 1.01 (bench/heldout_table.py).
# Extra arguments go to the replays: settings (--conf ...) and the pool's
# measured constants (--tuning ..., stowage/tuning.h).
# Usage: bench/mixed_heldout.sh [--conf KEY:VALUE,...] [--tuning KEY:VALUE,...]
# (from the repository root, after building; PAIRS=A+B,... restricts the pairs;
# the default 40 traces take a few minutes on 2 cores)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/bench/shared_traces.sh"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

python3 "$root/bench/mixed_traces.py" "$out/mixed" --src "$traces_dir" \
    --chunks "${CHUNKS:-1,1000}" --streams "${STREAMS:-same,separate}" \
    ${PAIRS:+--pairs "$PAIRS"} >"$out/list.txt"
n=$(wc -l <"$out/list.txt")
echo "replay --min-capacity, 5 policies, on $n mixed traces ..." >&2
while read -r t; do
    "$root/build/stowage" replay --policy classic --policy vmm --policy pytorch \
        --policy pytorch-expandable --policy ideal-remap --min-capacity --repeats 1 --json "$@" "$t"
done <"$out/list.txt" >"$out/replay.jsonl"

python3 "$root/bench/heldout_table.py" "$out/replay.jsonl"
