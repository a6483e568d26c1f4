"""Tests of python/stowage/snapshot_import.py on snapshot-shaped pickles built here."""

import contextlib
import io
import os
import pickle
import random
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "python", "stowage", "snapshot_import.py")
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)

from script_runner import run_on_file  # noqa: E402
from test_stack_tags import ALLOCATOR, ENGINE, INTERPRETER, MODEL  # noqa: E402

from stowage import snapshot_import as imp  # noqa: E402


def entry(action, addr, size=0, stream=0, frames=None):
    return {"action": action, "addr": addr, "size": size, "stream": stream,
            "frames": frames or [], "time_us": 0}


def snapshot(entries):
    return {"segments": [], "device_traces": [entries]}


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


class ImportSnapshot(unittest.TestCase):
    def run_script(self, snap_bytes, *extra):
        def read(path):
            if not os.path.exists(path):
                return None
            with open(path) as f:
                return f.read()

        def outputs(d):
            out = os.path.join(d, "o.rep")
            return read(out), read(out + ".tags")

        p, (text, tags) = run_on_file(
            SCRIPT, "s.pickle", snap_bytes,
            lambda d, src: [src, "-o", os.path.join(d, "o.rep")] + list(extra), outputs)
        return p, text, tags

    def test_addr_reuse_dense_ids_free_completed(self):
        fr = [{"filename": "/x/torch/nn/f.py", "line": 1, "name": "inner"},
              {"filename": "train.py", "line": 42, "name": "step"}]
        s = snapshot([
            entry("segment_alloc", 0x1000, 1 << 21),
            entry("alloc", 0x1000, 512, frames=fr),
            entry("alloc", 0x1200, 1024, stream=7),
            entry("free_requested", 0x1000, 512),
            entry("free_completed", 0x1000, 512),
            entry("alloc", 0x1000, 256),          # reused address: new id 2
            entry("free_completed", 0x9999, 64),  # allocated before the buffer
            entry("oom", 0, 1 << 40),
        ])
        p, text, tags = self.run_script(pickle.dumps(s))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(text, "3 4\na 0 512 0\na 1 1024 1\nf 0\na 2 256 0\n")
        self.assertEqual(tags, "0 train.py:42 step\n")

    def test_tags_of_both_stack_shapes(self):
        # stacks="python" and stacks="all" (C++ frames first) name the same user line; the
        # autograd engine's thread names its node; no usable frame is '<unknown>'; no frames,
        # no tag (stowage/stack_tags.py).
        s = snapshot([
            entry("alloc", 0x1000, 512, frames=MODEL),
            entry("alloc", 0x2000, 1024, frames=ALLOCATOR + INTERPRETER + MODEL),
            entry("alloc", 0x3000, 2048, frames=ALLOCATOR + ENGINE),
            entry("alloc", 0x4000, 4096, frames=ALLOCATOR + INTERPRETER),
            entry("alloc", 0x5000, 8192),
        ])
        p, text, tags = self.run_script(pickle.dumps(s))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(text.splitlines()[0], "5 5")
        self.assertEqual(tags, "0 /home/u/proj/model.py:54 forward\n"
                               "1 /home/u/proj/model.py:54 forward\n"
                               "2 ??:0 torch::autograd::generated::BmmBackward0::apply("
                               "std::vector<at::Tensor, std::allocator<at::Tensor> >&&)\n"
                               "3 <unknown>\n")

    def test_free_requested_when_completed_absent(self):
        s = snapshot([entry("alloc", 16, 100), entry("free_requested", 16, 100),
                      entry("alloc", 16, 200)])
        events, _, counts = imp.convert(s["device_traces"][0])
        self.assertEqual(events, [("a", 0, 100, 0), ("f", 0), ("a", 1, 200, 0)])
        self.assertEqual(counts["free"], 1)

    def test_requested_then_reuse_before_completion(self):
        # completion exists elsewhere in the trace, so requested only marks pending
        s = snapshot([entry("alloc", 16, 100), entry("alloc", 32, 8),
                      entry("free_requested", 16, 100), entry("alloc", 16, 50),
                      entry("free_completed", 32, 8)])
        events, _, _ = imp.convert(s["device_traces"][0])
        self.assertEqual(events, [("a", 0, 100, 0), ("a", 1, 8, 0), ("f", 0),
                                  ("a", 2, 50, 0), ("f", 1)])

    def test_refuses_classes(self):
        p, text, _ = self.run_script(pickle.dumps({"device_traces": [[Evil()]]}))
        self.assertEqual(p.returncode, 2)
        self.assertIn("refusing", p.stderr)
        self.assertNotIn("pwned", p.stdout)
        self.assertIsNone(text)

    def test_not_a_snapshot(self):
        p, _, _ = self.run_script(pickle.dumps([1, 2, 3]))
        self.assertEqual(p.returncode, 2)
        self.assertIn("device_traces", p.stderr)

    def test_zero_byte_allocations_left_out(self):
        # The .rep format (and the trace parser) has no 0-byte allocation.
        s = snapshot([entry("alloc", 16, 0), entry("alloc", 32, 8), entry("free_completed", 16, 0),
                      entry("alloc", 16, 4)])
        events, _, counts = imp.convert(s["device_traces"][0])
        self.assertEqual(events, [("a", 0, 8, 0), ("a", 1, 4, 0)])
        self.assertEqual(counts["zero_size"], 1)
        with self.assertRaisesRegex(ValueError, "entry 1: alloc of live address 0x10"):
            imp.convert([entry("alloc", 16, 0), entry("alloc", 16, 4)])
        # Requested but not yet completed, the address comes back: no error, and the
        # late completion is neither a free nor an unknown one.
        events, _, counts = imp.convert([
            entry("alloc", 16, 0), entry("free_requested", 16, 0), entry("alloc", 16, 4),
            entry("free_completed", 16, 0), entry("free_completed", 16, 4)])
        self.assertEqual(events, [("a", 0, 4, 0), ("f", 0)])
        self.assertEqual((counts["zero_size"], counts["unknown_free"]), (1, 0))

    def test_malformed_fields_are_errors(self):
        cases = [
            ([entry("alloc", 16, 8, stream=[1])], "entry 0: alloc with a stream that is not"),
            ([entry("alloc", 16, 2 ** 64)], "entry 0: alloc without a size"),
            # the trace format's limit: a larger size would write a trace the parser refuses
            ([entry("alloc", 16, 2 ** 62 + 1)], r"entry 0: alloc without a size in \[0, 2\^62\]"),
            ([entry("alloc", True, 8)], "entry 0: alloc without an integer addr"),
            ([entry("alloc", 16, 8), entry("free_completed", [16])],
             "entry 1: free_completed without an integer addr"),
        ]
        for entries, want in cases:
            with self.assertRaisesRegex(ValueError, want):
                imp.convert(entries)
        with self.assertRaisesRegex(ValueError, "device 1: its trace is not a list"):
            imp.load_snapshot(pickle.dumps({"device_traces": [[], 5]}))
        with self.assertRaisesRegex(ValueError, "not a readable pickle: UnpicklingError: "):
            imp.load_snapshot(pickle.dumps({"device_traces": []})[:-3])

    def test_picks_busiest_device(self):
        s = {"segments": [], "device_traces": [[], [entry("alloc", 1, 5)]]}
        p, text, _ = self.run_script(pickle.dumps(s))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(text, "1 1\na 0 5 0\n")


def _trace_parser():
    """stow_trace_parse from libstowage.so, or None when the library is absent."""
    import ctypes
    try:
        import stowage._lib
        lib = stowage._lib.load()
    except Exception:  # noqa: BLE001 (no library: the caller skips with the reason)
        return None
    lib.stow_trace_parse.restype = ctypes.c_int
    lib.stow_trace_parse.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                                     ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p,
                                     ctypes.c_size_t]
    lib.stow_trace_free.restype = None
    lib.stow_trace_free.argtypes = [ctypes.c_void_p]

    def parse(text):
        out, err = ctypes.c_void_p(), ctypes.create_string_buffer(256)
        st = lib.stow_trace_parse(b"o.rep", text, len(text), ctypes.byref(out), err, 256)
        if st == 0:
            lib.stow_trace_free(out)
        return st, err.value.decode(errors="replace")
    return parse


class SnapshotFuzz(unittest.TestCase):
    """Malformed snapshots: the importer exits 2 with 'FILE: reason' or writes a
    trace that the C trace parser accepts; it never raises. Deterministic
    (seeded), a few thousand cases in a few seconds."""

    WEIRD = [0, -1, 1, 7, 2 ** 16, 2 ** 62, 2 ** 63, 2 ** 64, 2 ** 70, -2 ** 63, 1.5, float("nan"),
             True, None, "", "x", "\n", b"b", [], [1], {}, {"a": 1}, (1, 2)]
    ACTIONS = ["alloc", "free_requested", "free_completed", "segment_alloc", "oom", "snapshot",
               "bogus", 5, None]

    @classmethod
    def setUpClass(cls):
        parser = _trace_parser()
        cls.parse = staticmethod(parser or (lambda text: None))
        cls.have_parser = parser is not None

    def check(self, data, tmp, case):
        src, out = os.path.join(tmp, "s.pickle"), os.path.join(tmp, "o.rep")
        with open(src, "wb") as f:
            f.write(data)
        if os.path.exists(out):
            os.remove(out)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = imp.main([src, "-o", out])
        self.assertIn(rc, (0, 2), case)
        if rc == 2:
            # A line of its own: CPython may print an unraisable error of its
            # own first (a MemoryError inside the unpickler).
            self.assertIn("\n" + src + ": ", "\n" + err.getvalue(), case)
            self.assertFalse(os.path.exists(out), case)
            return
        if self.have_parser:
            with open(out, "rb") as f:
                st, msg = self.parse(f.read())
            self.assertEqual(st, 0, (case, msg))
        if os.path.exists(out + ".tags"):
            # '<id> <tag>' a line, as the tag reader wants: no NUL, no blank opening the tag
            with open(out + ".tags", "rb") as f:
                lines = f.read().split(b"\n")
            self.assertEqual(lines[-1], b"", case)
            for line in lines[:-1]:
                ident, _, tag = line.partition(b" ")
                self.assertTrue(ident.isdigit() and tag and tag[:1] not in b" \t\v\f\r"
                                and b"\0" not in tag, (case, line))
            os.remove(out + ".tags")

    def random_entry(self, rng):
        e = {"action": rng.choice(self.ACTIONS)}
        for key in ("addr", "size", "stream"):
            if rng.random() < 0.9:
                e[key] = rng.choice(self.WEIRD) if rng.random() < 0.3 else rng.randrange(4) * 512
        if rng.random() < 0.3:
            weird_frame = {k: rng.choice(self.WEIRD) for k in ("filename", "line", "name")
                           if rng.random() < 0.8}
            e["frames"] = rng.choice([[], [{"filename": "a.py", "line": 3, "name": "f"}],
                                      [rng.choice(self.WEIRD)], rng.choice(self.WEIRD),
                                      [weird_frame, {"filename": "b.py", "line": 1}]])
        return e

    def test_random_entries(self):
        rng = random.Random(1)
        with tempfile.TemporaryDirectory() as tmp:
            for case in range(1500):
                entries = [self.random_entry(rng) for _ in range(rng.randrange(12))]
                if rng.random() < 0.1:
                    entries.append(rng.choice(self.WEIRD))
                snap = {"segments": [], "device_traces": [entries]}
                if rng.random() < 0.1:
                    snap["device_traces"] = rng.choice(self.WEIRD + [[rng.choice(self.WEIRD)]])
                self.check(pickle.dumps(snap), tmp, case)

    def test_mutated_pickles(self):
        rng = random.Random(2)
        base = {"segments": [], "device_traces": [[
            entry("alloc", 512, 1024, 0, [{"filename": "m.py", "line": 1, "name": "g"}]),
            entry("alloc", 2048, 64, 7), entry("free_requested", 512, 1024),
            entry("free_completed", 512, 1024), entry("alloc", 512, 32, 7),
            entry("oom", 0), entry("free_completed", 2048, 64, 7)]]}
        with tempfile.TemporaryDirectory() as tmp:
            for case in range(1500):
                data = bytearray(pickle.dumps(base, protocol=rng.choice([2, 3, 4, 5])))
                for _ in range(rng.randrange(1, 4)):
                    i = rng.randrange(len(data))
                    op = rng.randrange(3)
                    if op == 0:
                        data[i] = rng.randrange(256)
                    elif op == 1:
                        del data[i]
                    else:
                        data.insert(i, rng.randrange(256))
                self.check(bytes(data), tmp, case)

    def test_the_trace_parser_is_there(self):
        # ctest sets STOWAGE_LIB: there the outputs must be checked by the C parser.
        if not os.environ.get("STOWAGE_LIB") and not self.have_parser:
            self.skipTest("libstowage.so not found (set STOWAGE_LIB): outputs checked for "
                          "exit status only")
        self.assertTrue(self.have_parser, "STOWAGE_LIB is set but stow_trace_parse did not load")


if __name__ == "__main__":
    unittest.main()
