#!/bin/sh
# bench/plan_bench.sh: run `stowage plan` on the benchmark files and print one
# table row per file (docs/planner.md, "Results").
#
# usage: bench/plan_bench.sh [STOWAGE_BINARY] [DATA_DIR] [TIME_LIMIT]
#   defaults: build/stowage, ../shared/data, 10 (seconds per file)
# MiniMalloc's challenging files are solved at their capacity 1,048,576 (the
# decision problem of the paper); idealloc's traces have no capacity, so the
# height is minimised.
set -u
BIN=${1:-build/stowage}
DATA=${2:-../shared/data}
LIMIT=${3:-10}
[ -x "$BIN" ] || { echo "no binary $BIN (build first)" >&2; exit 2; }

row() {
    # $1 = file, rest = extra options
    f=$1; shift
    "$BIN" plan --json --time-limit "$LIMIT" "$@" "$f" | python3 -c '
import json, sys
d = json.load(sys.stdin)
cap = d["capacity"] or "-"
print("| %s | %d | %d | %d | %.6f | %.3f | %s | %s | %s |" % (
    d["file"].split("/")[-2] + "/" + d["file"].split("/")[-1], d["buffers"], d["lower_bound"],
    d["height"], d["ratio"], d["seconds"], cap, "yes" if d["fits"] else "NO",
    "valid" if d["valid"] else "INVALID"))'
}

echo "| file | buffers | lower bound | height | height/LB | seconds | capacity | fits | validator |"
echo "|---|---:|---:|---:|---:|---:|---:|---|---|"
for f in "$DATA"/minimalloc/[A-K].1048576.csv; do
    row "$f" --capacity 1048576
done
for f in "$DATA"/idealloc/iopddl/G_1.csv "$DATA"/idealloc/iopddl/S_1.csv \
         "$DATA"/idealloc/iopddl/Y_1.csv "$DATA"/idealloc/somas_tensors/pangu_2.6B.csv \
         "$DATA"/idealloc/somas_tensors/resnet50.csv; do
    row "$f"
done
