#!/usr/bin/env bash
# tests/check/integrity.sh: the data-integrity stress (tests/stress/stress_integrity.c)
# beyond the bounded runs of `make test` (ctest's stress_integrity* and tests/check/tsan.sh).
#
#   integrity.sh long [SECONDS_PER_POOL]
#       Every mode of both pools under nice, SECONDS_PER_POOL (default 600) per pool,
#       split evenly over its five modes; the classic and the page-mapped pool run side
#       by side. Prints each mode's figures and each pool's totals. Needs build/ (make build).
#   integrity.sh sabotage
#       Copies the tree, builds the stress there, checks that it passes, then applies one
#       deliberate bug at a time (blocks overlapping, a live granule unmapped, a remap
#       under queued work, a record_stream forgotten, half a scrub), rebuilds and checks
#       that the stress fails with the pool's own check left out (--no-pool-check): on
#       the data (CORRUPTION, FAULT) or on the device's rules (DEVICE RULE); prints the
#       seconds each run took and how it failed. The tree itself is never changed. Exits
#       non-zero if a bug goes uncaught.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${BUILD:-build}

classic_modes=("policy:classic,quick_depth:0,quick_mid_slots:0" "policy:classic"
               "reuse_other_streams_on_miss:true" "scrub_on_free:true"
               "policy:classic,planned_steps:true")
vmm_modes=("policy:vmm" "policy:vmm,vmm_small_kb:0" "policy:vmm,scrub_on_free:true"
           "policy:vmm,vmm_learn_step:true" "policy:vmm,planned_steps:true")

# Runs the modes of one pool one after another, secs each; the log gets their lines.
run_pool() {
  local log=$1 secs=$2 seed=$3; shift 3
  for mode in "$@"; do
    local extra=()
    [[ $mode == *vmm_learn_step:true* || $mode == *planned_steps:true* ]] &&
      extra=(--loop-steps 50 --min-plans 1)
    nice "$B/stress_integrity" --seconds "$secs" --seed "$seed" "${extra[@]}" "$mode" >>"$log" 2>&1 ||
      { echo "integrity: $mode FAILED"; tail -40 "$log"; return 1; }
    seed=$((seed + 1))
  done
}

totals() { # a pool's figures, summed over its lines
  python3 - "$1" "$2" <<'PY'
import re, sys
keys = ["allocations", "GiB written", "GiB checked", "GiB checked zero", "out-of-memory",
        "release-and-retry", "remaps", "event waits", "step plans", "planned allocations"]
tot = dict.fromkeys(keys, 0.0)
secs = 0.0
for line in open(sys.argv[2]):
    if not line.startswith('stress_integrity: "'):
        continue
    secs += float(re.search(r" in ([0-9.]+) s:", line).group(1))
    for k in keys:
        tot[k] += float(re.search(r"([0-9.]+) " + re.escape(k) + r"\b", line).group(1))
print(f"integrity: {sys.argv[1]} total: {secs:.0f} s, " + ", ".join(
    f"{tot[k]:.1f} {k}" if "GiB" in k else f"{int(tot[k])} {k}" for k in keys))
PY
}

long_run() {
  local per_pool=${1:-600}
  [ -x "$B/stress_integrity" ] || { echo "integrity: build $B first (make build)"; exit 2; }
  work=$(mktemp -d /tmp/stow-integrity.XXXXXX)
  local classic_secs=$((per_pool / ${#classic_modes[@]})) vmm_secs=$((per_pool / ${#vmm_modes[@]}))
  run_pool "$work/classic.log" "$classic_secs" 100 "${classic_modes[@]}" & local pc=$!
  run_pool "$work/vmm.log" "$vmm_secs" 200 "${vmm_modes[@]}" & local pv=$!
  local status=0
  wait $pc || status=1
  wait $pv || status=1
  grep -h '^stress_integrity: "' "$work/classic.log" "$work/vmm.log" || true
  totals classic "$work/classic.log"
  totals vmm "$work/vmm.log"
  return $status
}

# name|file|conf|old|new: old and new are Python literals, a string or a tuple of strings;
# each old must occur exactly once in the file.
sabotages=(
  "blocks overlap|allocator/pool.c|policy:classic|'    stow_block_t *rem = cut_block(pool, b, rounded);\n'|'    stow_block_t *rem = cut_block(pool, b, rounded);\n    rem->addr -= 512; /* sabotage: the remainder overlaps the block */\n    rem->size_bytes += 512;\n'"
  "live granule unmapped: a block's last granule left out of its span|allocator/vmm.h|policy:vmm|('    return stow__vmm_back_span(pool, b, size_bytes, first, last + 1);\n', '    stow__vmm_unback_span(pool, b, first, last + 1);\n')|('    return stow__vmm_back_span(pool, b, size_bytes, first, last + (last > first ? 0 : 1));\n', '    stow__vmm_unback_span(pool, b, first, last + (last > first ? 0 : 1));\n')"
  "live granule unmapped: a granule shared with a live block counted unused|allocator/vmm.c|policy:vmm|'    if (--seg->granules[first].edges)\n'|'    if (--seg->granules[first].edges && 0) /* sabotage */\n'"
  "remap under queued work|allocator/vmm.c|policy:vmm|'    if (!stow__vmm_unused_ready(pool, epoch, *synced)) {\n'|'    if (0 && !stow__vmm_unused_ready(pool, epoch, *synced)) { /* sabotage: no wait */\n'"
  "record_stream forgotten|allocator/pool.c|policy:classic|'        st = stow__stream_add_use(pool, b, stream);\n'|'        st = STOW_OK; /* sabotage: the other stream is forgotten */\n'"
  "half a scrub|allocator/pool.c|scrub_on_free:true|'(void *)b->addr, b->size_bytes,\n'|'(void *)b->addr, b->size_bytes / 2, /* sabotage */\n'"
)

patch_file() { # file old new
  python3 - "$@" <<'PY'
import ast, sys
path, old, new = sys.argv[1], ast.literal_eval(sys.argv[2]), ast.literal_eval(sys.argv[3])
olds, news = (old, new) if isinstance(old, tuple) else ((old,), (new,))
text = open(path).read()
for o, n in zip(olds, news):
    if text.count(o) != 1:
        sys.exit(f"integrity: {path}: a sabotaged line occurs {text.count(o)} times, not once")
    text = text.replace(o, n)
open(path, "w").write(text)
PY
}

seconds_since() { python3 -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.2f}')" "$1"; }

sabotage() {
  work=$(mktemp -d /tmp/stow-sabotage.XXXXXX)
  git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$work"
  cmake -S "$work" -B "$work/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTOW_LTO=OFF \
        -DSTOW_BUILD_TESTS=OFF -DSTOW_DEBUG=1 -DSTOW_WERROR=ON >/dev/null
  local t0; t0=$(date +%s.%N)
  nice cmake --build "$work/build" -j"${JOBS:-2}" --target stress_integrity >/dev/null
  echo "integrity: the copy built in $(seconds_since "$t0") s"
  for conf in policy:classic policy:vmm scrub_on_free:true; do
    "$work/build/stress_integrity" --ops 300 --no-pool-check "$conf" >/dev/null ||
      { echo "integrity: the unsabotaged copy fails with $conf"; return 1; }
  done
  echo "integrity: unsabotaged, the stress passes (policy:classic, policy:vmm, scrub_on_free:true)"
  local missed=0
  for s in "${sabotages[@]}"; do
    IFS='|' read -r name file conf old new <<<"$s"
    cp "$work/$file" "$work/$file.orig"
    patch_file "$work/$file" "$old" "$new"
    nice cmake --build "$work/build" -j"${JOBS:-2}" --target stress_integrity >/dev/null
    local start rc=0
    start=$(date +%s.%N)
    timeout 600 "$work/build/stress_integrity" --seconds 300 --no-pool-check "$conf" \
      >"$work/run.log" 2>&1 || rc=$?
    local secs; secs=$(seconds_since "$start")
    local how; how=$(grep -m1 -o -E '^stress_integrity: (CORRUPTION|FAULT|DEVICE RULE)' \
                       "$work/run.log" | sed 's/stress_integrity: //' || true)
    if [ "$rc" = 1 ] && [ -n "$how" ]; then
      echo "integrity: sabotage \"$name\" ($conf): caught in $secs s ($how)"
      grep -v -E '^    #' "$work/run.log" | head -8 | sed 's/^/    /'
    else
      echo "integrity: sabotage \"$name\" ($conf): NOT caught (exit $rc, $secs s)"
      tail -5 "$work/run.log" | sed 's/^/    /'
      missed=$((missed + 1))
    fi
    cp "$work/$file.orig" "$work/$file" # a new mtime: the next build recompiles it
    rm "$work/$file.orig"
  done
  [ "$missed" = 0 ]
}

work=""
cleanup() { [ -z "$work" ] || rm -rf "$work"; }
trap cleanup EXIT

case "${1:-}" in
  long) long_run "${2:-600}" ;;
  sabotage) sabotage ;;
  *) echo "usage: $0 long [SECONDS_PER_POOL] | sabotage"; exit 2 ;;
esac
