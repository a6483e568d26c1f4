#!/usr/bin/env bash
# tests/check/asan.sh: the whole suite built with ASan + UBSan (STOW_SANITIZE:
# -fsanitize=address,undefined -fno-sanitize-recover=undefined), then the
# plain-main programs again where LeakSanitizer works at exit: the stress
# programs and a replay of the bundled trace by the CLI (docs/reliability.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${ASAN_BUILD:-build-asan}
JOBS=${JOBS:-2}
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTOW_SANITIZE=ON -DSTOW_DEBUG=1 \
      -DSTOW_WERROR=ON >/dev/null
cmake --build "$B" -j"$JOBS" >/dev/null
export UBSAN_OPTIONS=print_stacktrace=1
# Criterion suites: LSan cannot see the workers (they _exit), and the Criterion
# runner itself leaks 48 B at exit when a test is skipped, so leaks are off here.
# With STOW_TEST_RESULTS set (make test), ctest also writes every test's output to
# $STOW_TEST_RESULTS/asan-ctest.xml, Criterion naming each skipped test with its
# reason (verbosity 1), for tests/check/summary.py to count test by test.
junit=()
if [ -n "${STOW_TEST_RESULTS:-}" ]; then
  junit=(--output-junit "$STOW_TEST_RESULTS/asan-ctest.xml" --test-output-size-passed 8000000
         --test-output-size-failed 8000000)
  export CRITERION_VERBOSITY_LEVEL=1
fi
(cd "$B" && ASAN_OPTIONS=detect_leaks=0 ctest --output-on-failure -j"$JOBS" "${junit[@]}")
export ASAN_OPTIONS=detect_leaks=1
# LeakSanitizer at exit (Criterion workers leave with _exit, so not there):
# the stress programs and the leak regressions.
for p in "$B"/stress_* "$B"/regress_*; do
  [ -x "$p" ] && "$p"
done
"$B"/stowage replay bench/traces/resnet50_train.rep >/dev/null
echo "asan: suite, stress programs and CLI replay clean (ASan+UBSan, LSan at exit)"
