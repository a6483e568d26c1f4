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


class HeldoutTable(unittest.TestCase):
    def test_rows_and_the_goals_missed(self):
        lines = [line("a", "classic", 1050, 1040), line("a", "vmm", 1005, 1002),
                 line("a", "pytorch", 1100, 1030), line("a", "pytorch-expandable", 1010, 1010),
                 line("b", "classic", 1020, 1020), line("b", "vmm", 1011, 1003),
                 line("b", "pytorch", 1100, 1090), line("b", "pytorch-expandable", 1010, 1010)]
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write("\n".join(lines) + "\n")
        try:
            p = subprocess.run([sys.executable, SCRIPT, f.name], capture_output=True, text=True)
        finally:
            os.remove(f.name)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("| a | 1.0500 / 1.0400 | 1.0050 / 1.0020 | 1.1000 / 1.0300 | "
                      "1.0100 / 1.0100 |", p.stdout)
        self.assertIn("traces: 2", p.stdout)
        self.assertIn("above the pytorch model's: 1: a +1.0%", p.stdout)
        self.assertIn("vmm above 1.01 x live (reserved or minimum): 1: b 1.0110", p.stdout)


if __name__ == "__main__":
    unittest.main()
