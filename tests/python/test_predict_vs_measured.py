"""Tests of bench/gpu/predict_vs_measured.py and bench/gpu/measure_script.py (run.sh part 10)
without a GPU or torch: the table from a canned result, the card named from a device name, the
argument checks, and the wrapper's usage errors."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCRIPT = os.path.join(ROOT, "bench", "gpu", "predict_vs_measured.py")
MEASURE = os.path.join(ROOT, "bench", "gpu", "measure_script.py")
sys.path.insert(0, os.path.join(ROOT, "bench", "gpu"))
import predict_vs_measured as pvm  # noqa: E402

GIB = 2 ** 30
CANNED = {"gpu": "H200", "device_name": "NVIDIA H200", "workloads": [
    {"workload": "gpt2_train", "ok": True,
     "predicted": {"allocated": 11 * GIB, "native": 12 * GIB, "expandable": 10 * GIB},
     "measured": {"allocated": 10 * GIB, "native": 12 * GIB, "expandable": 11 * GIB}},
    {"workload": "vit_train", "ok": False,
     "predicted": {"allocated": 2 * GIB, "native": None, "expandable": None},
     "measured": {"allocated": None, "native": 4 * GIB, "expandable": 3 * GIB}}]}


def run(*args):
    return subprocess.run([sys.executable] + list(args), capture_output=True, text=True,
                          cwd=ROOT)


class Table(unittest.TestCase):
    def test_canned_result(self):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(CANNED, f)
        try:
            p = run(SCRIPT, "--table", f.name)
        finally:
            os.remove(f.name)
        self.assertEqual(p.returncode, 0, p.stderr)
        out = p.stdout.splitlines()
        self.assertIn("H200", out[0])
        self.assertEqual(out[1], "| workload | peak allocated | native reserved | "
                                 "expandable reserved |")
        self.assertIn("| gpt2_train | 11.00 / 10.00 (+10.0%) | 12.00 / 12.00 (+0.0%) | "
                      "10.00 / 11.00 (-9.1%) |", out)
        self.assertIn("| vit_train | 2.00 / - (-) | - / 4.00 (-) | - / 3.00 (-) |", out)

    def test_errors_and_cards(self):
        self.assertAlmostEqual(pvm.err_pct(110, 100), 10.0)
        self.assertIsNone(pvm.err_pct(None, 100))
        self.assertIsNone(pvm.err_pct(100, 0))
        self.assertEqual(pvm.card_of("NVIDIA H100 80GB HBM3"), "H100")
        self.assertEqual(pvm.card_of("NVIDIA H200"), "H200")
        self.assertIsNone(pvm.card_of("NVIDIA A100-SXM4-40GB"))
        self.assertEqual(pvm.last_json('hello\n{"a": 1}\nbye {\n'), {"a": 1})
        self.assertIn("gpt2_train", pvm.workloads())
        self.assertEqual(len(pvm.workloads()), 5)


class Arguments(unittest.TestCase):
    def test_unknown_workload(self):
        p = run(SCRIPT, "--out", "/nonexistent/x.json", "--gpu", "H100", "--only", "nope")
        self.assertEqual(p.returncode, 2)
        self.assertIn("no such workload: nope", p.stderr)

    def test_out_or_table(self):
        p = run(SCRIPT)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--out FILE or --table FILE", p.stderr)

    def test_bad_card(self):
        p = run(SCRIPT, "--out", "x.json", "--gpu", "A100")
        self.assertEqual(p.returncode, 2)

    def test_measure_with_a_stub_torch(self):
        """The wrapper runs the script as __main__ with its own argv and reads the peaks."""
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d, True)
        with open(os.path.join(d, "torch.py"), "w") as f:
            f.write("class cuda:\n"
                    "    synchronize = staticmethod(lambda: None)\n"
                    "    max_memory_allocated = staticmethod(lambda: 1536)\n"
                    "    max_memory_reserved = staticmethod(lambda: 2097152)\n"
                    "    get_device_name = staticmethod(lambda i=0: 'NVIDIA H200')\n")
        script = os.path.join(d, "work.py")
        with open(script, "w") as f:
            f.write("import sys\nif __name__ == '__main__':\n    print('args', sys.argv[1:])\n")
        env = dict(os.environ, PYTHONPATH=d, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
        p = subprocess.run([sys.executable, MEASURE, script, "7"], capture_output=True,
                           text=True, env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("args ['7']", p.stdout)
        d = pvm.last_json(p.stdout)
        self.assertEqual((d["peak_allocated_bytes"], d["peak_reserved_bytes"]), (1536, 2097152))
        self.assertEqual(d["alloc_conf"], "expandable_segments:True")

    def test_measure_usage(self):
        self.assertEqual(run(MEASURE).returncode, 2)
        p = run(MEASURE, "/nonexistent/script.py")
        self.assertEqual(p.returncode, 2)
        self.assertIn("no such file", p.stderr)


if __name__ == "__main__":
    unittest.main()
