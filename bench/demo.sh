#!/usr/bin/env bash
# make demo: replay the bundled real trace (ResNet-50 training on an H200) on
# the simulated device, print Stowage's memory summary and the headline
# figures next to what PyTorch's own allocator reserved on the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
TRACE=bench/traces/resnet50_train.rep
PYTORCH_NATIVE_BYTES=6824132608   # bench/traces/README.md
PYTORCH_EXPANDABLE_BYTES=6098518016

echo "== Stowage (policy classic) replaying $TRACE on the simulated device =="
"$BUILD/stowage" replay --summary "$TRACE"
echo
echo "== Headline: peak reserved bytes on the same trace =="
"$BUILD/stowage" replay --json --repeats 3 "$TRACE" | awk -v native="$PYTORCH_NATIVE_BYTES" \
    -v expand="$PYTORCH_EXPANDABLE_BYTES" '
  function num(key,   m) { if (match($0, "\"" key "\": [0-9.]+")) { m = substr($0, RSTART, RLENGTH); sub(/.*: /, "", m); return m } return "" }
  {
    live = num("peak_live_bytes"); res = num("peak_reserved_bytes"); ns = num("ns_per_event")
    printf "  %-34s %14s bytes  %.3f x live\n", "peak live (lower bound)", live, 1
    printf "  %-34s %14s bytes  %.3f x live   (%.1f ns/event on this host)\n", "Stowage classic", res, res / live, ns
    printf "  %-34s %14s bytes  %.3f x live   (measured on the H200)\n", "PyTorch 2.11 native", native, native / live
    printf "  %-34s %14s bytes  %.3f x live   (measured on the H200)\n", "PyTorch expandable_segments", expand, expand / live
    printf "  Stowage reserves %.1f%% less than PyTorch native at its peak.\n", 100 * (1 - res / native)
  }'
