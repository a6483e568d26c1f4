#!/bin/sh
# tests/check/report_browser.sh: opens `stowage report` pages in headless
# Chromium and checks that they draw: the page's script stamps
# document.title ("drawn: ...") and body[data-drawn-ms] (script time) and
# body[data-load-ms] (performance.now() at the end of drawing, i.e. from the
# start of navigation) once every chart is drawn; --dump-dom prints the DOM
# after the load event. Prints the times; asserts no time (machines differ).
# Usage: tests/check/report_browser.sh [BUILD_DIR] [TRACE...]
# Needs chromium (Debian: apt-get install -y chromium); exits 77 (skip) without.
set -eu
build=${1:-build}
[ $# -gt 0 ] && shift
chrome=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$chrome" ]; then
    echo "report_browser: chromium not installed, skipped" >&2
    exit 77
fi
src=$(cd "$(dirname "$0")/../.." && pwd)
if [ $# -eq 0 ]; then
    set -- "$src/tests/data/report_leak.rep"
    [ -f "$src/../shared/traces/gpt2_generate.rep" ] && set -- "$@" "$src/../shared/traces/gpt2_generate.rep"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
for trace in "$@"; do
    name=$(basename "$trace" .rep)
    "$build/stowage" report "$trace" -o "$tmp/$name.html"
    timeout 120 "$chrome" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
        --disable-background-networking --disable-component-update --disable-sync \
        --user-data-dir="$tmp/profile" --dump-dom "file://$tmp/$name.html" \
        >"$tmp/$name.dom" 2>/dev/null || true
    if grep -q '<title>drawn: ' "$tmp/$name.dom" && grep -q 'data-drawn-ms=' "$tmp/$name.dom"; then
        times=$(grep -o 'data-drawn-ms="[0-9.]*" data-load-ms="[0-9.]*"' "$tmp/$name.dom")
        echo "report_browser: $name drawn ($times; $(wc -c <"$tmp/$name.html") bytes)"
    else
        echo "report_browser: $name NOT drawn" >&2
        status=1
    fi
done
exit $status
