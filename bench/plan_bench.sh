#!/bin/sh
# bench/plan_bench.sh: run `stowage plan` on the benchmark files and print one
# table row per file (docs/planner.md, "Results").
#
# usage: bench/plan_bench.sh [STOWAGE_BINARY] [DATA_DIR] [TIME_LIMIT] [TRACE_DIR]
#   defaults: build/stowage, ../shared/data, 10 (seconds per file), ../shared/traces
# MiniMalloc's challenging files are solved at their capacity 1,048,576 (the
# decision problem of the paper); idealloc's traces have no capacity, so the
# height is minimised; allocation traces are planned with --from-trace (height
# against the trace's peak live bytes). "wall" is the whole command's wall time
# and "cpu" its user + system CPU time (GNU time), which does not grow with the
# machine's load the way wall time does.
set -u
BIN=${1:-build/stowage}
DATA=${2:-../shared/data}
LIMIT=${3:-10}
TRACES=${4:-../shared/traces}
[ -x "$BIN" ] || { echo "no binary $BIN (build first)" >&2; exit 2; }
TMP=${TMPDIR:-/tmp}/plan_bench.$$
trap 'rm -f "$TMP"' EXIT

row() {
    # $1 = file, rest = extra options
    f=$1; shift
    /usr/bin/time -f "%e %U %S" -o "$TMP" "$BIN" plan --json --time-limit "$LIMIT" "$@" "$f" |
        python3 -c '
import json, sys
d = json.load(sys.stdin)
wall, usr, sy = open(sys.argv[1]).read().split()[-3:]
cap = d["capacity"] or "-"
print("| %s | %d | %d | %d | %.6f | %.2f | %.2f | %s | %s | %s | %s |" % (
    d["file"].split("/")[-2] + "/" + d["file"].split("/")[-1], d["buffers"], d["lower_bound"],
    d["height"], d["ratio"], float(wall), float(usr) + float(sy), cap,
    "yes" if d["fits"] else "NO", "valid" if d["valid"] else "INVALID", d["method"]))' "$TMP"
}

echo "| file | buffers | lower bound | height | height/LB | wall s | cpu s | capacity | fits | validator | method |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|"
for f in "$DATA"/minimalloc/[A-K].1048576.csv; do
    row "$f" --capacity 1048576
done
for f in "$DATA"/idealloc/iopddl/G_1.csv "$DATA"/idealloc/iopddl/S_1.csv \
         "$DATA"/idealloc/iopddl/Y_1.csv "$DATA"/idealloc/somas_tensors/pangu_2.6B.csv \
         "$DATA"/idealloc/somas_tensors/resnet50.csv; do
    row "$f"
done
for f in "$TRACES"/*.rep; do
    [ -f "$f" ] && row "$f" --from-trace
done
exit 0
