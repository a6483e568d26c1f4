"""The recorder on operators and modules that models of bench/zoo run: each test is a small
script under `stowage predict` whose trace or output shows the recorder serving it as a GPU run
does (the kernel models reading arguments by name, 0-dim parameters moved to the device, ...).

The interpreter and the skips are test_predict.py's: an interpreter that imports torch and a C
compiler for the emulated device.
"""

import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_predict import NO_CC, NO_TORCH, TORCH_PY, ScriptDir, _env  # noqa: E402


@unittest.skipIf(NO_TORCH, NO_TORCH)
@unittest.skipIf(NO_CC, NO_CC)
class RecorderOps(ScriptDir, unittest.TestCase):
    def run_script(self, name, text):
        """(stdout, allocation sizes of the trace) of the script under stowage predict."""
        path = self.script(name, text)
        trace = path + ".rep"
        r = subprocess.run([TORCH_PY, "-m", "stowage", "predict", "--no-tags", "-o", trace, path],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(),
                           cwd=self.dir)
        self.assertEqual(r.returncode, 0, r.stderr.decode()[-3000:])
        with open(trace) as f:
            f.readline()
            sizes = [int(line.split()[2]) for line in f if line.startswith("a ")]
        return r.stdout.decode(), sizes

    def test_norms_reduce_over_their_dim_argument(self):
        # linalg_vector_norm(self, ord, dim, keepdim) and norm.ScalarOpt_dim(self, p, dim,
        # keepdim): a norm over dim 0 of a (8192, 3072) bf16 tensor splits across thread blocks
        # and takes the global buffer reduce_scratch gives for it, 138,412,032 B on an H100.
        out, sizes = self.run_script("norms.py", """
            import torch
            import torch.nn.functional as F
            x = torch.empty(8192, 3072, dtype=torch.bfloat16, device="cuda")
            a = torch.linalg.vector_norm(x, 2.0, 0)
            b = F.normalize(x, dim=0)
            c = torch.ops.aten.norm.ScalarOpt_dim(x, 2.0, [0])
            print(tuple(a.shape), tuple(b.shape), tuple(c.shape))
        """)
        self.assertEqual(out.splitlines()[0], "(3072,) (8192, 3072) (3072,)")
        self.assertEqual(sizes.count(138412032), 3, sizes)

    def test_a_zero_dim_parameter_made_from_a_value_moves_to_the_device(self):
        # nn.Parameter(torch.tensor(v)) is a constant of the fake mode, which keeps weak
        # references to it; Module.to("cuda") swaps it all the same and its value stays known.
        out, sizes = self.run_script("zero_dim.py", """
            import torch
            class M(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.gain = torch.nn.Parameter(torch.tensor(0.5))
                    self.w = torch.nn.Parameter(torch.ones(4))
            m = M().to("cuda")
            (m.gain * m.w).sum().backward()
            print(m.gain.device, tuple(m.gain.shape), float(m.gain.detach()), m.gain.grad.device)
        """)
        self.assertEqual(out.splitlines()[0], "cuda:0 () 0.5 cuda:0")
        self.assertEqual(sizes[:2], [4, 16])

    def test_grid_sample_runs_cudnn_grid_sampler_on_fake_tensors(self):
        # bilinear, zero padding, align_corners: cuDNN's sampler, which has no meta kernel. The
        # expanded input (16,384 B contiguous) is copied first in both directions, and in the
        # backward the expanded gradient of the sum (2,240 B); then come the outputs: 2 x 8 x
        # 5 x 7 floats, and grad_self (16,384 B) and the grid's gradient (2 x 5 x 7 x 2).
        out, sizes = self.run_script("grid_sample.py", """
            import torch
            import torch.nn.functional as F
            x = torch.randn(1, 8, 16, 16, device="cuda", requires_grad=True)
            grid = torch.zeros(2, 5, 7, 2, device="cuda", requires_grad=True)
            y = F.grid_sample(x.expand(2, 8, 16, 16), grid, align_corners=True)
            y.sum().backward()
            print(tuple(y.shape), tuple(x.grad.shape), tuple(grid.grad.shape))
        """)
        self.assertEqual(out.splitlines()[0], "(2, 8, 5, 7) (1, 8, 16, 16) (2, 5, 7, 2)")
        i = sizes.index(2240)
        self.assertEqual(sizes[i - 1:i + 1], [16384, 2240], sizes)
        self.assertEqual(sizes[i + 3:i + 7], [16384, 2240, 16384, 560], sizes)

    def test_a_torchscript_function_runs_unfused_past_its_profiling_calls(self):
        # DeBERTa's build_relative_position: from its second call the profiling executor would
        # fuse the integer arithmetic into a CUDA kernel compiled for the emulated device.
        out, sizes = self.run_script("script_fn.py", """
            import torch
            @torch.jit.script
            def rel(q, k):
                a = torch.arange(q.size(-2), dtype=torch.long, device=q.device)
                b = torch.arange(k.size(-2), dtype=torch.long, device=k.device)
                return (a[:, None] - b[None, :]).unsqueeze(0)
            x = torch.empty(2, 16, 8, device="cuda")
            print([tuple(rel(x, x).shape) for _ in range(4)][-1])
        """)
        self.assertEqual(out.splitlines()[0], "(1, 16, 16)")
        self.assertEqual(sizes.count(2048), 4, sizes)  # each call's 16 x 16 int64 result

    def test_grouped_mm_in_float32_under_autocast(self):
        # A mixture of experts' grouped GEMM with fp32 weights under bf16 autocast (autocast
        # leaves _grouped_mm alone): CUDA's fallback runs it where the meta kernel wants bf16.
        # The fp32 output is 64 x 24 (6,144 B); bfloat16 inputs take the meta kernel.
        out, sizes = self.run_script("grouped_mm.py", """
            import torch
            x = torch.randn(64, 32, device="cuda", requires_grad=True)
            w = torch.randn(4, 32, 24, device="cuda", requires_grad=True)
            offs = torch.tensor([16, 32, 48, 64], dtype=torch.int32, device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = torch._grouped_mm(x, w, offs=offs)
            y.sum().backward()
            yb = torch._grouped_mm(x.bfloat16(), w.bfloat16(), offs=offs)
            print(tuple(y.shape), y.dtype, tuple(w.grad.shape), yb.dtype)
        """)
        self.assertEqual(out.splitlines()[0],
                         "(64, 24) torch.float32 (4, 32, 24) torch.bfloat16")
        self.assertEqual(sizes[3], 6144, sizes)

    def test_a_zero_dim_tensor_formats_as_its_value(self):
        # Switch Transformers names its experts' modules f"expert_{idx}" with a 0-dim tensor
        # from a routing that the recorder knows (the data-dependent policy: all zeros).
        out, _ = self.run_script("format.py", """
            import torch
            experts = torch.nn.ModuleDict({"expert_%d" % i: torch.nn.Linear(8, 8)
                                           for i in range(4)}).to("cuda")
            x = torch.randn(16, 8, device="cuda")
            route = experts["expert_0"](x).argmax(-1)
            hit = torch.bincount(route, minlength=4).nonzero()
            for idx in hit:
                y = experts[f"expert_{idx[0]}"](x)
            print(f"expert_{hit[0, 0]}", f"{torch.tensor(2.5, device='cuda'):.2f}")
        """)
        self.assertEqual(out.splitlines()[0], "expert_0 2.50")

    def test_lstm_runs_cudnn_rnn_under_autocast(self):
        # nn.LSTM on CUDA: Module.to() flattens the weights into one buffer (125,952 B fp32);
        # under autocast the weights are copied into a half buffer (62,976 B) and the input,
        # hx and cx cast to half; training keeps cuDNN's reserve (46,080 B, an estimate); the
        # backward's dw is one buffer of the half weights' size.
        out, sizes = self.run_script("lstm.py", """
            import torch
            m = torch.nn.LSTM(32, 48, batch_first=True, bidirectional=True).to("cuda")
            x = torch.randn(4, 10, 32, device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y, (h, c) = m(x)
            y.float().sum().backward()
            print(tuple(y.shape), y.dtype, tuple(h.shape), m.weight_hh_l0.grad.dtype)
        """)
        self.assertEqual(out.splitlines()[0], "(4, 10, 96) torch.float16 (2, 4, 48) torch.float32")
        self.assertEqual(sizes[8], 125952, sizes)
        self.assertEqual(sizes.count(62976), 2, sizes)
        self.assertIn(46080, sizes)

    def test_a_host_tensor_converts_to_numpy_with_its_values(self):
        # DETR's Hungarian matching hands a cost matrix brought to the host to SciPy
        # (np.asarray): known values convert as they are, unknown ones as zeros (the policy).
        out, _ = self.run_script("to_numpy.py", """
            import numpy as np
            import torch
            known = (torch.arange(6, device="cuda").view(2, 3) * 2).cpu()
            w = torch.randn(100, 100, device="cuda")
            unknown = (torch.randn(4, 100, device="cuda") @ w).cpu()
            print(np.asarray(known).tolist(), known.numpy().dtype, np.asarray(unknown).sum(),
                  np.asarray(unknown, dtype=np.float64).shape)
        """)
        self.assertEqual(out.splitlines()[0], "[[0, 2, 4], [6, 8, 10]] int64 0.0 (4, 100)")


if __name__ == "__main__":
    unittest.main()
