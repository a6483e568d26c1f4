"""python -m stowage: the Stowage command-line tool.

    python -m stowage replay|report|plan|peak|diff ARGS...
    python -m stowage import rmm IN.csv -o OUT.rep
    python -m stowage import pytorch IN.pickle -o OUT.rep [--device N]
    python -m stowage predict [--gpu H100] [--json] [-o TRACE] SCRIPT [ARGS...]
    python -m stowage version

Every command but `import pytorch` and `predict` is the C program `stowage`,
built with the library and run in this process's place (its exit status is the
command's). `import pytorch` reads a PyTorch memory snapshot (a pickle) in
Python (stowage/snapshot_import.py); `predict` runs a PyTorch script on an
emulated GPU and predicts its memory (stowage/predict.py). `pip install
./python` also puts a `stowage` command on PATH that does the same.

The program is looked for, in order: stowage/bin/stowage in this package (the
wheel carries the one built with its library, so the two always match);
build/stowage of the checkout this package belongs to; a `stowage` executable
on PATH (an ELF file: the console script of this package is skipped).
"""

import os
import shutil
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_SNAPSHOT_FORMATS = ("pytorch", "snapshot")


def _is_elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def cli_path():
    """Path of the stowage program this package runs, or None."""
    bundled = os.path.join(_HERE, "bin", "stowage")
    checkout = os.path.normpath(os.path.join(_HERE, "..", ".."))
    candidates = [bundled]
    if os.path.isfile(os.path.join(checkout, "CMakeLists.txt")):
        candidates.append(os.path.join(checkout, "build", "stowage"))
    on_path = shutil.which("stowage")
    if on_path:
        candidates.append(on_path)
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK) and _is_elf(c):
            return c
    return None


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) >= 2 and argv[0] == "import" and argv[1] in _SNAPSHOT_FORMATS:
        from . import snapshot_import
        return snapshot_import.main(argv[2:])
    if argv[:1] == ["predict"]:
        from . import predict
        return predict.main(argv[1:])
    path = cli_path()
    if path is None:
        if argv[:1] in (["version"], ["--version"]):
            from . import version
            print("stowage %d.%d.%d" % version())
            return 0
        print("python -m stowage: the stowage program was not found (this package was built "
              "without it, e.g. without jemalloc: install libjemalloc-dev and reinstall, or "
              "build it in the checkout: make build)", file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(path, [path] + argv)
    return 2  # not reached


if __name__ == "__main__":
    sys.exit(main())
