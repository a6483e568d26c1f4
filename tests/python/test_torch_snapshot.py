"""stowage.torch.memory_snapshot / dump_snapshot (python/stowage/snapshot.py)
against the format of torch.cuda.memory._snapshot(), on the CPU.

The expectations come from real snapshots: the public ones of
bench/snapshots.txt, fetched into ../snapshots (bench/fetch_snapshots.py; the
tests that read them skip without them). From them:
  - the keys and value types of segments, blocks and trace entries
    (EXPECTED_*, checked against every sample here);
  - the invariants every sample holds: blocks tile their segment from its
    address; allocated_size, active_size and requested_size are sums over its
    blocks;
  - viewer_replay: what pytorch.org/memory_viz (torch/utils/viz/MemoryViz.js,
    "Allocator State History") does with a snapshot, written here from its
    description: start from the final segments and live blocks and walk the
    trace backwards; a free_requested must name a known block, a segment_alloc
    must be a segment of that moment, a segment_map must lie in one, and every
    block must lie in a segment. All the samples pass it; a snapshot it rejects
    draws wrongly or not at all.
Then Stowage's snapshots, of classic and page-mapped pools on the simulated
device, fed through the PyTorch entry points with recording on, must pass the
same checks, and round trip: dump_snapshot -> `python -m stowage import
pytorch` -> `stowage replay` gives back the allocations that were made and the
replay's peaks. What needs torch or a GPU (the real viewers, the MemPool route
under PyTorch) is in bench/gpu (torch_routes.py).
"""

import glob
import json
import os
import pickle
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ["STOWAGE_BACKEND"] = "sim"

import stowage  # noqa: E402
import stowage._lib  # noqa: E402
import stowage.snapshot  # noqa: E402
import stowage.torch  # noqa: E402
from stowage.snapshot_import import load_snapshot  # noqa: E402

SNAPSHOTS = os.environ.get("STOWAGE_SNAPSHOTS", os.path.join(ROOT, "..", "snapshots"))
BUILD = os.environ.get("STOWAGE_BUILD", os.path.join(ROOT, "build"))
MiB = 1 << 20

try:
    LIB = stowage._lib.load()
except stowage.LibraryNotFound as e:  # pragma: no cover
    raise unittest.SkipTest(str(e))

# What the public snapshots hold (checked against them in FormatOfSamples).
EXPECTED_SEGMENT = {"device": int, "address": int, "total_size": int, "allocated_size": int,
                    "active_size": int, "requested_size": int, "stream": int,
                    "segment_type": str, "segment_pool_id": tuple, "is_expandable": bool,
                    "frames": list, "blocks": list}
EXPECTED_BLOCK = {"address": int, "size": int, "requested_size": int, "state": str,
                  "frames": list}
EXPECTED_ENTRY = {"action": str, "addr": int, "size": int, "stream": int, "time_us": int,
                  "frames": list}
EXPECTED_FRAME = {"name": str, "filename": str, "line": int}
STATES = {"active_allocated", "active_pending_free", "inactive"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "oom", "snapshot"}


def sample_paths():
    return sorted(glob.glob(os.path.join(SNAPSHOTS, "*.pickle")))


# ---- the checks, shared by the samples and Stowage's snapshots ----

def check_keys(test, d, expected, where, optional=()):
    keys = set(d) - set(optional)
    test.assertEqual(keys, set(expected), "%s: keys" % where)
    for k, t in expected.items():
        test.assertIsInstance(d[k], t, "%s: %s" % (where, k))
        if t is int:
            test.assertNotIsInstance(d[k], bool, "%s: %s" % (where, k))


def check_invariants(test, snap, where):
    for i, seg in enumerate(snap["segments"]):
        at, alloc, active, req = seg["address"], 0, 0, 0
        for b in seg["blocks"]:
            if "address" in b:
                test.assertEqual(b["address"], at, "%s: segment %d: blocks do not tile it"
                                 % (where, i))
            at += b["size"]
            test.assertIn(b["state"], STATES)
            if b["state"] == "active_allocated":
                alloc += b["size"]
                req += b["requested_size"]
            if b["state"] != "inactive":
                active += b["size"]
        test.assertEqual(at - seg["address"], seg["total_size"], "%s: segment %d size" % (where, i))
        test.assertEqual(seg["allocated_size"], alloc, "%s: segment %d allocated_size" % (where, i))
        test.assertEqual(seg["active_size"], active, "%s: segment %d active_size" % (where, i))
        test.assertEqual(seg["requested_size"], req, "%s: segment %d requested_size" % (where, i))


class ViewerError(AssertionError):
    pass


def viewer_replay(snap, device):
    """Walks device's trace backwards from the final state as the memory_viz
    segment view does; raises ViewerError where it would fail. Returns the
    number of entries walked."""
    segs = [[s["address"], s["total_size"], s["stream"]]
            for s in snap["segments"] if s.get("device", 0) == device]
    blocks = {}
    for s in snap["segments"]:
        if s.get("device", 0) != device:
            continue
        at = s["address"]
        for b in s["blocks"]:
            if b["state"] in ("active_allocated", "active_pending_free"):
                blocks[at] = b["size"]
            at += b["size"]

    def inside(addr, size):
        return any(a <= addr and addr + size <= a + n for a, n, _ in segs)

    for addr, size in blocks.items():
        if not inside(addr, size):
            raise ViewerError("live block %#x outside every segment" % addr)
    trace = snap["device_traces"][device] if device < len(snap["device_traces"]) else []
    for i in range(len(trace) - 1, -1, -1):
        e = trace[i]
        act = e["action"]
        if act == "free_completed":
            blocks[e["addr"]] = e["size"]
            if not inside(e["addr"], e["size"]):
                raise ViewerError("entry %d: freed block %#x outside every segment" % (i, e["addr"]))
        elif act == "free_requested":
            if e["addr"] not in blocks:
                raise ViewerError("entry %d: free_requested of %#x, no such block" % (i, e["addr"]))
        elif act == "alloc":
            blocks.pop(e["addr"], None)
        elif act in ("segment_free", "segment_unmap"):
            segs.append([e["addr"], e["size"], e["stream"]])
            if act == "segment_unmap":  # merged with neighbours of its stream
                segs.sort()
                merged = []
                for s in segs:
                    if merged and merged[-1][0] + merged[-1][1] == s[0] and merged[-1][2] == s[2]:
                        merged[-1][1] += s[1]
                    else:
                        merged.append(s)
                segs = merged
        elif act == "segment_alloc":
            j = next((j for j, s in enumerate(segs) if s[0] == e["addr"]), None)
            if j is None:
                raise ViewerError("entry %d: segment_alloc of %#x, no such segment" % (i, e["addr"]))
            del segs[j]
        elif act == "segment_map":
            a, n = e["addr"], e["size"]
            j = next((j for j, s in enumerate(segs) if s[0] <= a and a + n <= s[0] + s[1]), None)
            if j is None:
                raise ViewerError("entry %d: segment_map of %#x in no segment" % (i, a))
            s = segs.pop(j)
            if s[0] < a:
                segs.append([s[0], a - s[0], s[2]])
            if a + n < s[0] + s[1]:
                segs.append([a + n, s[0] + s[1] - a - n, s[2]])
    return len(trace)


def check_format(test, snap, where):
    test.assertIsInstance(snap, dict)
    test.assertIn("segments", snap)
    test.assertIn("device_traces", snap)
    for i, seg in enumerate(snap["segments"]):
        check_keys(test, seg, EXPECTED_SEGMENT, "%s: segment %d" % (where, i))
        test.assertIn(seg["segment_type"], ("small", "large"))
        for j, b in enumerate(seg["blocks"]):
            check_keys(test, b, EXPECTED_BLOCK, "%s: segment %d block %d" % (where, i, j))
            for fr in b["frames"]:
                check_keys(test, fr, EXPECTED_FRAME, "%s: frame" % where)
    for d, trace in enumerate(snap["device_traces"]):
        for k, e in enumerate(trace):
            opt = ("device_free",) if e.get("action") == "oom" else ()
            check_keys(test, e, EXPECTED_ENTRY, "%s: device %d entry %d" % (where, d, k),
                       optional=opt + ("compile_context", "user_metadata"))
            test.assertIn(e["action"], ACTIONS)
            if e["action"] == "oom":
                test.assertIsInstance(e["device_free"], int)


@unittest.skipUnless(sample_paths(), "no public snapshots in %s (bench/fetch_snapshots.py)"
                     % SNAPSHOTS)
class FormatOfSamples(unittest.TestCase):
    """The expectations above hold for PyTorch's own snapshots."""

    def test_samples(self):
        keys_seen = {"segment": set(), "block": set(), "entry": set()}
        walked = 0
        for path in sample_paths():
            with open(path, "rb") as f:
                snap = load_snapshot(f.read())
            name = os.path.basename(path)
            check_invariants(self, snap, name)
            full = [s for s in snap["segments"] if "segment_pool_id" in s]
            for s in full:
                keys_seen["segment"] |= set(s)
                for b in s["blocks"]:
                    if "frames" in b:
                        keys_seen["block"] |= set(b)
            for t in snap["device_traces"]:
                for e in t or []:
                    if "time_us" in e:
                        keys_seen["entry"] |= set(e)
            for d in range(len(snap["device_traces"])):
                walked += viewer_replay(snap, d)
        self.assertEqual(keys_seen["segment"], set(EXPECTED_SEGMENT))
        self.assertEqual(keys_seen["block"], set(EXPECTED_BLOCK) | {"history"} & keys_seen["block"])
        self.assertTrue(set(EXPECTED_ENTRY) <= keys_seen["entry"])
        self.assertGreater(walked, 100000)


# ---- Stowage's snapshots ----

def malloc(size, device=0, stream=None):
    p = LIB.stow_torch_malloc(size, device, stream)
    assert p, stowage.last_error(device)
    return p


def free(ptr, device=0):
    LIB.stow_torch_free(ptr, 0, device, None)


def read_rep(path):
    with open(path) as f:
        lines = [l.split() for l in f if l.strip() and not l.startswith("#")]
    return [(l[0], int(l[1]), int(l[2]) if l[0] == "a" else 0, int(l[3]) if l[0] == "a" else 0)
            for l in lines[1:]]


def drive(trace_path, tags=("weights", "activations")):
    """Feeds a .rep trace through stow_torch_malloc/free on device 0 (one
    stream), tagging allocations in turn; returns the (kind, size) sequence,
    frees named by the index of their allocation."""
    ptrs, order, seq = {}, {}, []
    n_alloc = 0
    for kind, i, size, _stream in read_rep(trace_path):
        if kind == "a":
            stowage.set_tag(tags[n_alloc % len(tags)] if tags else None)
            ptrs[i] = malloc(size)
            order[i] = n_alloc
            seq.append(("a", size))
            n_alloc += 1
        else:
            free(ptrs.pop(i))
            seq.append(("f", order.pop(i)))
    stowage.set_tag(None)
    return seq


def sequence_of(rep_path):
    """The (kind, size) sequence of a .rep trace, frees named by their allocation's index."""
    order, seq, n = {}, [], 0
    for kind, i, size, _ in read_rep(rep_path):
        if kind == "a":
            order[i] = n
            n += 1
            seq.append(("a", size))
        else:
            seq.append(("f", order.pop(i)))
    return seq


def replay_json(rep_path):
    # The pool's settings of the test (STOWAGE_CONF) are not the replay's: it replays under classic.
    env = {k: v for k, v in os.environ.items() if k != "STOWAGE_CONF"}
    out = subprocess.run([os.path.join(BUILD, "stowage"), "replay", "--json", "--policy",
                          "classic", rep_path], capture_output=True, text=True, check=True,
                         env=env).stdout
    return json.loads(out.splitlines()[0])


class Base(unittest.TestCase):
    def setUp(self):
        os.environ["STOWAGE_BACKEND"] = "sim"
        os.environ.pop("STOWAGE_SIM_CAPACITY", None)
        os.environ.pop("STOWAGE_CONF", None)
        LIB.stow_torch_shutdown()

    def tearDown(self):
        stowage.set_tag(None)
        LIB.stow_torch_shutdown()
        os.environ.pop("STOWAGE_CONF", None)

    def check_snapshot(self, snap, where):
        check_format(self, snap, where)
        check_invariants(self, snap, where)
        for d in range(len(snap["device_traces"])):
            viewer_replay(snap, d)
        # And the pickle loads as a snapshot, with plain types only.
        load_snapshot(pickle.dumps(snap))


class StowageSnapshot(Base):
    TRACE = os.path.join(ROOT, "tests", "data", "report_steady.rep")

    def snapshot_after(self, conf, keep_live=True):
        if conf:
            os.environ["STOWAGE_CONF"] = conf
        malloc(512)  # the pool exists from the first allocation
        stowage.record(1 << 16)
        seq = drive(self.TRACE)
        live = [malloc(s) for s in (3000, 5 * MiB, 40 * MiB)] if keep_live else []
        return seq, live, stowage.torch.memory_snapshot()

    def check_pool(self, conf):
        seq, live, snap = self.snapshot_after(conf)
        self.check_snapshot(snap, conf or "default")
        # The default pool is page-mapped on the simulated device, which maps pages.
        paged = conf is None or "vmm" in conf
        stats = stowage.memory_stats(0)
        self.assertEqual(sum(s["allocated_size"] for s in snap["segments"]),
                         stats["allocated_bytes.all.current"])
        mapped = sum(s["total_size"] for s in snap["segments"])
        if paged:  # physical memory held unmapped is reserved too
            self.assertLessEqual(mapped, stats["reserved_bytes.all.current"])
        else:
            self.assertEqual(mapped, stats["reserved_bytes.all.current"])
        starts = {b["address"] for s in snap["segments"] for b in s["blocks"]
                  if b["state"] == "active_allocated"}
        for p in live:
            self.assertIn(p, starts)
        actions = {e["action"] for e in snap["device_traces"][0]}
        self.assertTrue({"alloc", "free_requested", "free_completed"} <= actions, actions)
        if paged:
            self.assertTrue(all(s["is_expandable"] for s in snap["segments"]))
            self.assertIn("segment_map", actions)
            self.assertNotIn("segment_alloc", actions)
        else:
            self.assertFalse(any(s["is_expandable"] for s in snap["segments"]))
            self.assertIn("segment_alloc", actions)
        tagged = [fr["name"] for s in snap["segments"] for b in s["blocks"] for fr in b["frames"]]
        self.assertIn("weights", tagged)
        times = [e["time_us"] for e in snap["device_traces"][0]]
        self.assertEqual(times, sorted(times))
        for p in live:
            free(p)
        return snap

    def test_classic_pool(self):
        self.check_pool("policy:classic")

    def test_default_pool(self):
        self.check_pool(None)

    def test_page_mapped_pool(self):
        self.check_pool("policy:vmm")

    def test_without_recording_the_trace_is_empty(self):
        p = malloc(4 * MiB)
        snap = stowage.torch.memory_snapshot()
        self.check_snapshot(snap, "unrecorded")
        self.assertEqual(snap["device_traces"], [[]])
        self.assertEqual(len(snap["segments"]), 1)
        free(p)

    def test_several_devices(self):
        a, b = malloc(4 * MiB, 0), malloc(4 * MiB, 2)
        snap = stowage.torch.memory_snapshot()
        self.check_snapshot(snap, "devices")
        self.assertEqual(sorted({s["device"] for s in snap["segments"]}), [0, 2])
        self.assertEqual(len(snap["device_traces"]), 3)
        self.assertEqual(len(stowage.torch.memory_snapshot(device=2)["segments"]), 1)
        free(a, 0)
        free(b, 2)

    def test_a_wrapped_ring_still_draws(self):
        malloc(512)
        stowage.record(300)  # far fewer events than the trace
        drive(self.TRACE)
        snap = stowage.torch.memory_snapshot()
        self.assertEqual(len(snap["device_traces"][0]), 300 + sum(
            1 for e in snap["device_traces"][0] if e["action"] == "free_completed"))
        self.check_snapshot(snap, "wrapped")

    def test_out_of_memory_entry(self):
        os.environ["STOWAGE_SIM_CAPACITY"] = "64M"
        malloc(512)
        stowage.record(1000)
        self.assertFalse(LIB.stow_torch_malloc(100 * MiB, 0, None))
        snap = stowage.torch.memory_snapshot()
        self.check_snapshot(snap, "oom")
        ooms = [e for e in snap["device_traces"][0] if e["action"] == "oom"]
        self.assertEqual(len(ooms), 1)
        self.assertEqual(ooms[0]["size"], 100 * MiB)
        report = stowage.torch.oom_report(0)
        self.assertIn("out of memory", report)
        self.assertIn("reserved peak", report)

    def test_the_checks_reject_a_broken_snapshot(self):
        # The checks can fail: the same snapshot less a segment, or with a
        # free of an unknown block, is refused.
        _, live, snap = self.snapshot_after(None)
        broken = pickle.loads(pickle.dumps(snap))
        big = max(broken["segments"], key=lambda s: s["allocated_size"])
        broken["segments"].remove(big)
        with self.assertRaises(ViewerError):
            viewer_replay(broken, 0)
        broken = pickle.loads(pickle.dumps(snap))
        broken["device_traces"][0].append({"action": "free_requested", "addr": 12345,
                                          "size": 512, "stream": 0, "time_us": 0, "frames": []})
        with self.assertRaises(ViewerError):
            viewer_replay(broken, 0)
        broken = pickle.loads(pickle.dumps(snap))
        broken["segments"][0]["blocks"][0]["size"] += 512
        with self.assertRaises(AssertionError):
            check_invariants(self, broken, "broken")
        for p in live:
            free(p)


@unittest.skipUnless(os.path.exists(os.path.join(BUILD, "stowage")), "no build/stowage")
class RoundTrip(Base):
    """dump_snapshot -> python -m stowage import pytorch -> stowage replay."""

    def round_trip(self, conf):
        if conf:
            os.environ["STOWAGE_CONF"] = conf
        trace = os.path.join(ROOT, "tests", "data", "report_leak.rep")
        malloc(512)
        stowage.record(1 << 16)
        seq = drive(trace)
        with tempfile.TemporaryDirectory() as tmp:
            pkl = stowage.torch.dump_snapshot(os.path.join(tmp, "stowage.pickle"))
            out = os.path.join(tmp, "back.rep")
            env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
            r = subprocess.run([sys.executable, "-m", "stowage", "import", "pytorch", pkl,
                                "-o", out], capture_output=True, text=True, env=env, cwd=tmp)
            self.assertEqual(r.returncode, 0, r.stderr)
            # The 512-byte allocation made before recording is not in the trace.
            self.assertEqual(sequence_of(out), seq)
            self.assertEqual(replay_json(out)["peak_live_bytes"],
                             replay_json(trace)["peak_live_bytes"])
            self.assertEqual(replay_json(out)["peak_reserved_bytes"],
                             replay_json(trace)["peak_reserved_bytes"])
            with open(out + ".tags") as f:
                self.assertIn("weights", f.read())

    def test_classic(self):
        self.round_trip(None)

    def test_page_mapped(self):
        self.round_trip("policy:vmm")


class MemPoolSlotSnapshot(Base):
    """A MemPool slot's pools (the C entry points, no torch) in the same format."""

    def test_slot_pool(self):
        lib = stowage.torch._bind_mem_pool(LIB)
        import ctypes
        slot = ctypes.c_int(-1)
        self.assertEqual(lib.stow_torch_mempool_open(b"policy:vmm", ctypes.byref(slot), None, 0), 0)
        k = slot.value
        m = getattr(LIB, "stow_torch_mempool_malloc_%d" % k)
        f = getattr(LIB, "stow_torch_mempool_free_%d" % k)
        m.restype, m.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        f.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        segs = [m(n, 0, None) for n in (2 * MiB, 20 * MiB, 2 * MiB)]
        self.assertTrue(all(segs))
        pool = lib.stow_torch_mempool_pool(k, 0)
        snap = stowage.snapshot.pools_snapshot({0: pool}, pool_id=(0, 7))
        self.check_snapshot(snap, "slot")
        self.assertEqual(sum(s["allocated_size"] for s in snap["segments"]), 24 * MiB)
        self.assertTrue(all(s["segment_pool_id"] == (0, 7) for s in snap["segments"]))
        for p in segs:
            f(p, 0, 0, None)
        self.assertEqual(stowage.snapshot.pools_snapshot({0: pool})["segments"], [])
        self.assertEqual(lib.stow_torch_mempool_close(k), 0)


if __name__ == "__main__":
    unittest.main()
