"""Tests of bench/model_check.py (the PyTorch models against recorded PyTorch peaks).

The bundled resnet50_train trace comes with PyTorch 2.11's own peaks on the H200
(../shared/traces/README.md, bench/traces/README.md): the models reproduce them exactly, so the
check passes at them and fails when a recorded peak is 2% away.
"""

import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, HERE)

from script_runner import stowage_cli  # noqa: E402

SCRIPT = os.path.join(ROOT, "bench", "model_check.py")
TRACE = os.path.join(ROOT, "bench", "traces", "resnet50_train.rep")
NATIVE_BYTES = 6824132608      # PyTorch native max_memory_reserved on this trace
EXPANDABLE_BYTES = 6098518016  # with expandable_segments:True


@unittest.skipIf(stowage_cli() is None, "no stowage CLI built")
class ModelCheck(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        shutil.copy(TRACE, os.path.join(self.dir, "w.rep"))

    def tearDown(self):
        shutil.rmtree(self.dir)

    def summary(self, mode, value):
        with open(os.path.join(self.dir, f"w.{mode}.json"), "w") as f:
            f.write(value if isinstance(value, str) else json.dumps(
                {"workload": "w", "config": mode, "max_reserved_bytes": value}))

    def run_check(self):
        return subprocess.run([sys.executable, SCRIPT, self.dir, "--stowage", stowage_cli()],
                              capture_output=True, text=True)

    def test_the_recorded_peaks_pass(self):
        self.summary("native", NATIVE_BYTES)
        self.summary("expandable", EXPANDABLE_BYTES)
        p = self.run_check()
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn(f"| w | native | {NATIVE_BYTES} | {NATIVE_BYTES} | +0.000% |", p.stdout)
        self.assertIn(f"| w | expandable | {EXPANDABLE_BYTES} | {EXPANDABLE_BYTES} | +0.000% |",
                      p.stdout)
        self.assertIn("2 comparisons on 1 workloads, worst 0.000%, 0 beyond 1%", p.stdout)

    def test_a_gzipped_trace_is_read(self):
        src = os.path.join(self.dir, "w.rep")
        with open(src, "rb") as f, gzip.open(src + ".gz", "wb") as g:
            g.write(f.read())
        os.remove(src)
        self.summary("native", NATIVE_BYTES)
        self.summary("expandable", EXPANDABLE_BYTES)
        p = self.run_check()
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("2 comparisons on 1 workloads, worst 0.000%, 0 beyond 1%", p.stdout)
        self.assertEqual(sorted(os.listdir(self.dir)),
                         ["w.expandable.json", "w.native.json", "w.rep.gz"])

    def test_a_peak_two_percent_away_fails(self):
        self.summary("native", NATIVE_BYTES)
        self.summary("expandable", round(EXPANDABLE_BYTES * 1.02))
        p = self.run_check()
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("| w | expandable |", p.stdout)
        self.assertIn("-1.961% **off**", p.stdout)
        self.assertIn("1 beyond 1%", p.stdout)

    def test_expandable_is_optional(self):
        self.summary("native", NATIVE_BYTES)
        p = self.run_check()
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertNotIn("expandable", p.stdout)

    def test_bad_input_names_the_file(self):
        p = self.run_check()
        self.assertEqual(p.returncode, 2)
        self.assertIn("w.rep: no w.native.json beside it", p.stderr)
        self.summary("native", "{not json")
        p = self.run_check()
        self.assertEqual(p.returncode, 2)
        self.assertIn("w.native.json", p.stderr)
        self.summary("native", json.dumps({"max_reserved_bytes": -5}))
        p = self.run_check()
        self.assertEqual(p.returncode, 2)
        self.assertIn("no positive integer 'max_reserved_bytes'", p.stderr)
        self.assertEqual(p.stdout, "", "nothing replayed or printed on bad input")


if __name__ == "__main__":
    unittest.main()
