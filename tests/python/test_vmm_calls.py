"""bench/vmm_calls.py and bench/vmm_handles.sh on small traces worked out by hand: the page-mapped
pool's map + unmap calls and modelled time against the pytorch-expandable model's, and the goal
lines and curve rows built from them."""

import os
import subprocess
import sys
import tempfile
import unittest

from script_runner import build_program

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
CALLS = os.path.join(ROOT, "bench", "vmm_calls.py")
HANDLES = os.path.join(ROOT, "bench", "vmm_handles.sh")
TRACE = os.path.join(ROOT, "bench", "traces", "resnet50_train.rep")
NAMES = ("gpt2_train", "resnet50_train", "resnet_multiscale_train", "vit_train", "gpt2_generate")

# One 30 MiB block: vmm maps it as 2 handles of 20 MiB at most (15 granules: 8 + 7), the model
# as 2 pages of 20 MiB; neither unmaps. So 2 calls each, x1.00.
ONE_BLOCK = "1 2\na 0 31457280 0\nf 0\n"


@unittest.skipUnless(build_program("stowage") and
                     os.path.realpath(os.path.dirname(build_program("stowage"))) ==
                     os.path.realpath(os.path.join(ROOT, "build")),
                     "the scripts run build/stowage of the repository")
class VmmCalls(unittest.TestCase):
    def calls(self, *args):
        p = subprocess.run([sys.executable, CALLS] + list(args), capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        return p.stdout

    def test_a_trace_worked_out_by_hand(self):
        with tempfile.TemporaryDirectory() as d:
            t = os.path.join(d, "one.rep")
            with open(t, "w") as f:
                f.write(ONE_BLOCK)
            out = self.calls(t)
            row = [l for l in out.splitlines() if l.startswith("| one ")]
            self.assertEqual(len(row), 1, out)
            cells = [c.strip() for c in row[0].strip("|").split("|")]
            self.assertEqual(cells[4:7], ["2", "2", "1.00"], row[0])
            self.assertIn("calls above 2.0 x expandable: 0", out)
            # A handle per granule: 15 maps, x7.50, above the goal.
            out = self.calls(t, "--", "--tuning", "vmm_handle_mb:2")
            self.assertIn("calls above 2.0 x expandable: 1 one 7.50", out)
            row = self.calls("--row", "2", t, "--", "--tuning", "vmm_handle_mb:2")
            cells = [c.strip() for c in row.strip().strip("|").split("|")]
            self.assertEqual(cells[:4], ["2", "7.50", "7.50", "1"], row)

    def test_the_curve_has_a_row_per_handle_size(self):
        with tempfile.TemporaryDirectory() as d:
            for name in NAMES:
                os.symlink(os.path.abspath(TRACE), os.path.join(d, name + ".rep"))
            env = dict(os.environ, STOW_TRACES_DIR=d, FACTORS="1.05", HANDLES="2 20")
            p = subprocess.run(["bash", HANDLES], capture_output=True, text=True, env=env)
            self.assertEqual(p.returncode, 0, p.stderr)
            rows = [l for l in p.stdout.splitlines() if l.startswith("| ") and "---" not in l]
            self.assertEqual(len(rows), 3, p.stdout)  # the header and two sizes
            per_granule = [c.strip() for c in rows[1].strip("|").split("|")]
            handles = [c.strip() for c in rows[2].strip("|").split("|")]
            self.assertEqual(per_granule[0], "2")
            # 10 traces: the bundled one under 5 names and their x1.05 variants.
            self.assertLess(int(handles[10]), int(per_granule[10]), "fewer calls in all")


if __name__ == "__main__":
    unittest.main()
