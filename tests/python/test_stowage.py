"""Tests of the Python package (python/stowage) against libstowage.so.

Run from the repository root after building the library:
    python3 -m unittest discover -s tests/python -v
No GPU and no torch needed: STOWAGE_BACKEND=sim puts the pools behind the
PyTorch entry points on a simulated device, and a fake `torch` module stands in
for PyTorch to check what enable() wires. STOWAGE_LIB overrides the library path
(default: build/libstowage.so).
"""

import ctypes
import os
import tempfile
import sys
import types
import unittest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ["STOWAGE_BACKEND"] = "sim"
os.environ.pop("STOWAGE_CONF", None)

import stowage  # noqa: E402
import stowage._lib  # noqa: E402

MiB = 1 << 20

try:
    LIB = stowage._lib.load()
except stowage.LibraryNotFound as e:  # pragma: no cover
    raise unittest.SkipTest(str(e))


def malloc(size, device=0, stream=None):
    return LIB.stow_torch_malloc(size, device, stream)


def free(ptr, device=0):
    LIB.stow_torch_free(ptr, 0, device, None)


class Base(unittest.TestCase):
    def setUp(self):
        os.environ["STOWAGE_BACKEND"] = "sim"
        os.environ.pop("STOWAGE_SIM_CAPACITY", None)
        os.environ.pop("STOWAGE_CONF", None)
        LIB.stow_torch_shutdown()

    tearDown = setUp


class ImportTest(unittest.TestCase):
    def test_import_does_not_import_torch(self):
        code = ("import sys; sys.path.insert(0, %r); import stowage, stowage.torch; "
                "assert 'torch' not in sys.modules, 'torch imported'" % os.path.join(ROOT, "python"))
        import subprocess
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_library_path_and_version(self):
        self.assertTrue(os.path.isabs(stowage.library_path()))
        self.assertEqual(len(stowage.version()), 3)
        self.assertEqual(stowage.backend_name(), "sim")

    def test_stowage_lib_env_is_honoured(self):
        import subprocess
        code = ("import sys; sys.path.insert(0, %r); import stowage; stowage.library_path()"
                % os.path.join(ROOT, "python"))
        env = dict(os.environ, STOWAGE_LIB="/nonexistent/libstowage.so")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("STOWAGE_LIB", r.stderr)

    def test_cuda_probe_explains(self):
        ok, why = stowage.cuda_probe()
        if not ok:
            self.assertTrue(why)


class StatsTest(Base):
    def test_zero_stats_before_first_use(self):
        st = stowage.memory_stats(0)
        for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak",
                    "reserved_bytes.all.current", "reserved_bytes.all.peak",
                    "active_bytes.all.current", "requested_bytes.all.current",
                    "num_alloc_retries", "num_ooms"):
            self.assertIn(key, st)
            self.assertEqual(st[key], 0)
        self.assertEqual(stowage.memory_allocated(), 0)
        self.assertIn("no pool", stowage.memory_summary())

    def test_allocated_reserved_and_peaks(self):
        p = malloc(10 * MiB)
        q = malloc(1000)
        self.assertTrue(p and q)
        self.assertEqual(stowage.memory_allocated(0), 10 * MiB + 1024)
        self.assertEqual(stowage.memory_stats(0)["requested_bytes.all.current"], 10 * MiB + 1000)
        self.assertGreaterEqual(stowage.memory_reserved(0), stowage.memory_allocated(0))
        free(p)
        self.assertEqual(stowage.max_memory_allocated(0), 10 * MiB + 1024)
        stowage.reset_peak_memory_stats(0)
        self.assertEqual(stowage.max_memory_allocated(0), 1024)
        self.assertGreater(stowage.max_memory_reserved(0), 0)
        free(q)

    def test_device_argument_forms(self):
        p = malloc(4096, device=1)
        self.assertEqual(stowage.memory_allocated(1), 4096)
        self.assertEqual(stowage.memory_allocated("cuda:1"), 4096)
        self.assertEqual(stowage.memory_allocated(types.SimpleNamespace(index=1)), 4096)
        self.assertEqual(stowage.memory_allocated(), 0)  # device 0
        free(p, device=1)

    def test_empty_cache(self):
        p = malloc(64 * MiB)
        free(p)
        self.assertGreater(stowage.memory_reserved(), 0)
        stowage.empty_cache()
        self.assertEqual(stowage.memory_reserved(), 0)

    def test_summary_mentions_reserved(self):
        p = malloc(5 * MiB)
        text = stowage.memory_summary()
        self.assertGreater(len(text), 100)
        free(p)

    def test_reset_accumulated(self):
        free(malloc(5 * MiB))
        self.assertGreater(stowage.memory_stats()["allocated_bytes.all.allocated"], 0)
        stowage.reset_accumulated_memory_stats()
        self.assertEqual(stowage.memory_stats()["allocated_bytes.all.allocated"], 0)

    def test_oom_returns_null_and_is_explained(self):
        os.environ["STOWAGE_SIM_CAPACITY"] = "32M"
        self.assertIsNone(malloc(100 * MiB))  # NULL -> None with c_void_p
        st = stowage.memory_stats()
        self.assertEqual(st["num_ooms"], 1)
        self.assertIn("out of memory", stowage.last_error())
        self.assertTrue(malloc(4 * MiB))

    def test_memory_fraction_before_first_use(self):
        os.environ["STOWAGE_SIM_CAPACITY"] = "64M"
        LIB.stow_torch_memory_fraction(0.5, 0)
        self.assertIsNone(malloc(40 * MiB))
        self.assertTrue(malloc(20 * MiB))

    def test_stowage_conf_and_validation(self):
        stowage.validate_conf("max_split_size_mb:64,garbage_collection_threshold:0.6")
        with self.assertRaises(ValueError):
            stowage.validate_conf("max_split_size_mb:banana")
        os.environ["STOWAGE_CONF"] = "max_split_size_mb:64"
        free(malloc(4096))
        self.assertEqual(stowage.memory_stats()["max_split_size"], 64 * MiB)

    def test_record_stream_and_foreign_pointers_do_not_crash(self):
        p = malloc(8 * MiB, stream=0x10)
        LIB.stow_torch_record_stream(p, 0x20)
        LIB.stow_torch_record_stream(0x1234, 0x20)
        free(0x1234)
        free(p)
        self.assertEqual(stowage.memory_allocated(), 0)

    def test_record_tags_and_dump_trace(self):
        free(malloc(4096))  # creates device 0's pool
        with self.assertRaises(OSError):
            stowage.dump_trace("/tmp/never-written.rep")  # not recording yet
        stowage.record(1000, lines=False)  # the thread's tags alone (lines: test_record_lines)
        stowage.set_tag("weights")
        p = malloc(3 * MiB)
        stowage.set_tag(None)
        q = malloc(1000)
        free(q)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "run.rep")
            stowage.dump_trace(path)
            with open(path) as f:
                lines = [l.split() for l in f if not l.startswith("#")]
            self.assertEqual(lines[0], ["2", "3"])
            self.assertEqual(lines[1], ["a", "0", str(3 * MiB), "0"])
            self.assertEqual(lines[3], ["f", "1"])
            with open(path + ".tags") as f:
                self.assertEqual(f.read(), "0 weights\n")
        free(p)
        stowage.record(0)
        with self.assertRaises(ValueError):
            stowage.set_tag("x" * 100)
        with self.assertRaises(ValueError):  # the tags file holds one tag a line
            stowage.set_tag("two\nlines")

    def test_step_markers_and_planned_blocks(self):
        import stowage.torch as st
        st.step("train")  # no pool yet: nothing to mark, no error
        free(malloc(4096))  # creates device 0's pool
        stowage.record(1000)
        st.step("train")
        p = malloc(MiB)
        free(p)
        with self.assertRaises(ValueError):
            st.step("has space")
        with self.assertRaises(ValueError):
            st.step("k" * 65)
        with self.assertRaises(ValueError):
            with st.planned("resnet50-bs64"):
                q = malloc(2 * MiB)
                free(q)
                raise ValueError("the block is left by an exception: the step still ends")
        st.step(None)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "run.rep")
            stowage.dump_trace(path)
            with open(path) as f:
                lines = [l.split() for l in f if not l.startswith("#")]
        self.assertEqual([l for l in lines if l[0] in "me"],
                         [["m", "train"], ["m", "resnet50-bs64"], ["e"], ["e"]])
        self.assertEqual(lines[0], ["2", "4"], "markers are not counted as events")
        stowage.record(0)

    def test_raw_pool_handle(self):
        self.assertIsNone(LIB.stow_torch_pool(0))
        free(malloc(4096))
        pool = LIB.stow_torch_pool(0)
        self.assertTrue(pool)
        self.assertGreater(stowage._lib.call_text(LIB.stow_summary, pool).count("\n"), 3)


class FakeTorch:
    """Just enough of torch for enable(): records what it is given."""

    def __init__(self, initialized=False, hooks=True):
        self.calls = []
        fake = self

        class Inner:
            pass

        if hooks:
            for name in ("set_reset_fn", "set_record_stream_fn", "set_memory_fraction_fn"):
                setattr(Inner, name, (lambda n: lambda self, addr: fake.calls.append((n, addr)))(name))

        class Plug:
            def __init__(self, path, alloc_name, free_name):
                fake.calls.append(("plug", path, alloc_name, free_name))
                self._inner = Inner()

            def allocator(self):
                return self._inner

        memory = types.SimpleNamespace(
            CUDAPluggableAllocator=Plug,
            change_current_allocator=lambda a: fake.calls.append(("change", a)))
        self.module = types.ModuleType("torch")
        self.module.cuda = types.SimpleNamespace(
            is_initialized=lambda: initialized, memory=memory, current_device=lambda: 0)


class EnableTest(Base):
    def setUp(self):
        super().setUp()
        import stowage.torch as st
        st._installed = None
        self.st = st
        self.saved = sys.modules.get("torch")

    def tearDown(self):
        self.st._installed = None
        if self.saved is None:
            sys.modules.pop("torch", None)
        else:
            sys.modules["torch"] = self.saved
        super().tearDown()

    def test_enable_refuses_the_simulated_backend(self):
        with self.assertRaises(RuntimeError):
            self.st.enable()

    def test_enable_wires_allocator_and_hooks(self):
        os.environ.pop("STOWAGE_BACKEND")
        fake = FakeTorch()
        sys.modules["torch"] = fake.module
        plug = self.st.enable("max_split_size_mb:128")
        self.assertEqual(os.environ["STOWAGE_CONF"], "max_split_size_mb:128")
        kinds = [c[0] for c in fake.calls]
        self.assertEqual(kinds[0], "plug")
        self.assertEqual(fake.calls[0][1:], (stowage.library_path(), "stow_torch_malloc",
                                             "stow_torch_free"))
        hooks = dict(c for c in fake.calls if c[0].startswith("set_"))
        want = {
            "set_reset_fn": LIB.stow_torch_empty_cache,
            "set_record_stream_fn": LIB.stow_torch_record_stream,
            "set_memory_fraction_fn": LIB.stow_torch_memory_fraction,
        }
        for k, fn in want.items():
            self.assertEqual(hooks[k], ctypes.cast(fn, ctypes.c_void_p).value)
        self.assertEqual(kinds[-1], "change")
        self.assertIs(fake.calls[-1][1], plug)
        self.assertTrue(self.st.enabled())
        self.assertIs(self.st.enable(), plug)  # idempotent

    def test_enable_after_cuda_init_is_a_clear_error(self):
        os.environ.pop("STOWAGE_BACKEND")
        fake = FakeTorch(initialized=True)
        sys.modules["torch"] = fake.module
        with self.assertRaisesRegex(RuntimeError, "before CUDA is initialised"):
            self.st.enable()
        self.assertEqual(fake.calls, [])

    def test_enable_rejects_bad_conf_before_touching_torch(self):
        os.environ.pop("STOWAGE_BACKEND")
        fake = FakeTorch()
        sys.modules["torch"] = fake.module
        with self.assertRaises(ValueError):
            self.st.enable("no_such_key:1")
        self.assertEqual(fake.calls, [])

    def test_enable_warns_when_hooks_are_missing(self):
        os.environ.pop("STOWAGE_BACKEND")
        fake = FakeTorch(hooks=False)
        sys.modules["torch"] = fake.module
        with self.assertWarns(RuntimeWarning):
            self.st.enable()


if __name__ == "__main__":
    unittest.main()
