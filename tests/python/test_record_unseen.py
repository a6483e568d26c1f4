"""Tests of bench/gpu/record_unseen.py's trace writer, on device-trace events built here.

The recording itself needs a GPU (bench/gpu/run.sh, part 6); turning PyTorch's device trace into
a replay file does not, and the replay's stowage trace parser reads what it writes.
"""

import gzip
import importlib.util
import os
import pickle
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, HERE)

from script_runner import stowage_cli  # noqa: E402

spec = importlib.util.spec_from_file_location(
    "record_unseen", os.path.join(ROOT, "bench", "gpu", "record_unseen.py"))
record_unseen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(record_unseen)  # torch is imported only when a workload runs


EVENTS = [
    {"action": "segment_alloc", "addr": 0x7000, "size": 2 << 20, "stream": 0},
    {"action": "alloc", "addr": 0x7000, "size": 1024, "stream": 0},
    {"action": "alloc", "addr": 0x7400, "size": 4096, "stream": 0},
    {"action": "free_requested", "addr": 0x7000, "size": 1024, "stream": 0},
    {"action": "alloc", "addr": 0x9000, "size": 512, "stream": 77},   # a second stream
    {"action": "free_completed", "addr": 0x7000, "size": 1024, "stream": 0},
    {"action": "alloc", "addr": 0x7000, "size": 2048, "stream": 0},   # the address reused
    {"action": "free_completed", "addr": 0x9000, "size": 512, "stream": 77},
    {"action": "free_completed", "addr": 0xdead, "size": 8, "stream": 0},  # never allocated here
    {"action": "oom", "addr": 0, "size": 1 << 40, "stream": 0},
]


class WriteRep(unittest.TestCase):
    def test_allocs_and_completed_frees_with_dense_ids(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "w.rep")
            counts = record_unseen.write_rep(EVENTS, path)
            with open(path) as f:
                text = f.read()
        self.assertEqual(text, "4 6\n"
                               "a 0 1024 0\n"
                               "a 1 4096 0\n"
                               "a 2 512 1\n"
                               "f 0\n"
                               "a 3 2048 0\n"
                               "f 2\n")
        self.assertEqual(counts, dict(events=6, allocations=4, streams=2,
                                      trace_peak_live_bytes=4096 + 512 + 2048))

    def test_step_marks_go_before_the_first_event_at_or_after_them(self):
        timed = [dict(e, time_us=100 + 10 * i) for i, e in enumerate(EVENTS)]
        marks = [(95, "train"), (121, "train"), (200, "late")]  # before events 0, 3; none
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "w.rep")
            counts = record_unseen.write_rep(timed, path, marks)
            with open(path) as f:
                text = f.read()
        self.assertEqual(text, "4 6\n"
                               "m train\n"
                               "a 0 1024 0\n"
                               "a 1 4096 0\n"
                               "m train\n"
                               "a 2 512 1\n"
                               "f 0\n"
                               "a 3 2048 0\n"
                               "f 2\n")
        self.assertEqual(counts["events"], 6, "markers are not events")

    @unittest.skipIf(stowage_cli() is None, "no stowage CLI built")
    def test_the_replay_reads_it(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "w.rep")
            record_unseen.write_rep(EVENTS, path)
            p = subprocess.run([stowage_cli(), "replay", "--policy", "pytorch", "--json", path],
                               capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn('"peak_live_bytes": 6656', p.stdout)

    @unittest.skipIf(stowage_cli() is None, "no stowage CLI built")
    def test_the_snapshot_is_written_for_snapshot_check(self):
        mib = 1 << 20
        frames = [{"filename": "train.py", "line": 3, "name": "step"}]
        entries = [
            {"action": "segment_alloc", "addr": 0x10000000, "size": 20 * mib, "stream": 0},
            {"action": "alloc", "addr": 0x10000000, "size": 4 * mib, "stream": 0,
             "frames": frames, "time_us": 5},
            {"action": "alloc", "addr": 0x10400000, "size": 4 * mib, "stream": 0},
            {"action": "free_requested", "addr": 0x10000000, "size": 4 * mib, "stream": 0},
            {"action": "free_completed", "addr": 0x10000000, "size": 4 * mib, "stream": 0},
            {"action": "alloc", "addr": 0x10000000, "size": 2 * mib, "stream": 0}]
        block = {"address": 0x10000000, "size": 2 * mib, "requested_size": 2 * mib,
                 "state": "active_allocated", "frames": frames}
        snap = {"segments": [{"device": 0, "address": 0x10000000, "total_size": 20 * mib,
                              "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
                              "is_expandable": False, "frames": frames, "blocks": [block]}],
                "device_traces": [entries]}
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "w.pickle.gz")
            record_unseen.write_snapshot(snap, path)
            with gzip.open(path, "rb") as f:
                written = pickle.load(f)
            self.assertEqual(len(written["device_traces"][0]), 5, "free_requested left out")
            self.assertNotIn("frames", str(written))
            p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "snapshot_check.py"),
                                "--stowage", stowage_cli(), path], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("| w.pickle.gz | 0 | pytorch | 5 of 5 | 0 | %d | %d | +0.000%% | 1 / 1 |"
                      % (20 * mib, 20 * mib), p.stdout)

    def test_every_workload_is_listed_and_documented(self):
        self.assertGreaterEqual(len(record_unseen.WORKLOADS), 4)
        for name, fn in record_unseen.WORKLOADS.items():
            self.assertTrue(fn.__doc__, name)


if __name__ == "__main__":
    unittest.main()
