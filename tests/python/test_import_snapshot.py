"""Tests of python/stowage_import_snapshot.py on snapshot-shaped pickles built here."""

import os
import pickle
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "python", "stowage_import_snapshot.py")
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)

from script_runner import run_on_file  # noqa: E402

import stowage_import_snapshot as imp  # noqa: E402


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
        def outputs(d):
            out = os.path.join(d, "o.rep")
            text = open(out).read() if os.path.exists(out) else None
            tags = open(out + ".tags").read() if os.path.exists(out + ".tags") else None
            return text, tags

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

    def test_picks_busiest_device(self):
        s = {"segments": [], "device_traces": [[], [entry("alloc", 1, 5)]]}
        p, text, _ = self.run_script(pickle.dumps(s))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(text, "1 1\na 0 5 0\n")


if __name__ == "__main__":
    unittest.main()
