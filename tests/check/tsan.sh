#!/usr/bin/env bash
# tests/check/tsan.sh: the stress programs (tests/stress/*.c) built with
# ThreadSanitizer and run; any report fails (TSan exits 66). Criterion tests
# cannot run under TSan (toolchain.md section 5), so only the library and the
# stress programs are built.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${TSAN_BUILD:-build-tsan}
JOBS=${JOBS:-2}
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTOW_TSAN=ON -DSTOW_BUILD_TESTS=OFF \
      -DSTOW_DEBUG=1 >/dev/null
targets=$(cd tests/stress && ls *.c | sed 's/\.c$//')
cmake --build "$B" -j"$JOBS" --target $targets >/dev/null
export TSAN_OPTIONS="halt_on_error=1 exitcode=66"
"$B"/stress_threads 4 100000 1
"$B"/stress_threads 8 30000 2
"$B"/stress_threads 4 50000 3 vmm
"$B"/lock_exclusion 8 50000
echo "tsan: no ThreadSanitizer report"
