"""stowage.record(lines=True): each allocation of the PyTorch entry point is recorded with the
user's own line that made it (python/stowage/_sites.py, stack_tags.frame_tag_frames), and
dump_trace's PATH.tags carries it to `stowage report`'s sources of the peak.

Run from the repository root after building the library:
    python3 -m unittest tests/python/test_record_lines.py -v
No GPU and no torch needed: STOWAGE_BACKEND=sim, and ctypes calls into stow_torch_malloc stand
in for PyTorch's (the library calls back into Python the same way). STOWAGE_LIB overrides the
library path (default: build/libstowage.so).

    python3 tests/python/test_record_lines.py --cost [N]
prints the cost of the line hook per allocation: N (default 200000) allocations and frees
through the entry point, alternating passes without and with lines, medians of 7.
"""

import ctypes
import os
import random
import subprocess
import sys
import tempfile
import time
import types
import unittest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ["STOWAGE_BACKEND"] = "sim"
os.environ.pop("STOWAGE_CONF", None)

import stowage  # noqa: E402
import stowage._lib  # noqa: E402
from stowage import _sites, stack_tags  # noqa: E402

try:
    LIB = stowage._lib.load()
except stowage.LibraryNotFound as e:  # pragma: no cover
    raise unittest.SkipTest(str(e))

HERE = sys._getframe().f_code.co_filename  # as this file's frames name it
LIB.stow_record_site_text.restype = ctypes.c_char_p
LIB.stow_record_site_text.argtypes = [ctypes.c_uint32]


def free(ptr):
    LIB.stow_torch_free(ptr, 0, 0, None)


def dumped_tags(directory):
    """{id: tag} of a dump of device 0's recording into directory."""
    path = os.path.join(directory, "run.rep")
    stowage.dump_trace(path)
    if not os.path.exists(path + ".tags"):
        return {}
    with open(path + ".tags") as f:
        return {int(l.split(" ", 1)[0]): l.rstrip("\n").split(" ", 1)[1] for l in f}


def write_module(directory, relpath, source):
    """Imports a module written at directory/relpath (a file of an installed package when the
    path holds site-packages)."""
    path = os.path.join(directory, relpath)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(source)
    mod = types.ModuleType(os.path.basename(path)[:-3])
    mod.__file__ = path
    exec(compile(source, path, "exec"), mod.__dict__)
    return mod, path


class Base(unittest.TestCase):
    def setUp(self):
        os.environ["STOWAGE_BACKEND"] = "sim"
        os.environ.pop("STOWAGE_CONF", None)
        LIB.stow_torch_shutdown()
        free(LIB.stow_torch_malloc(512, 0, None))  # device 0's pool, before recording

    def tearDown(self):
        stowage.set_tag(None)
        LIB.stow_torch_shutdown()


class RecordLines(Base):
    def test_each_allocation_has_the_line_that_made_it(self):
        stowage.record(1000)
        line = sys._getframe().f_lineno + 1
        p = LIB.stow_torch_malloc(3 << 20, 0, None)
        q = [LIB.stow_torch_malloc(4096, 0, None) for _ in range(2)]
        with tempfile.TemporaryDirectory() as d:
            tags = dumped_tags(d)
        me = "test_each_allocation_has_the_line_that_made_it"
        self.assertEqual(tags[0], "%s:%d %s" % (HERE, line, me))
        # a list comprehension is a frame of its own before Python 3.12
        self.assertRegex(tags[1], r"^%s:%d (%s|<listcomp>)$" % (HERE, line + 1, me))
        self.assertEqual(tags[2], tags[1])
        for ptr in [p] + q:
            free(ptr)

    def test_library_lines_in_between_follow_after_via(self):
        with tempfile.TemporaryDirectory() as d:
            src = "def alloc(lib, n):\n    return lib.stow_torch_malloc(n, 0, None)\n"
            pkg, pkg_path = write_module(d, "lib/python3.11/site-packages/einops/ops.py", src)
            forward = "def forward(pkg, lib):\n    return pkg.alloc(lib, 1 << 20)\n"
            user, user_path = write_module(d, "project/model.py", forward)
            stowage.record(1000)
            p = user.forward(pkg, LIB)
            line = sys._getframe().f_lineno + 1
            q = pkg.alloc(LIB, 4096)  # called from here: this file is the user's line
            tags = dumped_tags(d)
        self.assertEqual(tags[0], "%s:2 forward via %s:2 alloc" % (user_path, pkg_path))
        me = "test_library_lines_in_between_follow_after_via"
        self.assertEqual(tags[1], "%s:%d %s via %s:2 alloc" % (HERE, line, me, pkg_path))
        free(p)
        free(q)

    def test_lines_false_keeps_the_thread_tags_and_lines_win_over_them(self):
        stowage.record(1000, lines=False)
        stowage.set_tag("weights")
        a = LIB.stow_torch_malloc(4096, 0, None)
        stowage.set_tag(None)
        b = LIB.stow_torch_malloc(4096, 0, None)
        stowage.record(1000)  # restarts the ring, lines on
        stowage.set_tag("weights")
        line = sys._getframe().f_lineno + 1
        c = LIB.stow_torch_malloc(4096, 0, None)
        with tempfile.TemporaryDirectory() as d:
            tags = dumped_tags(d)
        self.assertEqual(tags, {0: "%s:%d %s" % (
            HERE, line, "test_lines_false_keeps_the_thread_tags_and_lines_win_over_them")})
        stowage.record(1000, lines=False)
        d2 = LIB.stow_torch_malloc(4096, 0, None)
        with tempfile.TemporaryDirectory() as d:
            self.assertEqual(dumped_tags(d), {0: "weights"})
        stowage.record(0)  # stops recording and the hook
        stowage.record(1000, lines=False)
        for ptr in (a, b, c, d2):
            free(ptr)

    def test_a_thread_without_python_frames(self):
        sid = _sites.site_of(None)
        self.assertEqual(LIB.stow_record_site_text(sid).decode(), _sites.NO_PYTHON_FRAME)

        class Node:
            def name(self):
                return "MulBackward0"

        torch = types.ModuleType("torch")
        torch._C = types.SimpleNamespace(_current_autograd_node=lambda: Node())
        saved = sys.modules.get("torch")
        sys.modules["torch"] = torch
        try:
            sid = _sites.site_of(None)
        finally:
            if saved is None:
                del sys.modules["torch"]
            else:  # pragma: no cover
                sys.modules["torch"] = saved
        self.assertEqual(LIB.stow_record_site_text(sid).decode(), "<backward> MulBackward0")

    def test_a_failing_hook_gives_no_site_and_raises_nothing(self):
        saved = _sites.site_of

        def broken(frame):
            raise RuntimeError("broken")

        _sites.site_of = broken
        try:
            self.assertEqual(_sites.hook(), 0)
        finally:
            _sites.site_of = saved

    def test_the_report_lists_the_lines_among_the_sources_of_the_peak(self):
        cli = os.path.join(os.path.dirname(stowage.library_path()), "stowage")
        if not os.path.exists(cli):
            self.skipTest("no stowage CLI next to %s" % stowage.library_path())
        stowage.record(1000)
        line = sys._getframe().f_lineno + 1
        p = LIB.stow_torch_malloc(64 << 20, 0, None)
        with tempfile.TemporaryDirectory() as d:
            dumped_tags(d)
            out = os.path.join(d, "r.html")
            subprocess.run([cli, "report", os.path.join(d, "run.rep"), "-o", out], check=True,
                           capture_output=True)
            with open(out) as f:
                page = f.read()
        row = page[page.index("<tr data-id=0>"):]
        row = row[:row.index("</tr>")]
        self.assertIn("%s:%d test_the_report_lists" % (HERE, line), row)
        free(p)


class FakeCode:
    def __init__(self, filename, name):
        self.co_filename, self.co_name = filename, name


class FakeFrame:
    def __init__(self, filename, line, name, back):
        self.f_code, self.f_lineno, self.f_back = FakeCode(filename, name), line, back


class LiveRule(unittest.TestCase):
    FILES = ["/home/u/proj/train.py", "/home/u/proj/model.py",
             "/usr/lib/python3.11/site-packages/torch/nn/modules/module.py",
             "/usr/lib/python3.11/site-packages/transformers/modeling_llama.py",
             "/usr/lib/python3.11/dist-packages/einops/einops.py",
             "/usr/lib/python3.11/contextlib.py", "<frozen importlib._bootstrap>",
             "/tmp/torchinductor_u/ab/cab.py", "<eval_with_key>.3", "<stdin>"]

    def test_live_frames_get_the_tag_of_the_same_frames_recorded(self):
        rng = random.Random(7)
        for _ in range(3000):
            frames = [(rng.choice(self.FILES), rng.randrange(1, 900), rng.choice(["f", "forward"]))
                      for _ in range(rng.randrange(0, 9))]
            chain = None
            for fn, ln, name in reversed(frames):  # outermost first, so the innermost is last
                chain = FakeFrame(fn, ln, name, chain)
            recorded = [{"filename": fn, "line": ln, "name": name} for fn, ln, name in frames]
            self.assertEqual(stack_tags.frame_tag(chain), stack_tags.stack_tag(recorded), frames)

    def test_the_walk_stops_at_the_limit(self):
        chain = FakeFrame("/home/u/proj/train.py", 1, "main", None)
        for i in range(100):
            chain = FakeFrame("/usr/lib/python3.11/site-packages/torch/x.py", i, "g", chain)
        self.assertEqual(stack_tags.frame_tag(chain, limit=100)[1], "python")
        self.assertEqual(stack_tags.frame_tag(chain, limit=101),
                         ("/home/u/proj/train.py:1 main", "user"))
        self.assertEqual(stack_tags.frame_tag(None), (None, None))


def cost(n=200000, repeats=7):
    """ns per allocation and free through the entry point, without and with lines."""
    LIB.stow_torch_shutdown()
    malloc, release = LIB.stow_torch_malloc, LIB.stow_torch_free
    free(malloc(512, 0, None))
    stowage.record(1 << 20, lines=False)

    def model_forward(k):  # a user frame under which a library frame allocates
        return layer(k)

    def layer(k):
        for _ in range(k):
            release(malloc(4096, 0, None), 0, 0, None)

    off, on = [], []
    for _ in range(repeats):
        for lines, out in ((False, off), (True, on)):
            stowage.record(1 << 20, lines=lines)
            t0 = time.perf_counter()
            model_forward(n)
            out.append((time.perf_counter() - t0) * 1e9 / n)
    stowage.record(0)
    LIB.stow_torch_shutdown()
    return sorted(off)[repeats // 2], sorted(on)[repeats // 2]


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--cost":
        off, on = cost(int(sys.argv[2]) if len(sys.argv) > 2 else 200000)
        print("per allocation and free: %.0f ns without lines, %.0f ns with lines: "
              "+%.0f ns (Python %d.%d)" % (off, on, on - off, *sys.version_info[:2]))
    else:
        unittest.main()
