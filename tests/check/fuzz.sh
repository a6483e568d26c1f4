#!/usr/bin/env bash
# tests/check/fuzz.sh: builds the libFuzzer targets (tests/fuzz/fuzz_*.c, clang,
# -fsanitize=fuzzer,address,undefined) and runs each for FUZZ_SECONDS (20)
# from a scratch copy of its committed corpus (tests/fuzz/corpus/<name>/), so
# CI never writes into the checkout. A crash, leak, timeout or check failure
# fails the run; its input is kept in $B/artifacts. An input may take 60 s
# before it counts as a hang: fuzz_planned's longest inputs (60,000 operations
# of planned steps, every block's contents written and checked) take 30-40 s
# on a 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${FUZZ_BUILD:-build-fuzz}
SECS=${FUZZ_SECONDS:-20}
JOBS=${JOBS:-2}
CC=${FUZZ_CC:-clang} cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTOW_FUZZ=ON \
   -DSTOW_BUILD_TESTS=OFF -DSTOW_DEBUG=1 >/dev/null
targets=$(cd tests/fuzz && ls fuzz_*.c | sed 's/\.c$//')
cmake --build "$B" -j"$JOBS" --target $targets >/dev/null
mkdir -p "$B/artifacts"
for t in $targets; do
  short=${t#fuzz_}
  work="$B/corpus/$short"
  rm -rf "$work"; mkdir -p "$work"
  [ -d "tests/fuzz/corpus/$short" ] && cp -r "tests/fuzz/corpus/$short/." "$work/"
  ASAN_OPTIONS="detect_leaks=1" "$B/$t" -max_total_time="$SECS" -timeout=60 \
    -detect_leaks=1 -print_final_stats=1 -artifact_prefix="$B/artifacts/$t-" "$work" \
    >"$B/$t.log" 2>&1 || { echo "fuzz: $t found a problem:"; tail -60 "$B/$t.log"; exit 1; }
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$B/$t.log" | tail -1)
  extra=$( (grep -h ' totals: ' "$B/$t.log" || true) | tail -1 | sed 's/.*totals: //')
  echo "fuzz: $t: ${SECS}s, $runs inputs${extra:+, $extra}"
done
