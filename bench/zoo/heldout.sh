#!/usr/bin/env bash
# bench/zoo/heldout.sh: every policy on the corpus of model workloads (bench/zoo/README.md), as
# a held-out set of docs/benchmarks.md.
#
# Each trace of index.csv is replayed as it is committed (`stowage replay` reads .rep.gz) with
# --min-capacity under classic, vmm, pytorch, pytorch-expandable and the ideal-remap yardstick,
# JOBS at a time (default 2), and bench/heldout_table.py prints one Markdown row per workload
# and the summary of the held-out goals. Extra arguments go to the replays: settings
# (--conf ...) and the pool's measured constants (--tuning ..., stowage/tuning.h).
# STOWAGE names the CLI (default build/stowage).
# Usage: bench/zoo/heldout.sh [--conf KEY:VALUE,...] [--tuning KEY:VALUE,...]   (from the
# repository root, after building)
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
stowage=${STOWAGE:-$root/build/stowage}
jobs=${JOBS:-2}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# One JSON file per trace, so that parallel replays never interleave their lines.
tail -n +2 "$root/bench/zoo/index.csv" | awk -F, '{print $NF}' |
    STOWAGE="$stowage" ZOO="$root/bench/zoo/traces" OUT="$out" xargs -P "$jobs" -I{} \
        sh -c 'exec "$STOWAGE" replay --policy classic --policy vmm --policy pytorch \
            --policy pytorch-expandable --policy ideal-remap --min-capacity --repeats 1 --json \
            "$@" "$ZOO/$0" >"$OUT/$(echo "$0" | tr / _).jsonl"' {} "$@"
n=$(find "$out" -name '*.jsonl' | wc -l)
echo "replay --min-capacity, 5 policies, on $n model workloads" >&2
cat "$out"/*.jsonl >"$out/replay.all"
python3 "$root/bench/heldout_table.py" "$out/replay.all"
