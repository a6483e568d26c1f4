"""Tests of bench/heldout_table.py (the held-out summary of bench/mixed_heldout.sh and
bench/snapshot_heldout.sh) on replay lines written here."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench",
                      "heldout_table.py")


def line(trace, policy, reserved, minimum, live=1000):
    return json.dumps({"trace": "/x/%s.rep" % trace, "policy": policy, "peak_live_bytes": live,
                       "peak_reserved_bytes": reserved, "min_capacity_bytes": minimum})


def run_table(lines):
    """bench/heldout_table.py on the replay lines, written to a file of their own."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write("\n".join(lines) + "\n")
    try:
        return subprocess.run([sys.executable, SCRIPT, f.name], capture_output=True, text=True)
    finally:
        os.remove(f.name)


class HeldoutTable(unittest.TestCase):
    def test_rows_and_the_goals_missed(self):
        lines = [line("a", "classic", 1050, 1040), line("a", "vmm", 1005, 1002),
                 line("a", "pytorch", 1100, 1030), line("a", "pytorch-expandable", 1010, 1010),
                 line("b", "classic", 1020, 1020), line("b", "vmm", 1011, 1003),
                 line("b", "pytorch", 1100, 1090), line("b", "pytorch-expandable", 1010, 1010)]
        p = run_table(lines)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("| a | 1.0500 / 1.0400 | 1.0050 / 1.0020 | 1.1000 / 1.0300 | "
                      "1.0100 / 1.0100 |", p.stdout)
        self.assertIn("traces: 2", p.stdout)
        self.assertIn("above the pytorch model's: 1: a +1.0%", p.stdout)
        self.assertIn("vmm above 1.01 x live (reserved or minimum): 1: b 1.0110", p.stdout)
        self.assertNotIn("ideal-remap", p.stdout)  # no such lines: no column, no summary

    def test_against_the_ideal_remap_yardstick(self):
        # a: vmm within 1.01; b: vmm above where the yardstick is within; c: both above.
        lines = []
        for name, vmm, ideal in (("a", (1005, 1002), 1004), ("b", (1011, 1003), 1006),
                                 ("c", (1020, 1020), 1030)):
            lines += [line(name, "classic", 1050, 1040), line(name, "vmm", *vmm),
                      line(name, "pytorch", 1100, 1090),
                      line(name, "pytorch-expandable", 1010, 1010),
                      line(name, "ideal-remap", ideal, ideal)]
        p = run_table(lines)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("| 1.0100 / 1.0100 | 1.0040 |", p.stdout)
        self.assertIn("ideal-remap above 1.01 x live: 1: c 1.0300", p.stdout)
        self.assertIn("vmm above 1.01 where ideal-remap is not: 1: b 1.0110 (ideal 1.0060)",
                      p.stdout)
        # minimum / ideal: 1002/1004, 1003/1006, 1020/1030
        self.assertIn("median 0.9970, min 0.9903, max 0.9980; below 1 on 3, above 1.005 on 0",
                      p.stdout)


if __name__ == "__main__":
    unittest.main()
