"""A smoke test of bench/vmm_long_run.sh (it parses build/vmm_churn's output, which broke once
when vmm_churn printed a second "first replay" line): the bundled trace under the five shared
traces' names, one scaled variant, 3 more steps; one table row per long run and one summary
line per model."""

import os
import re
import shutil
import subprocess
import tempfile
import unittest

from script_runner import build_program

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(ROOT, "bench", "vmm_long_run.sh")
TRACE = os.path.join(ROOT, "bench", "traces", "resnet50_train.rep")
NAMES = ("gpt2_train", "resnet50_train", "resnet_multiscale_train", "vit_train", "gpt2_generate")


@unittest.skipUnless(build_program("vmm_churn") and
                     os.path.realpath(os.path.dirname(build_program("vmm_churn"))) ==
                     os.path.realpath(os.path.join(ROOT, "build")),
                     "the script runs build/vmm_churn of the repository")
class VmmLongRun(unittest.TestCase):
    def run_script(self, **settings):
        """The script on the bundled trace under the five shared names, 3 steps, x1.05."""
        with tempfile.TemporaryDirectory() as d:
            for name in NAMES:
                os.symlink(os.path.abspath(TRACE), os.path.join(d, name + ".rep"))
            env = dict(os.environ, STOW_TRACES_DIR=d, STEPS="3", FACTORS="1.05", **settings)
            return subprocess.run(["bash", SCRIPT], capture_output=True, text=True, env=env)

    def test_a_row_per_long_run_and_a_summary_per_model(self):
        p = self.run_script()
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = [l for l in p.stdout.splitlines() if l.startswith("| ") and "long run" not in l]
        # resnet50_train repeats its step: each name and its x1.05 variant make a long run.
        self.assertEqual(len(rows), 2 * len(NAMES), p.stdout)
        for row in rows:
            cells = [c.strip() for c in row.strip("|").split("|")]
            self.assertEqual(len(cells), 6, row)
            self.assertGreater(float(cells[5]), 0.0, row)  # host time vs classic
        for name in NAMES:
            self.assertTrue(re.search(r"^%s: 2 long runs; .*host time vs classic: median [0-9.]+"
                                      % name, p.stdout, re.M), p.stdout)

    def test_bad_settings_are_refused_before_any_work(self):
        for key, value in (("REPLAYS", "2"), ("REPLAYS", "65"), ("REPLAYS", "x"),
                           ("INSTRUCTIONS", "yes")):
            p = self.run_script(**{key: value})
            self.assertEqual(p.returncode, 2, (key, value, p.stdout))
            self.assertIn("%s=%s" % (key, value), p.stderr)
            self.assertNotIn("long run", p.stdout)

    @unittest.skipUnless(shutil.which("valgrind"), "INSTRUCTIONS=1 counts under callgrind")
    def test_instructions_add_a_column_and_a_summary(self):
        p = self.run_script(INSTRUCTIONS="1", REPLAYS="3")
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = [l for l in p.stdout.splitlines() if l.startswith("| ") and "long run" not in l]
        self.assertEqual(len(rows), 2 * len(NAMES), p.stdout)
        counts = {}
        for row in rows:
            cells = [c.strip() for c in row.strip("|").split("|")]
            self.assertEqual(len(cells), 7, row)
            # vmm does more per event than classic (granule bitmaps), and not ten times more.
            self.assertTrue(1.0 < float(cells[6]) < 10.0, row)
            counts.setdefault(cells[0].endswith("_x1.05"), []).append(float(cells[6]))
        # The same trace under five names counts the same, to the last printed digit (a
        # count moves by a few tens of instructions with the timed figure's sorting and
        # printing: tests/python/test_warm_instructions.py).
        for same in counts.values():
            self.assertEqual(len(same), len(NAMES), p.stdout)
            self.assertLessEqual(max(same) - min(same), 0.001 * 1.001, p.stdout)
        for name in NAMES:
            self.assertTrue(re.search(r"^%s: 2 long runs; .*; instructions vs classic: "
                                      r"median [0-9.]+, max [0-9.]+$" % name, p.stdout, re.M),
                            p.stdout)


if __name__ == "__main__":
    unittest.main()
