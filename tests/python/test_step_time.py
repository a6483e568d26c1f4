"""Tests of bench/gpu/step_time.py's table (interleaved rounds of training step times), on runs
written here as bench/gpu/train.py writes them; bench/gpu/run.sh parses."""

import io
import json
import os
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "bench", "gpu"))

import step_time  # noqa: E402


def write_run(d, model, mode, rnd, step_ms, warmup=2, calls=0):
    res = {"model": model, "mode": mode, "warmup": warmup, "step_ms": step_ms,
           "device_calls_after_warmup": calls}
    with open(os.path.join(d, "step_%s_%s_r%d.json" % (model, mode, rnd)), "w") as f:
        json.dump(res, f)


class StepTime(unittest.TestCase):
    def test_medians_spread_and_same_round_ratios(self):
        with tempfile.TemporaryDirectory() as d:
            # Warm-up steps (500 ms) are left out; native 100 ms then 110 ms (drift),
            # stowage 99 and 110: same-round ratios 0.99 and 1.0.
            write_run(d, "resnet50", "native", 1, [500, 500] + [100] * 60, calls=0)
            write_run(d, "resnet50", "stowage", 1, [500, 500] + [99] * 60, calls=3)
            write_run(d, "resnet50", "native", 2, [500, 500] + [110] * 60, calls=0)
            write_run(d, "resnet50", "stowage", 2, [500, 500] + [110] * 60, calls=0)
            with open(os.path.join(d, "step_gpt2_stowage_r1.json"), "w") as f:
                json.dump({"model": "gpt2", "mode": "stowage", "skipped": "no GPU"}, f)
            out = io.StringIO()
            with redirect_stdout(out):
                summary = step_time.summarise(d)
            rows = {(r["model"], r["mode"]): r for r in summary["rows"]}
            self.assertEqual(set(rows), {("resnet50", "native"), ("resnet50", "stowage")})
            native = rows[("resnet50", "native")]
            self.assertEqual(native["steps"], 120)
            self.assertEqual(native["round_medians_ms"], [100, 110])
            self.assertAlmostEqual(native["p10_ms"], 100)
            self.assertAlmostEqual(native["p90_ms"], 110)
            self.assertAlmostEqual(rows[("resnet50", "stowage")]["device_calls_per_step"],
                                   3 / 120)
            (ratio,) = summary["ratios"]
            self.assertEqual((ratio["rounds"], ratio["min"], ratio["max"]), (2, 0.99, 1.0))
            self.assertAlmostEqual(ratio["median"], 0.995)
            self.assertIn("| resnet50 | stowage (2 rounds) | 0.995 | 0.990-1.000 |",
                          out.getvalue())
            self.assertTrue(os.path.exists(os.path.join(d, "step_time.json")))

    def test_no_runs_is_an_error(self):
        with tempfile.TemporaryDirectory() as d:
            p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu",
                                                             "step_time.py"), "--summarise", d],
                               capture_output=True, text=True)
            self.assertEqual(p.returncode, 1)
            self.assertIn("no run", p.stdout)

    def test_native_is_required(self):
        p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu", "step_time.py"),
                            "--out", "x", "--modes", "stowage"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)

    def test_the_gpu_scripts_parse(self):
        p = subprocess.run(["bash", "-n", os.path.join(ROOT, "bench", "gpu", "run.sh")],
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        for script in ("train.py", "step_time.py"):
            path = os.path.join(ROOT, "bench", "gpu", script)
            with open(path) as f:
                compile(f.read(), path, "exec")  # a SyntaxError fails the test


if __name__ == "__main__":
    unittest.main()
