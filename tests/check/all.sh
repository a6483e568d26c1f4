#!/usr/bin/env bash
# tests/check/all.sh: the reliability checks after the normal ctest run
# (make test): the history check, ASan+UBSan suite, TSan stress, valgrind
# subset, bounded fuzzing.
# Prints one line per check and ends with "checks: N passed, M failed". With
# STOW_TEST_RESULTS set (make test), writes each check's result to
# $STOW_TEST_RESULTS/checks.txt ("NAME ok|FAILED SECONDS"), where
# tests/check/summary.py counts each check as one test.
cd "$(dirname "$0")/../.."
pass=0; fail=0
for c in history asan tsan valgrind fuzz; do
  start=$(date +%s)
  if bash "tests/check/$c.sh"; then pass=$((pass + 1)); r=ok; else fail=$((fail + 1)); r=FAILED; fi
  secs=$(( $(date +%s) - start ))
  echo "check $c: $r ($secs s)"
  [ -z "${STOW_TEST_RESULTS:-}" ] || echo "$c $r $secs" >>"$STOW_TEST_RESULTS/checks.txt"
done
echo "checks: $pass passed, $fail failed"
[ "$fail" = 0 ]
