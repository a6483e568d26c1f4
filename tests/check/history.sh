#!/usr/bin/env bash
# tests/check/history.sh: the project's text says what the project is now, not
# how it got there (docs/reliability.md, history check). Fails, listing each
# FILE:LINE, when docs, headers, sources, Python, benchmarks or tests name a
# work session, a date, a commit id, an issue number, a finding label such as
# R7, or narrate what used to be. History lives in git log.
#
# Scanned: README.md, docs/, include/, every source folder, python/, bench/,
# tests/, CMakeLists.txt and Makefile. Not scanned: raw data (fuzz corpora,
# traces, CSV inputs, the GPU run logs under bench/gpu/results/ except each
# dated folder's README.md, the pinned hashes of bench/snapshots.txt) and this
# script, which spells the patterns.
# Usage: bash tests/check/history.sh [ROOT]   (exit 0 clean, 1 findings)
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root" || exit 2

# Perl regular expressions; each line is one rule, all case-insensitive but
# the last two (commit ids are lower-case hex, finding labels upper-case R).
rules_ci=(
    '\bsessions?\b'
    '\b(used to|no longer|until then|previously|formerly)\b'
    '\b(twenty|thirty|forty|fifty|sixty)-(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth)\b'
    '\b(before|after|since|until) (this|that|the) (change|commit|fix|rewrite)\b'
    '\bissues? #?[0-9]+\b'
    '(?<!results/)(?<![\w-])20[0-9]{2}-[01][0-9]-[0-3][0-9]\b'
)
rules_cs=(
    '(?<![\w./#-])(?=[0-9a-f]{7,12}\b)(?=[0-9a-f]*[a-f])(?=[0-9a-f]*([0-9])[0-9a-f]*(?!\1)[0-9])[0-9a-f]{7,12}\b'
    '\bR[0-9]{1,2}\b'
)

dirs=(README.md docs include allocator accounting trace planner replay report importers cli
      python bench tests CMakeLists.txt Makefile)
files=()
while IFS= read -r -d '' f; do
    case "$f" in
        tests/check/history.sh) continue ;;
        tests/fuzz/corpus/*) continue ;;
        bench/snapshots.txt) continue ;;
        bench/gpu/results/*/*/*) continue ;;      # run logs and results: raw data
        *.rep | *.csv | *.gz | *.pickle | *.png | *.svg | *.json | *.jsonl) continue ;;
        */__pycache__/*) continue ;;
    esac
    files+=("$f")
done < <(find "${dirs[@]}" -type f -print0 2>/dev/null)

found=0
scan() {
    local flags=$1 rule=$2
    local out
    out=$(grep -I -n -H -P $flags -- "$rule" "${files[@]}" 2>/dev/null)
    if [ -n "$out" ]; then
        printf '%s\n' "$out" | sed "s|^|history: |"
        found=1
    fi
}
for r in "${rules_ci[@]}"; do scan -i "$r"; done
for r in "${rules_cs[@]}"; do scan '' "$r"; done

if [ "$found" = 1 ]; then
    echo "history check: FAILED (${#files[@]} files scanned; rules: tests/check/history.sh)"
    exit 1
fi
echo "history check: ok (${#files[@]} files scanned)"
