#!/usr/bin/env bash
# tests/check/all.sh: the reliability checks after the normal ctest run
# (make test): the history check, ASan+UBSan suite, TSan stress, valgrind
# subset, bounded fuzzing.
# Prints one line per check and ends with "N passed, M failed".
cd "$(dirname "$0")/../.."
pass=0; fail=0
for c in history asan tsan valgrind fuzz; do
  start=$(date +%s)
  if bash "tests/check/$c.sh"; then pass=$((pass + 1)); r=ok; else fail=$((fail + 1)); r=FAILED; fi
  echo "check $c: $r ($(( $(date +%s) - start )) s)"
done
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
