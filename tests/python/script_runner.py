"""Runs a project script on an input file in a fresh directory (shared by the script tests)."""

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
