#!/usr/bin/env bash
# tests/check/tsan.sh: the stress programs (tests/stress/*.c) built with
# ThreadSanitizer and run; any report fails (TSan exits 66). Criterion tests
# cannot run under TSan (toolchain.md section 5), so only the library and the
# stress programs are built (and the emulated CUDA driver they can run on).
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${TSAN_BUILD:-build-tsan}
JOBS=${JOBS:-2}
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTOW_TSAN=ON -DSTOW_BUILD_TESTS=OFF \
      -DSTOW_DEBUG=1 >/dev/null
targets=$(cd tests/stress && ls *.c | sed 's/\.c$//')
cmake --build "$B" -j"$JOBS" --target $targets fake_cuda >/dev/null
export TSAN_OPTIONS="halt_on_error=1 exitcode=66"
"$B"/stress_threads 4 100000 1
"$B"/stress_threads 8 30000 2
"$B"/stress_threads 4 50000 3 vmm
# The CUDA backend's own locking (event pool, per-thread context) on the
# emulated driver (tests/support/fake_cuda.c, built with TSan too).
LD_LIBRARY_PATH="$B/fake_cuda" "$B"/stress_threads 4 20000 4 classic cuda
LD_LIBRARY_PATH="$B/fake_cuda" "$B"/stress_threads 4 20000 5 vmm cuda
"$B"/lock_exclusion 8 50000
echo "tsan: no ThreadSanitizer report"
