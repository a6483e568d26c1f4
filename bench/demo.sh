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

echo "== Stowage (the default pool: policy vmm on a device that maps pages) replaying $TRACE on the simulated device =="
"$BUILD/stowage" replay --summary "$TRACE"
echo
echo "== Headline: peak reserved bytes on the same trace =="
"$BUILD/stowage" replay --json --repeats 3 --policy classic --policy vmm --policy ideal-remap \
    "$TRACE" | awk \
    -v native="$PYTORCH_NATIVE_BYTES" -v expand="$PYTORCH_EXPANDABLE_BYTES" '
  function num(key,   m) { if (match($0, "\"" key "\": [0-9.]+")) { m = substr($0, RSTART, RLENGTH); sub(/.*: /, "", m); return m } return "" }
  function str(key,   m) { if (match($0, "\"" key "\": \"[^\"]*\"")) { m = substr($0, RSTART, RLENGTH); sub(/.*: "/, "", m); sub(/"$/, "", m); return m } return "" }
  {
    live = num("peak_live_bytes"); res[NR] = num("peak_reserved_bytes"); ns[NR] = num("ns_per_event"); pol[NR] = str("policy")
  }
  END {
    printf "  %-34s %14s bytes  %.3f x live\n", "peak live (lower bound)", live, 1
    for (i = 1; i <= NR; i++)
      if (pol[i] == "ideal-remap")
        printf "  %-34s %14s bytes  %.3f x live   (best fit, pages only under live data, no cache)\n", "ideal remapping (yardstick)", res[i], res[i] / live
      else
        printf "  %-34s %14s bytes  %.3f x live   (%.1f ns/event on this host)\n", "Stowage " pol[i], res[i], res[i] / live, ns[i]
    printf "  %-34s %14s bytes  %.3f x live   (measured on the H200)\n", "PyTorch 2.11 native", native, native / live
    printf "  %-34s %14s bytes  %.3f x live   (measured on the H200)\n", "PyTorch expandable_segments", expand, expand / live
    printf "  Stowage classic reserves %.1f%% less than PyTorch native at its peak; vmm %.1f%% less.\n", 100 * (1 - res[1] / native), 100 * (1 - res[2] / native)
  }'
