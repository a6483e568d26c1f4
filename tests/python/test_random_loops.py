"""Tests of bench/random_loops.py: seeded, loop-shaped traces the replay reads."""

import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))

from script_runner import stowage_cli  # noqa: E402

import random_loops  # noqa: E402

SCRIPT = os.path.join(HERE, "..", "..", "bench", "random_loops.py")


class RandomLoops(unittest.TestCase):
    def test_a_seed_gives_the_same_trace_and_each_step_frees_what_it_allocated(self):
        lines = random_loops.trace_lines(4, 3)
        self.assertEqual(lines, random_loops.trace_lines(4, 3))
        ids, events = map(int, lines[0].split())
        self.assertEqual(events, len(lines) - 1)
        allocs = [l for l in lines[1:] if l.startswith("a ")]
        frees = [l for l in lines[1:] if l.startswith("f ")]
        self.assertEqual(len(allocs), ids)
        weights = 15  # seed 4 draws 15 weights, never freed (tests/unit/test_vmm.c's loop)
        self.assertEqual(len(allocs) - len(frees), weights)
        self.assertNotEqual(lines, random_loops.trace_lines(5, 3))

    @unittest.skipIf(stowage_cli() is None, "no stowage CLI built")
    def test_the_replay_reads_them(self):
        with tempfile.TemporaryDirectory() as d:
            p = subprocess.run([sys.executable, SCRIPT, d, "--seeds", "3:5", "--steps", "2"],
                               capture_output=True, text=True)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(sorted(os.listdir(d)), ["r3.rep", "r4.rep"])
            for name in ("r3.rep", "r4.rep"):
                r = subprocess.run([stowage_cli(), "replay", "--policy", "vmm", "--json",
                                    os.path.join(d, name)], capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, r.stderr)

    def test_bad_arguments_are_refused(self):
        for args in (["--steps", "0"], ["--seeds", "5:5"], ["--seeds", "x"]):
            p = subprocess.run([sys.executable, SCRIPT, "out"] + args,
                               capture_output=True, text=True)
            self.assertEqual(p.returncode, 2, args)


if __name__ == "__main__":
    unittest.main()
