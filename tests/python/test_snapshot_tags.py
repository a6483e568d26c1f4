"""Tests of bench/snapshot_tags.py on snapshot-shaped pickles built here (stacks of both shapes
from test_stack_tags), with the stowage CLI of the build."""

import os
import pickle
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from script_runner import stowage_cli  # noqa: E402
from test_stack_tags import ALLOCATOR, ENGINE, INTERPRETER, MODEL  # noqa: E402

SCRIPT = os.path.join(HERE, "..", "..", "bench", "snapshot_tags.py")
MiB = 1 << 20


def alloc(addr, size, frames):
    return {"action": "alloc", "addr": addr, "size": size, "stream": 0, "frames": frames,
            "time_us": 0}


def free(addr, size):
    return {"action": "free_completed", "addr": addr, "size": size, "stream": 0, "frames": [],
            "time_us": 0}


TRAIN = list(MODEL)
TRAIN[2] = dict(MODEL[2], line=61)  # another line of model.py


class SnapshotTags(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cli = stowage_cli()

    def run_on(self, snapshots, *extra):
        if not self.cli:
            self.skipTest("the stowage CLI is not built")
        with tempfile.TemporaryDirectory() as d:
            for name, snap in snapshots.items():
                with open(os.path.join(d, name), "wb") as f:
                    f.write(snap if isinstance(snap, bytes) else pickle.dumps(snap))
            p = subprocess.run([sys.executable, SCRIPT, d, "--stowage", self.cli] + list(extra),
                               capture_output=True, text=True)
        rows = {line.split(" | ")[0][2:]: line.split(" | ")
                for line in p.stdout.splitlines() if line.startswith("| ") and ".pickle" in line}
        return p, rows

    def test_user_lines_at_the_peak_pass(self):
        # C++ frames first and Python-only stacks; the peak (event 2, 7 MiB) is not the end.
        snap = {"device_traces": [[
            alloc(0x1000, 3 * MiB, ALLOCATOR + INTERPRETER + MODEL),
            alloc(0x9000000, 2 * MiB, TRAIN),
            alloc(0xa000000, 2 * MiB, ALLOCATOR + ENGINE),
            free(0x9000000, 2 * MiB),
            alloc(0xb000000, 1 * MiB, MODEL)]]}
        p, rows = self.run_on({"a.pickle": snap, "empty.pickle": {"device_traces": [[]]}})
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        row = rows["a.pickle"]
        self.assertEqual(row[1:3], ["4", str(7 * MiB)])
        tops = row[3].split("<br>")
        self.assertEqual(tops[0], "0.429 model.py:54 forward (user)")
        self.assertEqual(tops[1], "0.286 model.py:61 forward (user)")
        self.assertTrue(tops[2].startswith("0.286 ??:0 torch::autograd::generated::BmmBackward0"))
        self.assertEqual(row[4:7], ["0.000", "user", "2 of 3 |"])
        self.assertEqual(rows["empty.pickle"][1:3], ["0", "0"])

    def test_a_tag_that_is_not_user_code_over_half_the_peak_fails(self):
        snap = {"device_traces": [[
            alloc(0x1000, 1 * MiB, MODEL),
            alloc(0x9000000, 3 * MiB, ALLOCATOR + ENGINE),
            alloc(0xa000000, 1 * MiB, [])]]}
        p, rows = self.run_on({"b.pickle": snap}, "--frames")
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        row = rows["b.pickle"]
        self.assertTrue(row[3].startswith("! 0.600 ??:0 torch::autograd::generated::BmmBack"), row)
        self.assertEqual(row[4:6], ["0.200", "backward"])
        self.assertIn("(no Python frame in its %d frames)" % len(ALLOCATOR + ENGINE), p.stdout)

    def test_one_user_line_over_half_is_flagged_with_its_frames(self):
        snap = {"device_traces": [[alloc(0x1000, 3 * MiB, ALLOCATOR + MODEL),
                                   alloc(0x9000000, 1 * MiB, TRAIN)]]}
        p, rows = self.run_on({"c.pickle": snap}, "--frames")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertTrue(rows["c.pickle"][3].startswith("! 0.750 model.py:54 forward (user)"))
        self.assertIn("holds 0.750 of the peak: 1 allocations, largest %d bytes" % (3 * MiB),
                      p.stdout)
        self.assertIn("    user    /home/u/proj/model.py:54 forward", p.stdout)

    def test_a_file_that_is_not_a_snapshot(self):
        p, _ = self.run_on({"bad.pickle": b"not a pickle"})
        self.assertEqual(p.returncode, 2)
        self.assertIn("bad.pickle: importer exited 2: ", p.stderr)


if __name__ == "__main__":
    unittest.main()
