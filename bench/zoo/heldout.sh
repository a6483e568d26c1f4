#!/usr/bin/env bash
# bench/zoo/heldout.sh: every policy on the corpus of model workloads (bench/zoo/README.md), as
# a held-out set of docs/benchmarks.md.
#
# The indexed traces are unpacked into a temporary folder (build.py --unpack: `stowage replay`
# reads plain .rep files), replayed with --min-capacity under classic, vmm, pytorch,
# pytorch-expandable and the ideal-remap yardstick, and bench/heldout_table.py prints one
# Markdown row per workload and the summary of the held-out goals. Extra arguments go to the
# replays (--conf ...). STOWAGE names the CLI (default build/stowage).
# Usage: bench/zoo/heldout.sh [--conf KEY:VALUE,...]   (from the repository root, after building)
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
stowage=${STOWAGE:-$root/build/stowage}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

python3 "$root/bench/zoo/build.py" --unpack "$out/rep"
n=0
for t in "$out"/rep/*.rep; do
    n=$((n + 1))
    "$stowage" replay --policy classic --policy vmm --policy pytorch \
        --policy pytorch-expandable --policy ideal-remap --min-capacity --repeats 1 --json "$@" "$t"
done >"$out/replay.jsonl"
echo "replay --min-capacity, 5 policies, on $n model workloads" >&2
python3 "$root/bench/heldout_table.py" "$out/replay.jsonl"
