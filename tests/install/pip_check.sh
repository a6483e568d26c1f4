#!/usr/bin/env bash
# tests/install/pip_check.sh: the Python package as a user installs it. In a
# fresh `python3 -m venv` (only pip and setuptools in it, no network):
#   pip install --no-build-isolation --no-index ./python
# which builds libstowage.so and the stowage tool with CMake and bundles both.
# Then, from another directory and with no STOWAGE_* variable:
#   - `python -c "import stowage; print(stowage.library_path())"` names the
#     bundled library, and importing stowage.torch does not import torch;
#   - `python -m stowage replay TRACE` and the `stowage` console script replay;
#   - `python -m stowage import pytorch SNAPSHOT -o OUT.rep` converts a snapshot
#     that `replay` then reads;
#   - the bundled library passes tests/check_no_cuda_link.sh, the metadata names
#     the MIT license, and `pip uninstall` leaves no file behind.
# ctest: pip_install (about 40 s; the build inside is most of it).
# Usage: tests/install/pip_check.sh [PYTHON]   (default python3)
set -euo pipefail
py=${1:-python3}
src=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
die() { echo "pip: $*" >&2; exit 1; }
unset STOWAGE_LIB STOWAGE_CONF STOWAGE_BACKEND PYTHONPATH PIP_REQUIRE_VIRTUALENV || true

"$py" -m venv "$tmp/venv" || die "python3 -m venv failed"
venv_py="$tmp/venv/bin/python"
echo "pip: fresh venv: $("$venv_py" -m pip list --disable-pip-version-check 2>/dev/null | tail -n +3 | tr -s ' ' | paste -sd, -)"
# LTO off: this checks the packaging, and the build is most of the test's time.
(cd "$src" && "$venv_py" -m pip install --no-build-isolation --no-index --disable-pip-version-check \
    -C cmake-args=-DSTOW_LTO=OFF ./python) >"$tmp/pip.log" 2>&1 || { cat "$tmp/pip.log"; die "pip install failed"; }
site=$("$venv_py" -c "import sysconfig; print(sysconfig.get_paths()['platlib'])")

mkdir "$tmp/elsewhere"
cd "$tmp/elsewhere"
lib=$("$venv_py" -c "import stowage; print(stowage.library_path())")
[ "$lib" = "$site/stowage/libstowage.so" ] || die "library_path() is $lib, not the bundled $site/stowage/libstowage.so"
"$venv_py" -c "import sys, stowage.torch; assert 'torch' not in sys.modules; print(stowage.version())" \
    >/dev/null || die "import stowage.torch failed or imported torch"
echo "pip: import stowage from $PWD: $lib"

trace="$src/tests/data/report_steady.rep"
out=$("$venv_py" -m stowage replay "$trace") || die "python -m stowage replay failed"
grep -q "peak reserved bytes" <<<"$out" || die "python -m stowage replay printed: $out"
# (Outputs are captured before grep reads them: with pipefail, grep -q leaving early
# would fail the writer with SIGPIPE.)
out_vmm=$("$tmp/venv/bin/stowage" replay --policy vmm "$trace") || die "the stowage console script failed"
grep -q "peak reserved bytes" <<<"$out_vmm" || die "the stowage console script did not replay"
version=$(sed -n 's/^project(stowage VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
[ "$("$venv_py" -m stowage version)" = "stowage $version" ] || die "python -m stowage version"
echo "pip: python -m stowage replay ok ($(grep -m1 'peak reserved bytes' <<<"$out" | tr -s ' '))"

# A two-event PyTorch snapshot (the structure torch.cuda.memory._snapshot() returns).
"$venv_py" - <<'PY'
import pickle
entries = [{"action": "alloc", "addr": 1 << 30, "size": 4 << 20, "stream": 0, "frames": []},
           {"action": "free_requested", "addr": 1 << 30, "size": 4 << 20, "stream": 0, "frames": []},
           {"action": "free_completed", "addr": 1 << 30, "size": 4 << 20, "stream": 0, "frames": []}]
with open("snap.pickle", "wb") as f:
    pickle.dump({"segments": [], "device_traces": [entries]}, f)
PY
"$venv_py" -m stowage import pytorch snap.pickle -o snap.rep 2>/dev/null || die "import pytorch failed"
[ "$(head -1 snap.rep)" = "1 2" ] || die "imported trace: $(head -1 snap.rep)"
out_snap=$("$venv_py" -m stowage replay snap.rep) || die "replay of the imported snapshot failed"
grep -q "peak live bytes *4194304" <<<"$out_snap" || die "replay of the imported snapshot: $out_snap"
echo "pip: python -m stowage import pytorch ok"

bash "$src/tests/check_no_cuda_link.sh" "$lib" >/dev/null || die "the bundled library fails check_no_cuda_link"
meta=$("$venv_py" -m pip show stowage 2>/dev/null) || die "pip show stowage failed"
grep -q "^License: MIT" <<<"$meta" || die "no MIT license in the metadata: $meta"
"$venv_py" -m pip uninstall -y stowage >/dev/null 2>&1 || die "pip uninstall failed"
left=$(find "$site" -path "*stowage*" ! -path "*__pycache__*" | head -5)
[ -z "$left" ] || die "pip uninstall left: $left"
echo "pip: bundled library links no CUDA; License: MIT; uninstall leaves nothing"
