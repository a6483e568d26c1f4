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
# Every byte checked (tests/stress/stress_integrity.c): both pools, queued device
# work run by whichever thread completes a stream, scrubs, a learned step.
"$B"/stress_integrity --ops 1000 --capacity-mib 128 --max-mib 24 --seed 1 policy:classic
"$B"/stress_integrity --ops 1000 --capacity-mib 128 --max-mib 24 --seed 2 \
  reuse_other_streams_on_miss:true
"$B"/stress_integrity --ops 1000 --capacity-mib 128 --max-mib 24 --seed 3 --min-remaps 1 policy:vmm
"$B"/stress_integrity --ops 400 --capacity-mib 128 --max-mib 24 --seed 4 \
  policy:vmm,scrub_on_free:true
"$B"/stress_integrity --ops 100 --loop-steps 50 --min-plans 1 --seed 8 \
  policy:vmm,vmm_learn_step:true
echo "tsan: no ThreadSanitizer report"
