"""Runs a project script on an input file in a fresh directory, and finds the stowage CLI
(shared by the script tests)."""

import os
import subprocess
import sys
import tempfile


def run_on_file(script, name, data, argv, read):
    """Writes data (str or bytes) to NAME in a fresh directory d, runs
    `python3 SCRIPT *argv(d, path)` there, and returns (the completed process,
    read(d)), read before the directory goes."""
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, name)
        with open(src, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        p = subprocess.run([sys.executable, script] + argv(d, src), capture_output=True, text=True)
        return p, read(d)


def build_program(name):
    """build/NAME beside STOWAGE_LIB (set by ctest), else in the repository's build/; None if
    neither is built."""
    lib = os.environ.get("STOWAGE_LIB")
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    candidates = [os.path.join(os.path.dirname(lib), name)] if lib else []
    candidates.append(os.path.join(root, "build", name))
    return next((c for c in candidates if os.access(c, os.X_OK)), None)


def stowage_cli():
    """The stowage CLI (build_program)."""
    return build_program("stowage")
