#!/usr/bin/env bash
# python/make_venv.sh VENV REQUIREMENTS: the virtual environment of the
# recorder, its tests and the model corpus (make deps). It is made once and
# reused: the pinned torch is a CUDA build of a few GB. A stamp inside VENV
# holds the requirements file's hash, so a changed pin reinstalls and an
# unchanged one costs nothing.
#
# Without the network (or PyPI) the environment is not made: this prints why
# and exits 0, and the tests that need torch skip and say so. Exit 1 only on
# bad arguments.
set -uo pipefail
venv=${1:?usage: make_venv.sh VENV REQUIREMENTS}
req=${2:?usage: make_venv.sh VENV REQUIREMENTS}
[ -f "$req" ] || { echo "make_venv.sh: $req: no such file" >&2; exit 1; }

want=$(sha256sum "$req" | cut -d' ' -f1)
stamp="$venv/.stowage-requirements"
if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    exit 0
fi

echo "Python packages: installing $req into $venv (torch is a download of a few GB)"
py=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
    mkdir -p "$(dirname "$venv")"
    if ! "$py" -m venv "$venv"; then
        echo "Python packages not installed: '$py -m venv' failed; tests that need torch skip" >&2
        exit 0
    fi
fi
if "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"; then
    echo "$want" >"$stamp"
else
    echo "Python packages not installed (is PyPI reachable?): tests that need torch skip" >&2
fi
exit 0
