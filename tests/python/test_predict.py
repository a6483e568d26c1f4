"""stowage predict: the recorder on an emulated GPU, the command and its Python API.

The tests that run PyTorch use an interpreter that imports torch: this one if it can, else the
virtual environment of python/requirements.txt (STOWAGE_VENV, default ~/.cache/stowage/venv,
what `make deps` makes). Without one they skip and say why; so do they without a C compiler
(the emulated device is built from stowage/fake_cuda.c at first use). Policy figures need the
stowage tool (build/stowage or PATH); without it those checks are left out.

The accuracy against real GPU runs is bench/predict_check.py's (docs/predict.md).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

from stowage import fake_gpu, predict  # noqa: E402  (standard library only)

MiB = 1 << 20


def _torch_python():
    """(interpreter that imports torch, None) or (None, why not)."""
    candidates = [sys.executable]
    venv = os.environ.get("STOWAGE_VENV") or os.path.join(os.path.expanduser("~"), ".cache",
                                                          "stowage", "venv")
    candidates.append(os.path.join(venv, "bin", "python"))
    for py in candidates:
        if not os.path.exists(py):
            continue
        r = subprocess.run([py, "-c", "import torch"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        if r.returncode == 0:
            return py, None
    return None, ("torch is not importable here nor in %s (make deps makes it)" % venv)


TORCH_PY, NO_TORCH = _torch_python()
try:
    fake_gpu.library_path()
    NO_CC = None
except fake_gpu.FakeCudaError as exc:
    NO_CC = str(exc)


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "python") + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _have_tool():
    from stowage.__main__ import cli_path
    return cli_path() is not None


class Cards(unittest.TestCase):
    def test_names_and_aliases(self):
        self.assertIs(fake_gpu.card(None), fake_gpu.CARDS["H100"])
        self.assertIs(fake_gpu.card("h200"), fake_gpu.CARDS["H200"])
        self.assertIs(fake_gpu.card("A100"), fake_gpu.CARDS["A100-80GB"])
        self.assertIs(fake_gpu.card("a100_40gb"), fake_gpu.CARDS["A100-40GB"])
        with self.assertRaises(ValueError):
            fake_gpu.card("V100")

    def test_cublas_workspace_follows_the_card_and_the_environment(self):
        h100, a100 = fake_gpu.card("H100"), fake_gpu.card("A100-80GB")
        self.assertEqual(h100.cublas_workspace_bytes({}), 32 * MiB)
        self.assertEqual(a100.cublas_workspace_bytes({}), 8519680)
        self.assertEqual(h100.cublas_workspace_bytes({"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}),
                         32 * MiB)
        self.assertEqual(h100.cublas_workspace_bytes({"CUBLAS_WORKSPACE_CONFIG": ":16:8"}),
                         128 * 1024)
        self.assertEqual(h100.cublaslt_workspace_bytes({}), 1 * MiB)
        self.assertEqual(h100.cublaslt_workspace_bytes({"CUBLASLT_WORKSPACE_SIZE": "4096"}),
                         4 * MiB)


class Sizes(unittest.TestCase):
    def test_parse_bytes(self):
        self.assertEqual(predict.parse_bytes("80GiB"), 80 << 30)
        self.assertEqual(predict.parse_bytes("80G"), 80 << 30)
        self.assertEqual(predict.parse_bytes("40GB"), 40 * 10 ** 9)
        self.assertEqual(predict.parse_bytes("1.5MiB"), 3 * MiB // 2)
        self.assertEqual(predict.parse_bytes("512"), 512)
        for bad in ("", "GiB", "-3G", "12X", "0"):
            with self.assertRaises(ValueError, msg=bad):
                predict.parse_bytes(bad)

    def test_usage_errors_exit_2(self):
        with open(os.devnull, "w") as null:
            saved = sys.stderr
            sys.stderr = null
            try:
                self.assertEqual(predict.main([]), 2)
                self.assertEqual(predict.main(["--gpu", "V100", "x.py"]), 2)
                self.assertEqual(predict.main(["--capacity", "lots", "x.py"]), 2)
                self.assertEqual(predict.main(["--alpha", "-1", "x.py"]), 2)
            finally:
                sys.stderr = saved


TRAIN = """
import os, torch
torch.manual_seed(0)
batch = int(os.environ.get("BATCH", "8"))
m = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                        torch.nn.Linear(1024, 256)).to("cuda")
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
for _ in range(2):
    x = torch.randn(batch, 256, device="cuda")
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        loss = m(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print("loss", loss.item(), "allocated", torch.cuda.memory_allocated())
"""


class ScriptDir:
    """A temporary folder per test class (cls.dir) and script(name, text), which
    writes a dedented script there; mixed into the TestCases that run scripts."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="stowage-test-%s-" % cls.__name__.lower())

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def script(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(textwrap.dedent(text))
        return path


@unittest.skipIf(NO_TORCH, NO_TORCH)
@unittest.skipIf(NO_CC, NO_CC)
class Predict(ScriptDir, unittest.TestCase):

    def predict(self, *args, env=None):
        r = subprocess.run([TORCH_PY, "-m", "stowage", "predict"] + list(args),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env or _env(),
                           cwd=self.dir)
        return r.returncode, r.stdout.decode(), r.stderr.decode()

    def test_json_is_the_last_line_with_the_issue_schema(self):
        path = self.script("train.py", TRAIN)
        trace = os.path.join(self.dir, "train.rep")
        rc, out, err = self.predict("--json", "-o", trace, path)
        self.assertEqual(rc, 0, err)
        lines = out.strip().splitlines()
        self.assertTrue(lines[0].startswith("loss 0.0 allocated "), out)  # the script's own print
        s = json.loads(lines[-1])
        self.assertEqual(s["gpu"], "H100")
        self.assertGreater(s["peak_allocated_bytes"], 32 * MiB)  # the cuBLAS workspace and more
        self.assertGreater(s["events"], 0)
        self.assertIn("policies", s)
        self.assertEqual(s["default_policy"], "vmm")
        if _have_tool():
            self.assertEqual(set(s["policies"]),
                             {"pytorch", "pytorch-expandable", "classic", "vmm"})
            for d in s["policies"].values():
                self.assertGreaterEqual(d["peak_reserved_bytes"], s["peak_live_bytes"])
                self.assertGreaterEqual(d["min_capacity_bytes"], s["peak_live_bytes"])
        with open(trace) as f:
            ids, events = (int(v) for v in f.readline().split())
            body = [line.split() for line in f if line.strip()]
        self.assertEqual(events, s["events"])
        self.assertEqual(len(body), events)
        sizes = [int(p[2]) for p in body if p[0] == "a"]
        self.assertEqual(len(sizes), ids)
        self.assertIn(32 * MiB, sizes)  # H100: one cuBLAS workspace per thread and stream
        with open(trace + ".tags") as f:
            tags = f.read()
        self.assertIn("train.py:", tags)  # the user's line

    def test_the_card_decides_the_workspace(self):
        path = self.script("train_a100.py", TRAIN)
        trace = os.path.join(self.dir, "a100.rep")
        rc, out, err = self.predict("--gpu", "A100-40GB", "--json", "-o", trace, path)
        self.assertEqual(rc, 0, err)
        self.assertEqual(json.loads(out.strip().splitlines()[-1])["gpu"], "A100-40GB")
        with open(trace) as f:
            f.readline()
            sizes = [int(p.split()[2]) for p in f if p.startswith("a ")]
        self.assertIn(8519680, sizes)
        self.assertNotIn(32 * MiB, sizes)

    def test_the_device_answers_as_the_card(self):
        path = self.script("device.py", """
            import torch
            p = torch.cuda.get_device_properties(0)
            print(torch.cuda.is_available(), torch.cuda.device_count(), p.name, p.major, p.minor,
                  p.multi_processor_count, torch.cuda.is_bf16_supported())
            x = torch.empty(1000, device="cuda")
            free, total = torch.cuda.mem_get_info()
            print(torch.cuda.memory_allocated(), total == p.total_memory, free < total)
        """)
        rc, out, err = self.predict("--gpu", "H200", path)
        self.assertEqual(rc, 0, err)
        first, second = out.splitlines()[:2]
        self.assertEqual(first, "True 1 NVIDIA H200 9 0 132 True")
        self.assertEqual(second, "4096 True True")

    def test_data_dependent_calls_use_the_values_of_small_tensors(self):
        path = self.script("loop.py", """
            import torch
            n = torch.zeros(1, dtype=torch.long, device="cuda")
            bufs = []
            while n.item() < 5:
                bufs.append(torch.empty(1 << 20, device="cuda"))
                n += 1
            mask = torch.arange(10, device="cuda") % 3 == 0
            picked = torch.randn(10, 64, device="cuda")[mask]
            w = torch.randn(100, 100, device="cuda")              # too large to draw
            top = (torch.randn(4, 100, device="cuda") @ w).argmax(-1)  # no data: zeros
            print(len(bufs), tuple(picked.shape), top.tolist(), int(mask.nonzero().numel()))
        """)
        rc, out, err = self.predict("--json", path)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.splitlines()[0], "5 (4, 64) [0, 0, 0, 0] 4")
        s = json.loads(out.strip().splitlines()[-1])
        self.assertEqual(s["data_dependent"]["count"], 1)
        self.assertEqual(s["data_dependent"]["sites"][0]["op"], "aten.argmax")
        self.assertTrue(s["data_dependent"]["sites"][0]["line"].endswith("loop.py:11"))

    def test_a_script_that_raises_gives_its_error_and_no_figures(self):
        path = self.script("raises.py", """
            import torch
            x = torch.randn(4, 4, device="cuda")
            raise ValueError("the user's own error")
        """)
        rc, out, err = self.predict("--json", path)
        self.assertEqual(rc, 1)
        self.assertEqual(out.strip(), "")
        self.assertIn("raises.py\", line 4", err)
        self.assertIn("ValueError: the user's own error", err)
        self.assertIn("no figures", err)
        self.assertNotIn("recorder.py", err)

    def test_an_operator_without_a_fake_kernel_is_named_with_the_line(self):
        path = self.script("nofake.py", """
            import torch
            @torch.library.custom_op("stowtest::twice", mutates_args=())
            def twice(x: torch.Tensor) -> torch.Tensor:
                return x * 2
            y = twice(torch.randn(4, device="cuda"))
        """)
        rc, out, err = self.predict(path)
        self.assertEqual(rc, 3)
        self.assertEqual(out.strip(), "")
        self.assertIn("stowtest.twice has no fake (meta) kernel", err)
        self.assertIn("nofake.py:6", err)
        self.assertIn("no figures", err)

    def test_a_data_dependent_call_on_a_large_unknown_tensor_is_refused(self):
        path = self.script("large.py", """
            import torch
            x = torch.randn(4096, 4096, device="cuda")
            idx = torch.nonzero(x > 0)
        """)
        rc, out, err = self.predict(path)
        self.assertEqual(rc, 3)
        self.assertIn("aten.nonzero", err)
        self.assertIn("large.py:4", err)

    def test_capacity_and_sweep(self):
        path = self.script("sweep.py", TRAIN)
        plot = os.path.join(self.dir, "sweep.html")
        rc, out, err = self.predict("--json", "--sweep", "BATCH=8,262144", "--capacity", "1GiB",
                                    "--plot", plot, path)
        self.assertEqual(rc, 0, err)
        s = json.loads(out.strip().splitlines()[-1])
        self.assertEqual([v["value"] for v in s["values"]], ["8", "262144"])
        self.assertLess(s["values"][0]["peak_allocated_bytes"],
                        s["values"][1]["peak_allocated_bytes"])
        self.assertTrue(os.path.exists(plot))
        if _have_tool():
            self.assertEqual(s["largest_fit"], "8")
            rc, out, err = self.predict("--json", "--capacity", "64MiB", path)
            self.assertEqual(rc, 4, err)  # the context alone does not fit
            self.assertEqual(set(json.loads(out.strip().splitlines()[-1])["fits"].values()),
                             {False})

    def test_python_api_in_a_process_that_then_exits_cleanly(self):
        code = textwrap.dedent("""
            import json, stowage.predict
            with stowage.predict.record(gpu="H200") as rec:
                import torch
                m = torch.nn.Linear(64, 64).to("cuda")
                m(torch.randn(8, 64, device="cuda")).sum().backward()
            rec.save(%r)
            s = rec.summary()
            print(json.dumps({"events": s["events"], "gpu": s["gpu"],
                              "peak": s["peak_allocated_bytes"]}))
        """ % os.path.join(self.dir, "api.rep"))
        r = subprocess.run([TORCH_PY, "-c", code], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=_env())
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        s = json.loads(r.stdout.decode().strip().splitlines()[-1])
        self.assertEqual(s["gpu"], "H200")
        self.assertGreater(s["events"], 4)
        self.assertTrue(os.path.exists(os.path.join(self.dir, "api.rep")))

    def test_kernel_models_give_the_real_scratch_sizes(self):
        # Figures of the real H200 traces: the bias gradients of GPT-2's MLP (8192 x 3072) and
        # attention (8192 x 2304) in bf16, and the batch norm grid of ResNet-50's layer3.
        code = textwrap.dedent("""
            from stowage import fake_gpu, kernels
            h200 = fake_gpu.card("H200")
            print(kernels.reduce_scratch((8192, 3072), (3072, 1), [0], 2, 4, h200))
            print(kernels.reduce_scratch((8192, 2304), (2304, 1), [0], 2, 4, h200))
            print(kernels.reduce_scratch((8192, 3072), (3072, 1), [1], 2, 4, h200))
            print(kernels._bn_grid(128 * 14 * 14, 1024))
        """)
        r = subprocess.run([TORCH_PY, "-c", code], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=_env())
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertEqual(r.stdout.decode().split("\n")[:4],
                         ["(138412032, 96)", "(139198464, 72)", "(0, 0)", "(32, 98)"])


if __name__ == "__main__":
    unittest.main()
