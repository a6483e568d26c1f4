#!/usr/bin/env bash
# tests/check/valgrind.sh: memcheck over a subset of the unit tests (all the
# allocator's own tests; the slow sweeps and the CLI/model tests are left to
# ASan) and the stress program, following every Criterion worker
# (--trace-children) with one log per process; any "ERROR SUMMARY: N" with
# N > 0, or a definite leak, fails (toolchain.md section 5).
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${BUILD:-build}
LOG=$(mktemp -d /tmp/stow-vg.XXXXXX)
TESTS=${VALGRIND_TESTS:-"test_pool test_stream test_size_class test_free_index test_ptr_map test_options test_trace"}
JOBS=${JOBS:-2}
ran=0
vg_one() {
  valgrind -q --trace-children=yes --leak-check=full --errors-for-leak-kinds=definite \
    --error-exitcode=9 --log-file="$LOG/$1.%p.log" "$B/$1" --jobs 1 >/dev/null 2>&1 ||
    { echo "valgrind: $1 failed"; cat "$LOG/$1".*.log; return 1; }
}
pids=()
for t in $TESTS; do
  [ -x "$B/$t" ] || continue
  vg_one "$t" & pids+=($!)
  ran=$((ran + 1))
  if [ ${#pids[@]} -ge "$JOBS" ]; then wait "${pids[0]}" || exit 1; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p" || exit 1; done
valgrind -q --leak-check=full --errors-for-leak-kinds=definite --error-exitcode=9 \
  --log-file="$LOG/stress.%p.log" "$B/stress_threads" 2 5000 >/dev/null
bad=$(grep -l 'ERROR SUMMARY: [1-9]' "$LOG"/*.log || true)
if [ -n "$bad" ]; then echo "valgrind errors:"; cat $bad; exit 1; fi
echo "valgrind: $ran test programs + stress_threads, $(ls "$LOG" | wc -l) processes, 0 errors"
rm -rf "$LOG"
