#!/usr/bin/env bash
# tests/check/history.sh: the project's text says what the project is now, not
# how it got there (docs/reliability.md, history check). Fails, listing each
# FILE:LINE, when docs, headers, sources, Python, benchmarks or tests name a
# round of work, a date, a commit id, an issue number, a finding label such as
# R7, or narrate the past (the patterns: docs/reliability.md). History lives in
# git log.
#
# Scanned: README.md, docs/, include/, every source folder, python/, bench/,
# tests/, CMakeLists.txt and Makefile. Not scanned: raw data (fuzz corpora,
# traces, CSV and JSON files, the GPU run logs under bench/gpu/results/ except
# each dated folder's README.md, the pinned hashes of bench/snapshots.txt) and
# this script. Lines between "<!-- history patterns -->" and
# "<!-- /history patterns -->" are skipped: docs/reliability.md spells the
# patterns there.
# Usage: bash tests/check/history.sh [ROOT]   (exit 0 clean, 1 findings)
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root" || exit 2

dirs=(README.md docs include allocator accounting trace planner replay report importers cli
      python bench tests CMakeLists.txt Makefile)
files=()
while IFS= read -r -d '' f; do
    case "$f" in
        tests/check/history.sh) continue ;;
        tests/fuzz/corpus/*) continue ;;
        bench/snapshots.txt) continue ;;
        bench/gpu/results/*/*/*) continue ;;      # run logs and results: raw data
        *.rep | *.csv | *.gz | *.pickle | *.png | *.svg | *.json | *.jsonl | *.tags) continue ;;
        */__pycache__/*) continue ;;
    esac
    files+=("$f")
done < <(find "${dirs[@]}" -type f -print0 2>/dev/null)

perl -e '
    # Case-insensitive rules, then case-sensitive ones (commit ids are
    # lower-case hex with a letter and two distinct digits; labels are R<n>).
    my @ci = (
        qr/\bsessions?\b/i,
        qr/\b(used to|no longer|until then|previously|formerly)\b/i,
        qr/\b(twenty|thirty|forty|fifty|sixty)-(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth)\b/i,
        qr/\b(before|after|since|until) (this|that|the) (change|commit|fix|rewrite)\b/i,
        qr/\bissues? #?[0-9]+\b/i,
        qr/(?<!results\/)(?<![\w-])20[0-9]{2}-[01][0-9]-[0-3][0-9]\b/,
    );
    my @cs = (
        qr/(?<![\w.\/#-])(?=[0-9a-f]{7,12}\b)(?=[0-9a-f]*[a-f])(?=[0-9a-f]*([0-9])[0-9a-f]*(?!\1)[0-9])[0-9a-f]{7,12}\b/,
        qr/\bR[0-9]{1,2}\b/,
    );
    my $found = 0;
    for my $f (@ARGV) {
        open(my $fh, "<", $f) or next;
        next if -B $f;
        my $skip = 0;
        my $prev = "";
        while (my $line = <$fh>) {
            # An issue number may follow "issue" on the next line of a comment.
            my $next_text = $line;
            $next_text =~ s/^\s*(\*|#|\/\/|-)?\s*//;
            if (!$skip && $prev =~ /\bissues?\s*$/i && $next_text =~ /^#?[0-9]+\b/) {
                print "history: $f:$.: $line";
                $found = 1;
            }
            $prev = $line;
            if ($line =~ /<!-- history patterns -->/) { $skip = 1; next; }
            if ($line =~ /<!-- \/history patterns -->/) { $skip = 0; next; }
            next if $skip;
            for my $re (@ci, @cs) {
                if ($line =~ $re) {
                    print "history: $f:$.: $line";
                    $found = 1;
                    last;
                }
            }
        }
        close $fh;
    }
    exit $found;
' "${files[@]}"
status=$?
if [ "$status" != 0 ]; then
    echo "history check: FAILED (${#files[@]} files scanned; rules: tests/check/history.sh)"
    exit 1
fi
echo "history check: ok (${#files[@]} files scanned)"
