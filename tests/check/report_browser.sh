#!/bin/sh
# tests/check/report_browser.sh: opens `stowage report` pages in headless
# Chromium and checks that their charts draw, two ways:
#   - the DOM after the load event (--dump-dom): the page's script stamps
#     document.title ("drawn: ...") and body[data-drawn-ms] (script time) and
#     body[data-load-ms] (performance.now() at the end of drawing) once every
#     chart is drawn;
#   - a screenshot (BUILD/report_browser/NAME.png, kept), whose pixels
#     tests/check/report_charts.py reads: the memory and lifetime charts in
#     colour, and the stranded-memory curve when the page has one.
# A control runs first: the same page without its drawing script must fail
# both checks, so that neither can pass on a blank page. Prints the times;
# asserts no time (machines differ). ctest runs it (report_browser) in make
# test, where `make deps` has installed Debian's chromium: a missing browser is
# an error, not a skip.
# Usage: tests/check/report_browser.sh [BUILD_DIR] [TRACE...]
set -eu
build=${1:-build}
[ $# -gt 0 ] && shift
chrome=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$chrome" ]; then
    echo "report_browser: no chromium (make deps installs Debian's chromium)" >&2
    exit 1
fi
src=$(cd "$(dirname "$0")/../.." && pwd)
if [ $# -eq 0 ]; then
    set -- "$src/tests/data/report_leak.rep"
    [ -f "$src/../shared/traces/gpt2_generate.rep" ] && set -- "$@" "$src/../shared/traces/gpt2_generate.rep"
fi
shots="$build/report_browser"
mkdir -p "$shots"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The flags that make headless Chromium work on a closed network, as root.
browse() { # browse PROFILE ARGS...
    profile=$1
    shift
    timeout 120 "$chrome" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
        --disable-background-networking --disable-component-update --disable-sync \
        --hide-scrollbars --user-data-dir="$tmp/$profile" "$@" 2>/dev/null
}

check_page() { # check_page PAGE_NAME HTML: 0 when both checks pass (sh: no locals, so cp_*)
    cp_name=$1
    cp_html=$2
    browse "p-$cp_name-dom" --dump-dom "file://$cp_html" >"$tmp/$cp_name.dom" || true
    rm -f "$shots/$cp_name.png"
    browse "p-$cp_name-shot" --window-size=1400,1600 --screenshot="$shots/$cp_name.png" \
        "file://$cp_html" >/dev/null || true
    cp_dom=no
    if grep -q '<title>drawn: ' "$tmp/$cp_name.dom" && grep -q 'data-drawn-ms=' "$tmp/$cp_name.dom"; then
        cp_dom=yes
    fi
    if [ ! -s "$shots/$cp_name.png" ]; then
        echo "report_browser: $cp_name: no screenshot" >&2
        return 1
    fi
    cp_pixels=yes
    python3 "$src/tests/check/report_charts.py" "$cp_html" "$shots/$cp_name.png" || cp_pixels=no
    [ $cp_dom = yes ] && [ $cp_pixels = yes ] && return 0
    echo "report_browser: $cp_name: DOM stamped: $cp_dom, charts in the screenshot: $cp_pixels" >&2
    return 1
}

status=0
first=1
for trace in "$@"; do
    name=$(basename "$trace" .rep)
    "$build/stowage" report "$trace" -o "$tmp/$name.html"
    if [ $first = 1 ]; then
        first=0
        # The control: the page less its drawing script (the last <script> element).
        python3 - "$tmp/$name.html" "$tmp/control.html" <<'PY'
import re, sys
page = open(sys.argv[1], encoding="utf-8").read()
stripped = re.sub(r"<script>.*?</script>\s*</body>", "</body>", page, flags=re.S)
assert stripped != page, "the page has no drawing script to strip"
open(sys.argv[2], "w", encoding="utf-8").write(stripped)
PY
        if check_page control "$tmp/control.html" >/dev/null 2>&1; then
            echo "report_browser: the control page without its script passed the checks" >&2
            status=1
        else
            echo "report_browser: control (no drawing script) not drawn, as it must be"
        fi
    fi
    if check_page "$name" "$tmp/$name.html"; then
        times=$(grep -o 'data-drawn-ms="[0-9.]*" data-load-ms="[0-9.]*"' "$tmp/$name.dom")
        echo "report_browser: $name drawn ($times; $(wc -c <"$tmp/$name.html") bytes; $shots/$name.png)"
    else
        echo "report_browser: $name NOT drawn" >&2
        status=1
    fi
done
exit $status
