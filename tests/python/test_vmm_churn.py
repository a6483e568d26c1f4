"""Tests of bench/vmm_churn's --parts output on the bundled trace: the first replay's
slices add up to that replay's totals, for the page-mapped pool's map and unmap calls and for
the classic pool's backend calls (segment reserves and releases)."""

import os
import re
import subprocess
import unittest

from script_runner import build_program

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TRACE = os.path.join(ROOT, "bench", "traces", "resnet50_train.rep")


@unittest.skipUnless(build_program("vmm_churn"), "build/vmm_churn is not built")
class VmmChurnParts(unittest.TestCase):
    def test_the_slices_add_up_to_the_first_replay(self):
        p = subprocess.run([build_program("vmm_churn"), "--replays", "2", "--parts", "4", TRACE],
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = {}
        for line in p.stdout.splitlines():
            key, _, values = line.partition(":")
            lines[key.split(None, 1)[1].strip()] = values.split()
        classic_by_replay = [int(x) for x in lines["classic backend calls by replay"][:2]]
        classic_parts = [int(x) for x in
                         lines["first replay, classic backend calls by 1/4 of its events"]]
        vmm_rate = float(lines["map+unmap / 1000 events by replay"][0])
        vmm_parts = [int(x) for x in lines["first replay, map+unmap by 1/4 of its events"]]
        self.assertEqual(len(classic_parts), 4)
        self.assertEqual(sum(classic_parts), classic_by_replay[0])
        self.assertGreater(classic_parts[0], 0)  # a fresh pool reserves its segments first
        with open(TRACE) as f:
            events = int(f.readline().split()[1])
        # The rate is printed to 0.1 per 1000 events.
        self.assertLessEqual(abs(sum(vmm_parts) - vmm_rate * events / 1000),
                             0.05 * events / 1000 + 1)
        self.assertTrue(re.search(r"vmm reserved/live 1\.00", p.stdout), p.stdout)


if __name__ == "__main__":
    unittest.main()
