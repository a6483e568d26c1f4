"""Tests of bench/snapshot_check.py on snapshot-shaped pickles built here.

Each snapshot below is what PyTorch's allocator does on a few requests, worked out by hand from
its rules (requests of 1-10 MiB get 20 MiB segments, larger ones a segment of their size
rounded to 2 MiB; best fit; a large-pool block is split when over 1 MiB would remain), so the
model must agree with it exactly; the falsified ones claim a cudaMalloc PyTorch would not make.
"""

import contextlib
import io
import os
import pickle
import random
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from script_runner import stowage_cli  # noqa: E402

SCRIPT = os.path.join(HERE, "..", "..", "bench", "snapshot_check.py")
MiB = 1 << 20


def entry(action, addr, size, stream=0):
    return {"action": action, "addr": addr, "size": size, "stream": stream, "frames": [],
            "time_us": 0}


def alloc(addr, size):
    return entry("alloc", addr, size)


def free(addr, size):
    return [entry("free_requested", addr, size), entry("free_completed", addr, size)]


def segment(addr, size, blocks, kind="large"):
    """A 'segments' item; blocks: [(offset, size, allocated?)]."""
    return {"device": 0, "address": addr, "total_size": size, "stream": 0,
            "segment_type": kind, "segment_pool_id": (0, 0), "is_expandable": False,
            "blocks": [{"address": addr + off, "size": n, "requested_size": n,
                        "state": "active_allocated" if live else "inactive"}
                       for off, n, live in blocks]}


def snapshot(entries, segments):
    return {"segments": segments, "device_traces": [entries]}


X, Y, S, T = 0x50000000, 0x40000000, 0x20000000, 0x30000000

# From an empty cache: two 4 MiB requests share one 20 MiB segment; after the first is freed,
# a 2 MiB request takes its 4 MiB block (the best fit, not the 12 MiB remainder).
FROM_EMPTY = (
    [entry("segment_alloc", X, 20 * MiB), alloc(X, 4 * MiB), alloc(X + 4 * MiB, 4 * MiB)]
    + free(X, 4 * MiB) + [alloc(X, 2 * MiB)],
    [segment(X, 20 * MiB, [(0, 2 * MiB, True), (2 * MiB, 2 * MiB, False),
                           (4 * MiB, 4 * MiB, True), (8 * MiB, 12 * MiB, False)])])

# A cache that existed before recording began: S holds an 8 MiB block (weights) and 12 MiB
# free. A 6 MiB request fits that space; a 16 MiB one needs a segment (T); at the end the
# weights are freed too.
WARM = (
    [alloc(S + 8 * MiB, 6 * MiB)] + free(S + 8 * MiB, 6 * MiB)
    + [entry("segment_alloc", T, 16 * MiB), alloc(T, 16 * MiB)] + free(T, 16 * MiB)
    + free(S, 8 * MiB),
    [segment(S, 20 * MiB, [(0, 20 * MiB, False)]), segment(T, 16 * MiB, [(0, 16 * MiB, False)])])

# Best-fit ties broken by address: Y is reserved first, at a lower address than X. Both end up
# with a 16 MiB free block; PyTorch gives the next 16 MiB request Y's (the lower address), the
# model X's (its addresses go downward: the newer segment is lower). Freeing X's first block
# then leaves X idle for PyTorch, whose 20 MiB request takes it, while the model needs a third
# segment.
TIES = (
    [entry("segment_alloc", Y, 20 * MiB), alloc(Y, 4 * MiB), alloc(Y + 4 * MiB, 16 * MiB),
     entry("segment_alloc", X, 20 * MiB), alloc(X, 4 * MiB), alloc(X + 4 * MiB, 16 * MiB)]
    + free(Y + 4 * MiB, 16 * MiB) + free(X + 4 * MiB, 16 * MiB)
    + [alloc(Y + 4 * MiB, 16 * MiB)] + free(X, 4 * MiB) + [alloc(X, 20 * MiB)],
    [segment(X, 20 * MiB, [(0, 20 * MiB, True)]),
     segment(Y, 20 * MiB, [(0, 4 * MiB, True), (4 * MiB, 16 * MiB, True)])])


@unittest.skipIf(stowage_cli() is None, "no stowage CLI built")
class SnapshotCheck(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()

    def tearDown(self):
        for name in os.listdir(self.dir):
            os.remove(os.path.join(self.dir, name))
        os.rmdir(self.dir)

    def check(self, *snaps, raw=None):
        paths = []
        for i, snap in enumerate(snaps):
            path = os.path.join(self.dir, "s%d.pickle" % i)
            with open(path, "wb") as f:
                f.write(raw if raw is not None else pickle.dumps(snap))
            paths.append(path)
        return subprocess.run([sys.executable, SCRIPT, "--stowage", stowage_cli(), *paths],
                              capture_output=True, text=True)

    def row(self, p):
        return next(line for line in p.stdout.splitlines() if line.startswith("| s0.pickle"))

    def test_from_an_empty_cache_the_model_agrees(self):
        p = self.check(snapshot(*FROM_EMPTY))
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("| 6 of 6 | 0 | %d | %d | +0.000%% | 1 / 1 |" % (20 * MiB, 20 * MiB),
                      self.row(p))
        self.assertIn("1 exact", p.stdout)
        self.assertIn("placements in the native traces: 3 of 3 as best fit predicts", p.stdout)

    def test_a_cudamalloc_pytorch_would_not_make_is_caught(self):
        entries, segments = FROM_EMPTY
        # Claims the 2 MiB request needed a segment of its own.
        forged = entries[:-1] + [entry("segment_alloc", Y, 20 * MiB), alloc(Y, 2 * MiB)]
        segments = segments + [segment(Y, 20 * MiB, [(0, 2 * MiB, True),
                                                     (2 * MiB, 18 * MiB, False)])]
        p = self.check(snapshot(forged, segments))
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("| 2 / 1 **differs**", self.row(p))
        self.assertIn("1 differ", p.stdout)

    def test_a_cache_from_before_the_recording_is_rebuilt(self):
        p = self.check(snapshot(*WARM))
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        # The 20 MiB segment is there at the start; the 16 MiB one is the only cudaMalloc.
        self.assertIn("| 1 | %d | %d | +0.000%% | 1 / 1 |" % (36 * MiB, 36 * MiB), self.row(p))

    def test_a_placement_that_is_not_best_fit_is_caught(self):
        # The cache held 12 MiB free at S from before the recording: a trace claiming that the
        # 6 MiB request needed a segment of its own is not what best fit does.
        entries, segments = WARM
        forged = [entry("segment_alloc", Y, 20 * MiB), alloc(Y, 6 * MiB)] + free(Y, 6 * MiB) \
            + entries[3:]
        segments = segments + [segment(Y, 20 * MiB, [(0, 20 * MiB, False)])]
        p = self.check(snapshot(forged, segments))
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("| 2 / 1 **differs** (1 placements not best fit) |", self.row(p))

    def test_ties_broken_by_address_are_reported_not_failed(self):
        p = self.check(snapshot(*TIES))
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("| 2 / 3 (PyTorch broke 1 best-fit ties by cudaMalloc address) |",
                      self.row(p))
        self.assertIn("1 apart where PyTorch broke best-fit ties", p.stdout)

    def test_the_window_stops_at_a_cudafree(self):
        # An empty_cache() after the requests above, then a request that reserves again.
        entries, _ = FROM_EMPTY
        Z = 0x60000000
        later = free(X, 2 * MiB) + free(X + 4 * MiB, 4 * MiB) + [
            entry("segment_free", X, 20 * MiB), entry("segment_alloc", Z, 30 * MiB),
            alloc(Z, 30 * MiB)]
        p = self.check(snapshot(entries + later, [segment(Z, 30 * MiB, [(0, 30 * MiB, True)])]))
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("| 10 of 13 | 0 | %d | %d | +0.000%% | 1 / 1 |" % (20 * MiB, 20 * MiB),
                      self.row(p))

    def test_expandable_segments_from_an_empty_cache(self):
        base = 0x7000000000
        entries = [entry("segment_map", base, 20 * MiB), alloc(base, 4 * MiB),
                   alloc(base + 4 * MiB, 12 * MiB), entry("segment_map", base + 20 * MiB,
                                                         20 * MiB),
                   alloc(base + 16 * MiB, 8 * MiB)]
        snap = {"segments": [{"device": 0, "address": base, "total_size": 40 * MiB,
                              "stream": 0, "segment_type": "large", "is_expandable": True,
                              "blocks": []}], "device_traces": [entries]}
        p = self.check(snap)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("| pytorch-expandable | 5 of 5 | 0 | %d | %d | +0.000%% | (pages) |"
                      % (40 * MiB, 40 * MiB), self.row(p))

    def test_what_cannot_be_compared_says_why(self):
        no_trace = {"segments": [], "device_traces": [[]]}
        graph = snapshot([alloc(X, 4 * MiB)], [dict(segment(X, 20 * MiB, [(0, 4 * MiB, True)]),
                                                     segment_pool_id=(1, 2))])
        p = self.check(no_trace, graph)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("not compared: s0.pickle: no trace entries", p.stdout)
        self.assertIn("not compared: s1.pickle device 0: a CUDA-graph private pool", p.stdout)
        self.assertIn("0 device traces compared", p.stdout)

    def workload_lines(self, snap, iterations=1):
        """The lines of the workload --workloads writes for snap's device 0."""
        out = os.path.join(self.dir, "wl")
        path = os.path.join(self.dir, "s0.pickle")
        with open(path, "wb") as f:
            f.write(pickle.dumps(snap))
        p = subprocess.run([sys.executable, SCRIPT, "--stowage", stowage_cli(), "--workloads",
                            out, "--iterations", str(iterations), path],
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        rep = os.path.join(out, "s0.pickle.d0.rep")
        with open(rep) as f:
            lines = f.read().split("\n")
        os.remove(rep)
        os.rmdir(out)
        return lines

    def test_the_workload_starts_with_the_blocks_alive_before_recording(self):
        self.assertEqual(self.workload_lines(snapshot(*WARM)), [
            "3 6", "a 0 %d 0" % (8 * MiB), "a 1 %d 0" % (6 * MiB), "f 1",
            "a 2 %d 0" % (16 * MiB), "f 2", "f 0", ""])

    def test_a_workload_as_a_loop_keeps_the_blocks_alive_before_recording(self):
        # The weights (id 0) are freed in the first iteration only.
        self.assertEqual(self.workload_lines(snapshot(*WARM), 2), [
            "5 10", "a 0 %d 0" % (8 * MiB), "a 1 %d 0" % (6 * MiB), "f 1",
            "a 2 %d 0" % (16 * MiB), "f 2", "f 0", "a 3 %d 0" % (6 * MiB), "f 3",
            "a 4 %d 0" % (16 * MiB), "f 4", ""])
        # What an iteration leaves is freed, oldest first, before the next one.
        self.assertEqual(self.workload_lines(snapshot(*FROM_EMPTY), 2), [
            "6 10", "a 0 %d 0" % (4 * MiB), "a 1 %d 0" % (4 * MiB), "f 0",
            "a 2 %d 0" % (2 * MiB), "f 1", "f 2", "a 3 %d 0" % (4 * MiB),
            "a 4 %d 0" % (4 * MiB), "f 3", "a 5 %d 0" % (2 * MiB), ""])

    def test_a_malformed_entry_is_named_and_nothing_is_written(self):
        out = os.path.join(self.dir, "wl")
        huge = snapshot([entry("segment_alloc", X, 20 * MiB), alloc(X, 2 ** 70)], [])
        path = os.path.join(self.dir, "s0.pickle")
        with open(path, "wb") as f:
            f.write(pickle.dumps(huge))
        p = subprocess.run([sys.executable, SCRIPT, "--stowage", stowage_cli(), "--workloads",
                            out, path], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("not compared: s0.pickle device 0: malformed (entry 1: alloc without a "
                      "size in [0, 2^62])", p.stdout)
        self.assertFalse(os.path.exists(os.path.join(out, "s0.pickle.d0.rep")))

    def test_iterations_below_one_are_refused(self):
        p = subprocess.run([sys.executable, SCRIPT, "--iterations", "0", "x.pickle"],
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--iterations: at least 1", p.stderr)

    def test_a_file_that_is_not_a_snapshot_is_an_error(self):
        p = self.check(None, raw=b"not a pickle")
        self.assertEqual(p.returncode, 2)
        self.assertIn("s0.pickle: not a readable pickle", p.stderr)


@unittest.skipIf(stowage_cli() is None, "no stowage CLI built")
class SnapshotCheckRandom(unittest.TestCase):
    """Random and damaged snapshots: each is compared, or refused with a reason; the script
    never stops on a Python exception."""

    ACTIONS = ["alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
               "segment_map", "segment_unmap", "snapshot", "oom"]
    WEIRD = [None, -1, "x", 2 ** 70, [], {}, 1.5, True, (1, 2)]

    def value(self, rng, choices):
        return rng.choice(self.WEIRD) if rng.random() < 0.05 else rng.choice(choices)

    def random_snapshot(self, rng):
        bases = [X, Y, S]
        sizes = [512, MiB, 2 * MiB, 4 * MiB, 12 * MiB, 20 * MiB]
        entries = []
        for _ in range(rng.randrange(20)):
            base = rng.choice(bases)
            entries.append({"action": self.value(rng, self.ACTIONS),
                            "addr": self.value(rng, [base, base + rng.choice(sizes)]),
                            "size": self.value(rng, sizes),
                            "stream": self.value(rng, [0, 0, 7])})
        segments = []
        for base in bases[:rng.randrange(4)]:
            size = self.value(rng, [2 * MiB, 20 * MiB, 40 * MiB, 3 * MiB])
            blocks = [{"address": base, "size": self.value(rng, sizes),
                       "state": self.value(rng, ["active_allocated", "inactive"])}]
            segments.append({"device": 0, "address": base, "total_size": size,
                             "stream": 0, "segment_type": "large",
                             "is_expandable": self.value(rng, [False, False, True]),
                             "blocks": self.value(rng, [blocks, []])})
        return {"segments": segments, "device_traces": [entries]}

    def test_random_snapshots(self):
        sys.path.insert(0, os.path.dirname(SCRIPT))
        import snapshot_check
        rng = random.Random(3)
        with tempfile.TemporaryDirectory() as tmp:
            paths = []
            for case in range(400):
                path = os.path.join(tmp, "r%d.pickle" % case)
                with open(path, "wb") as f:
                    f.write(pickle.dumps(self.random_snapshot(rng)))
                paths.append(path)
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                rc = snapshot_check.main(paths + ["--stowage", stowage_cli(), "--write",
                                                  os.path.join(tmp, "reps"), "--workloads",
                                                  os.path.join(tmp, "wl")])
        self.assertIn(rc, (0, 1, 2))
        text = out.getvalue()
        compared = text.count("\n| r")
        refused = text.count("not compared: r")
        self.assertGreater(compared, 0, text[-2000:])
        self.assertGreater(refused, 0)
        self.assertNotIn("stowage replay exited", text)


FETCH = os.path.join(HERE, "..", "..", "bench", "fetch_snapshots.py")


class FetchSnapshots(unittest.TestCase):
    """bench/fetch_snapshots.py against a file:// tree laid out as raw.githubusercontent.com."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = os.path.join(self.tmp.name, "root")
        self.data = pickle.dumps(snapshot(*FROM_EMPTY))
        os.makedirs(os.path.join(self.root, "o", "r", "c0", "d"))
        with open(os.path.join(self.root, "o", "r", "c0", "d", "s.pickle"), "wb") as f:
            f.write(self.data)
        sys.path.insert(0, os.path.dirname(FETCH))
        import fetch_snapshots
        self.sha = fetch_snapshots.blob_sha1(self.data)

    def tearDown(self):
        self.tmp.cleanup()

    def fetch(self, lines):
        listing = os.path.join(self.tmp.name, "list.txt")
        with open(listing, "w") as f:
            f.write("# a comment\n" + "".join(line + "\n" for line in lines))
        out = os.path.join(self.tmp.name, "out")
        p = subprocess.run([sys.executable, FETCH, out, "--list", listing,
                            "--base", "file://" + self.root], capture_output=True, text=True)
        return p, out

    def test_a_file_is_fetched_and_checked(self):
        p, out = self.fetch(["o/r c0 d/s.pickle %s %d" % (self.sha, len(self.data))])
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(os.path.join(out, "o+r__d_s.pickle"), "rb") as f:
            self.assertEqual(f.read(), self.data)
        self.assertIn("1 of 1 snapshots", p.stdout)

    def test_a_file_with_other_bytes_is_refused(self):
        p, out = self.fetch(["o/r c0 d/s.pickle %s 1" % ("0" * 40)])
        self.assertEqual(p.returncode, 1)
        self.assertIn("expected " + "0" * 40, p.stderr)
        self.assertFalse(os.path.exists(os.path.join(out, "o+r__d_s.pickle")))

    def test_a_malformed_list_names_its_line(self):
        p, _ = self.fetch(["o/r c0 d/s.pickle"])
        self.assertEqual(p.returncode, 2)
        self.assertIn("list.txt:2: expected", p.stderr)


if __name__ == "__main__":
    unittest.main()
