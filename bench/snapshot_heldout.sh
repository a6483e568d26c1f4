#!/usr/bin/env bash
# bench/snapshot_heldout.sh: every policy on the workloads of public PyTorch memory snapshots
# (docs/benchmarks.md, held-out traces; docs/pytorch_model.md, public snapshots).
#
# DIR holds snapshots (python3 bench/fetch_snapshots.py DIR fetches those of
# bench/snapshots.txt). bench/snapshot_check.py --workloads writes each device trace's requests
# from an empty device (the blocks alive when recording began first, in address order); the
# distinct ones are replayed with --min-capacity under classic, vmm, pytorch, pytorch-expandable
# and the ideal-remap yardstick, and bench/heldout_table.py prints one Markdown row per workload
# and the summary of the held-out goals. Extra arguments go to the replays: settings
# (--conf ...) and the pool's measured constants (--tuning ..., stowage/tuning.h).
# Usage: bench/snapshot_heldout.sh DIR [--conf KEY:VALUE,...] [--tuning KEY:VALUE,...]
# (from the repository root, after building; the 40 distinct workloads of bench/snapshots.txt
# take under a minute on 2 cores)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:?usage: bench/snapshot_heldout.sh DIR [--conf ...] [--tuning ...]}
shift
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

python3 "$root/bench/snapshot_check.py" --stowage "$root/build/stowage" \
    --workloads "$out/wl" "$dir"/* >"$out/check.txt" || true
[ -d "$out/wl" ] || { echo "snapshot_heldout: no workload from $dir" >&2; exit 1; }
# The same requests recorded twice (a file committed under two names) count once.
n=0
declare -A seen=()
for t in "$out"/wl/*.rep; do
    sum=$(md5sum <"$t" | cut -d' ' -f1)
    [ -n "${seen[$sum]:-}" ] && continue
    seen[$sum]=1
    n=$((n + 1))
    "$root/build/stowage" replay --policy classic --policy vmm --policy pytorch \
        --policy pytorch-expandable --policy ideal-remap --min-capacity --repeats 1 --json "$@" "$t"
done >"$out/replay.jsonl"
echo "replay --min-capacity, 5 policies, on $n distinct workloads" >&2
python3 "$root/bench/heldout_table.py" "$out/replay.jsonl"
