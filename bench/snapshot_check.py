#!/usr/bin/env python3
"""bench/snapshot_check.py: the PyTorch models against PyTorch itself, from memory snapshots.

    python3 bench/snapshot_check.py SNAPSHOT.pickle[.gz]... [--stowage build/stowage]
                                    [--write DIR] [--tolerance 0.01]
                                    [--workloads DIR [--iterations N]]

A snapshot written by torch.cuda.memory._dump_snapshot() holds, beside the requests, what
PyTorch's own allocator did with them: its 'segment_alloc' / 'segment_free' entries are its
cudaMalloc / cudaFree calls ('segment_map' / 'segment_unmap' with expandable segments), and its
'segments' list is its cache at the end. So a snapshot recorded by anyone, on any GPU and
PyTorch version, checks the models without a GPU here: the same requests are replayed under
`pytorch` (or `pytorch-expandable`) with `stowage replay --json`, and the model's reserved peak
and number of cudaMalloc calls are compared with PyTorch's.

Most snapshots start after the model was built (its weights allocated before recording began):
the cache already held segments with live blocks. For native segments the check rebuilds that
state: the final 'segments' list, rewound through the trace (what the trace created is removed,
what it freed without having created it is added back). A prefix of requests then gives the
model the same segments: all reserved whole, in ascending address order; then one at a time
freed and cut again into its blocks and free spaces in address order (free space held by
placeholders, freed when the prefix ends). The trace follows; frees of blocks alive at the start
free their prefix blocks. Expandable segments are compared only when the trace starts from an
empty cache.

The entries compared run from the first one after any cudaFree calls that open the trace (an
empty_cache() as recording began) to the first later cudaFree or unmap (an empty_cache() or an
out-of-memory retry, which depend on the device), or to the end. Within them, the PyTorch peak
is the reserved memory at the start plus the largest growth.

Best fit takes the smallest free block that fits and, among equal ones, the lowest address. The
addresses are cudaMalloc's; the model hands out growing ones, so where PyTorch took a block of
the best size that the model would not (a later segment at a lower address), the model may part
from it from there on. The check follows PyTorch's cache through the trace to count such
placements, and any that were not best fit at all.

With --workloads, each device trace's requests are also written as a .rep from an empty device
(the blocks alive when recording began allocated first), for any policy
(bench/snapshot_heldout.sh); --iterations N repeats the recorded requests N times, as a loop.

Prints one Markdown row per device trace, then what was not comparable and why, a summary line,
and how many of PyTorch's placements best fit explains. Exits 1 when a trace differs (peak beyond
the tolerance, or another number of cudaMalloc calls) for a reason other than such ties, 2 when
a file is not a readable snapshot (its name and the reason on stderr), 0 otherwise.
"""
import argparse
import bisect
import gzip
import json
import os
import pickle
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

from stowage import snapshot_import as importer  # noqa: E402  (its refusing unpickler)

SMALL_SEGMENT = 2 << 20   # PyTorch's kSmallBuffer: every small-pool segment
SMALL_REQUEST = 1 << 20   # kSmallSize: requests up to this go to the small pool
MIN_BLOCK = 512           # kMinBlockSize: block sizes and addresses are multiples of it
RELEASES = ("segment_free", "segment_unmap")
GROWTH = ("segment_alloc", "segment_map")


class Unusable(Exception):
    """The trace cannot be compared; the message says why."""


def round_block(size):
    """The block PyTorch cuts for a request (round_size: 512-byte multiples, at least 512)."""
    return max(MIN_BLOCK, (size + MIN_BLOCK - 1) // MIN_BLOCK * MIN_BLOCK)


def window(entries):
    """(start, stop): entries [start, stop) hold no cudaFree; start skips opening ones."""
    start = 0
    while start < len(entries) and entries[start].get("action") in RELEASES + ("snapshot",):
        start += 1
    stop = start
    while stop < len(entries) and entries[stop].get("action") not in RELEASES:
        stop += 1
    return start, stop


def frees_used(entries):
    """'free_completed' when the trace has completions (the memory is reusable only then)."""
    if any(e.get("action") == "free_completed" for e in entries):
        return "free_completed"
    return "free_requested"


def state_at(snap, device, entries, start, requested=None):
    """Segments alive at entry `start`: {base: [size, stream, {addr: block size}]} (live blocks).

    The final 'segments' list, rewound through the trace: what the trace created is removed,
    what it destroyed without creating it is added back. `requested`, when given, receives
    {addr: requested bytes} of the blocks.
    """
    if requested is None:
        requested = {}
    free_kind = frees_used(entries)
    segs = Segments()
    for s in snap.get("segments") or []:
        if not isinstance(s, dict) or s.get("device", device) != device:
            continue
        if s.get("is_expandable"):
            raise Unusable("expandable segments")
        if tuple(s.get("segment_pool_id") or (0, 0)) != (0, 0):
            raise Unusable("a CUDA-graph private pool")
        base, size = s.get("address"), s.get("total_size")
        if not (importer._is_int(base) and importer._is_int(size)):
            raise Unusable("a segment without an integer address and size")
        blocks, at = {}, base
        for b in s.get("blocks") or []:
            addr = b.get("address", at)  # older snapshots list blocks in order, unaddressed
            at = addr + b["size"]
            if b.get("state") in ("active_allocated", "active_pending_free"):
                blocks[addr] = b["size"]
                requested[addr] = b.get("requested_size") or b["size"]
        segs[base] = [size, s.get("stream", 0), blocks]
    # Rewind: walk the trace backwards, undoing each entry.
    for e in reversed(entries):
        act, addr = e.get("action"), e.get("addr")
        if act in GROWTH:
            if addr not in segs:
                raise Unusable("entry creates a segment the final state lacks (%#x)" % addr)
            del segs[addr]
        elif act in RELEASES:
            segs[addr] = [e.get("size"), e.get("stream", 0), {}]
        elif act == "alloc" and e.get("size", 0) > 0:
            owner = find_segment(segs, addr)
            if owner is not None:
                segs[owner][2].pop(addr, None)
        elif act == free_kind and e.get("size", 0) > 0:
            owner = find_segment(segs, addr)
            if owner is None:
                raise Unusable("a free at %#x outside every segment" % addr)
            segs[owner][2][addr] = round_block(e["size"])
            requested[addr] = e["size"]
    # Forward to `start`: the opening cudaFree calls.
    for e in entries[:start]:
        if e.get("action") in RELEASES:
            seg = segs.pop(e.get("addr"), None)
            if seg is None or seg[2]:
                raise Unusable("an opening cudaFree of a segment that is not idle")
    return segs


class Segments(dict):
    """base -> [size, ...]: a dict that also keeps its bases sorted, so that the segment holding
    an address is found in O(log n) (a snapshot may hold millions of entries and thousands of
    segments)."""

    def __init__(self):
        super().__init__()
        self.bases = []

    def __setitem__(self, base, seg):
        if base not in self:
            bisect.insort(self.bases, base)
        super().__setitem__(base, seg)

    def __delitem__(self, base):
        super().__delitem__(base)
        del self.bases[bisect.bisect_left(self.bases, base)]

    def pop(self, base, *default):
        if base in self:
            seg = self[base]
            del self[base]
            return seg
        if default:
            return default[0]
        raise KeyError(base)


def find_segment(segs, addr):
    """The base of the segment of segs (a Segments) holding addr, or None."""
    i = bisect.bisect_right(segs.bases, addr) - 1
    if i >= 0:
        base = segs.bases[i]
        if addr < base + segs[base][0]:
            return base
    return None


def segment_pieces(base, size, blocks):
    """[[start, length, key]] covering the segment in address order; key: the address a live
    block's frees use, None for free space."""
    pieces, at = [], base
    for addr in sorted(blocks):
        if addr < at or addr + blocks[addr] > base + size:
            raise Unusable("blocks overlap in the segment at %#x" % base)
        if addr > at:
            pieces.append([at, addr - at, None])
        pieces.append([addr, blocks[addr], addr])
        at = addr + blocks[addr]
    if at < base + size:
        pieces.append([at, base + size - at, None])
    return pieces


def attach_small_gaps(pieces):
    """Free space of at most 1 MiB in a large segment joins a neighbouring live block.

    It serves no request there (large-pool requests are over 1 MiB; a request of its size would
    go to the small pool), and it merges with that neighbour when the neighbour is freed, as the
    longer block does in the model.
    """
    out = []
    for p in pieces:
        if p[2] is None and p[1] <= SMALL_REQUEST and out and out[-1][2] is not None:
            out[-1][1] += p[1]
        elif p[2] is not None and out and out[-1][2] is None and out[-1][1] <= SMALL_REQUEST:
            out[-1][1] += p[1]
            out[-1][2] = p[2]
        else:
            out.append(list(p))
    return out


def lay_out(rep, segs):
    """Requests that leave the model holding `segs`; {address: id} of their live blocks.

    Every segment is first reserved whole, in descending address order (the model hands out
    addresses downward, so its segments keep PyTorch's address order and best fit breaks ties
    between equal blocks as PyTorch did).
    Then, one segment at a time, its whole block is freed, which leaves it the only free block
    of its pool, and requests cut it again into its blocks and free spaces in address order.
    """
    whole = {}
    for base in sorted(segs, reverse=True):
        size, stream, _ = segs[base]
        if size == SMALL_SEGMENT:
            whole[base] = [rep.alloc(SMALL_REQUEST, stream), rep.alloc(SMALL_REQUEST, stream)]
        elif size >= 10 << 20:
            whole[base] = [rep.alloc(size, stream)]  # 20 MiB for 1-10 MiB requests, else exact
        else:
            raise Unusable("a segment of %d bytes (PyTorch makes 2 MiB or at least 10 MiB)"
                           % size)
    live, later = {}, []
    for base in sorted(segs):
        size, stream, blocks = segs[base]
        if not blocks:
            later += whole[base]  # idle: freed with the placeholders, whole
            continue
        for i in whole[base]:
            rep.free(i)
        pieces = segment_pieces(base, size, blocks)
        if size != SMALL_SEGMENT:
            pieces = attach_small_gaps(pieces)
        for _, length, key in pieces:
            if size == SMALL_SEGMENT and length > SMALL_REQUEST:
                if key is not None:
                    raise Unusable("a live block over 1 MiB in a small segment")
                parts = [SMALL_REQUEST, length - SMALL_REQUEST]
            else:
                parts = [length]
            for part in parts:
                i = rep.alloc(part, stream)
                if key is None:
                    later.append(i)
                else:
                    live[key] = i
    for i in later:
        rep.free(i)
    return live


class Rep:
    """A .rep trace under construction."""

    def __init__(self):
        self.lines, self.ids, self.streams = [], 0, {}

    def stream(self, key):
        return self.streams.setdefault(key, len(self.streams))

    def alloc(self, size, stream_key):
        i = self.ids
        self.ids += 1
        self.lines.append("a %d %d %d" % (i, size, self.stream(stream_key)))
        return i

    def free(self, i):
        self.lines.append("f %d" % i)

    def write(self, path):
        with open(path, "w") as f:
            f.write("%d %d\n" % (self.ids, len(self.lines)))
            f.write("\n".join(self.lines) + "\n")


class Ties:
    """PyTorch's cache as the trace shows it, to see how its best fit broke ties.

    Best fit takes the smallest free block that fits and, among blocks of that size, the one at
    the lowest address. cudaMalloc's addresses are the driver's choice; the model hands out
    addresses downward, so between segments it breaks the same ties by age, the newest first.
    Where the trace took another block of the best size than the model would, the model is
    bound to part from it there (not an error of its rules); where it took a larger block than
    the best fit, PyTorch ran with a rule the model was not given (a setting such as
    max_split_size_mb). Segments must be added in the order the model reserved them.
    """

    def __init__(self):
        self.segs = Segments()  # base -> [size, stream, rank, {addr: block size}]
        self.runs = {}     # base -> [(size, addr)] of its free space
        self.index = {}    # (stream, small) -> {size: {(-rank, addr)}}: the model's order
        self.ties = self.not_best = self.not_lowest = self.placed = 0

    def add_segment(self, base, size, stream, blocks=None):
        self.segs[base] = [size, stream, len(self.segs), dict(blocks or {})]
        self._reindex(base)

    def _key(self, base):
        size, stream = self.segs[base][:2]
        return (stream, size == SMALL_SEGMENT)

    def _reindex(self, base):
        size, _, rank, blocks = self.segs[base]
        bysize = self.index.setdefault(self._key(base), {})
        for run in self.runs.get(base, []):
            bysize[run[0]].discard((-rank, run[1]))
            if not bysize[run[0]]:
                del bysize[run[0]]
        runs, at = [], base
        for a in sorted(blocks):
            if a > at:
                runs.append((a - at, at))
            at = max(at, a + blocks[a])
        if at < base + size:
            runs.append((base + size - at, at))
        self.runs[base] = runs
        for n, a in runs:
            bysize.setdefault(n, set()).add((-rank, a))

    def alloc(self, addr, request):
        base = find_segment(self.segs, addr)
        if base is None:
            return
        need = round_block(request)
        small = self.segs[base][0] == SMALL_SEGMENT
        bysize = self.index.get(self._key(base), {})
        fits = [n for n in bysize if n >= need]
        run = next((r for r in self.runs[base] if r[1] == addr), None)
        if fits and run is not None:
            best = min(fits)
            self.placed += 1
            if run[0] > best:
                self.not_best += 1
            elif min(a for _, a in bysize[best]) != addr:
                self.not_lowest += 1
            elif min(bysize[best])[1] != addr:
                self.ties += 1
        block = need
        if run is not None and not small and run[0] - need <= SMALL_REQUEST:
            block = run[0]  # too little left to split: the block keeps it
        self.segs[base][3][addr] = block
        self._reindex(base)

    def free(self, addr):
        base = find_segment(self.segs, addr)
        if base is not None and self.segs[base][3].pop(addr, None) is not None:
            self._reindex(base)


def map_range(mapped, addr, size):
    """mapped ([(start, length)], disjoint) with [addr, addr + size) added, touching ranges
    joined: a range grows page by page, and a block may span pages mapped at different times."""
    lo, hi, out = addr, addr + size, []
    for a, n in mapped:
        if a + n < lo or a > hi:
            out.append((a, n))
        else:
            lo, hi = min(lo, a), max(hi, a + n)
    out.append((lo, hi - lo))
    return out


def build_expandable(entries):
    """(rep, facts) for a trace with expandable segments, which must start from an empty cache.

    PyTorch maps pages into one growing range per stream and pool ('segment_map'); its reserved
    memory is what is mapped. The model maps pages one at a time, so only the peaks compare.
    """
    start, stop = window(entries)
    free_kind = frees_used(entries)
    mapped, rep, ids = [], Rep(), {}
    now = peak = 0
    for e in entries[start:stop]:
        act, addr, size = e.get("action"), e.get("addr"), e.get("size", 0)
        if act == "segment_map":
            mapped = map_range(mapped, addr, size)
            now += size
            peak = max(peak, now)
        elif act == "alloc" and size > 0:
            if not any(a <= addr and addr + size <= a + n for a, n in mapped):
                raise Unusable("expandable segments with memory mapped before the trace began")
            if addr in ids:
                raise Unusable("an alloc of a live address %#x" % addr)
            ids[addr] = rep.alloc(size, e.get("stream", 0))
        elif act == free_kind and size > 0 and addr in ids:
            rep.free(ids.pop(addr))
    facts = dict(start=start, stop=stop, entries=len(entries), prefix_segments=0, prefix_lines=0,
                 reserved0=0, real_peak=peak, real_mallocs=None, ties=0, not_best=0, placed=0,
                 policy="pytorch-expandable")
    return rep, facts


def build(snap, device, entries):
    """(rep, facts) for one device trace, or raises Unusable."""
    if any(e.get("action") in ("segment_map", "segment_unmap") for e in entries):
        return build_expandable(entries)
    start, stop = window(entries)
    segs = state_at(snap, device, entries, start)
    rep = Rep()
    live = lay_out(rep, segs)
    ties = Ties()
    for base in sorted(segs, reverse=True):  # the order lay_out reserved them in
        ties.add_segment(base, segs[base][0], segs[base][1], segs[base][2])
    prefix_segments, prefix_lines = len(segs), len(rep.lines)
    reserved0 = sum(s[0] for s in segs.values())
    free_kind = frees_used(entries)
    ids, grown, peak_growth, mallocs = {}, 0, 0, 0
    for e in entries[start:stop]:
        act, addr, size = e.get("action"), e.get("addr"), e.get("size", 0)
        if act == "segment_alloc":
            mallocs += 1
            grown += size
            peak_growth = max(peak_growth, grown)
            ties.add_segment(addr, size, e.get("stream", 0))
        elif act == "alloc" and size > 0:
            if addr in ids or addr in live:
                raise Unusable("an alloc of a live address %#x" % addr)
            ids[addr] = rep.alloc(size, e.get("stream", 0))
            ties.alloc(addr, size)
        elif act == free_kind and size > 0:
            if addr in ids:
                rep.free(ids.pop(addr))
            elif addr in live:
                rep.free(live.pop(addr))
            ties.free(addr)
    facts = dict(start=start, stop=stop, entries=len(entries), prefix_segments=prefix_segments,
                 prefix_lines=prefix_lines, reserved0=reserved0,
                 real_peak=reserved0 + peak_growth, real_mallocs=mallocs, ties=ties.ties,
                 not_best=ties.not_best + ties.not_lowest, placed=ties.placed, policy="pytorch")
    return rep, facts


def workload(snap, device, entries, iterations=1):
    """The requests of a device trace as a .rep from an empty device, for any policy.

    The blocks alive when recording began (rebuilt as above) are allocated first, in address
    order, then every request of the trace follows, past any cudaFree too: what the program
    asked for, without PyTorch's cache. Expandable traces only from an empty cache. With
    iterations > 1 the trace's requests run that many times, as a loop would run its step: the
    blocks alive at the start stay, and what an iteration leaves allocated is freed before the
    next one.
    """
    free_kind = frees_used(entries)
    rep, live = Rep(), {}
    if any(e.get("action") in ("segment_map", "segment_unmap") for e in entries):
        mapped = []
        for e in entries:
            if e.get("action") == "segment_map":
                mapped = map_range(mapped, e["addr"], e["size"])
            elif e.get("action") == "alloc" and not any(
                    a <= e["addr"] < a + n for a, n in mapped):
                raise Unusable("expandable segments with memory mapped before the trace began")
    else:
        requested = {}
        segs = state_at(snap, device, entries, 0, requested)
        for base in sorted(segs):
            stream, blocks = segs[base][1], segs[base][2]
            for addr in sorted(blocks):
                live[addr] = rep.alloc(requested.get(addr, blocks[addr]), stream)
    if not any(e.get("action") == "alloc" for e in entries):
        raise Unusable("no allocation in the trace")
    for it in range(iterations):
        if it:
            for addr in ours:  # oldest first
                rep.free(live.pop(addr))
        ours, requested_free = {}, set()  # ours: this iteration's live blocks, in order
        for e in entries:
            act, addr, size = e.get("action"), e.get("addr"), e.get("size", 0)
            if act == "alloc" and size > 0:
                if addr in live:
                    if addr not in requested_free:
                        raise Unusable("an alloc of a live address %#x" % addr)
                    rep.free(live.pop(addr))  # its completion was not recorded
                requested_free.discard(addr)
                live[addr] = rep.alloc(size, e.get("stream", 0))
                ours[addr] = None
            elif act == free_kind and size > 0 and addr in live and (it == 0 or addr in ours):
                rep.free(live.pop(addr))
                ours.pop(addr, None)
            elif act == "free_requested":
                requested_free.add(addr)
    return rep


def replay(stowage, path, policy):
    run = subprocess.run([stowage, "replay", "--policy", policy, "--json", path],
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise Unusable("stowage replay exited %d: %s" % (run.returncode, run.stderr.strip()))
    for line in run.stdout.splitlines():
        if line.startswith("{"):
            return json.loads(line)
    raise Unusable("stowage replay printed no JSON")


def compare(args, out_dir, name, snap, device, entries):
    """One table row's cells and its verdict: 'exact', 'ties' or 'differs'; or Unusable."""
    if not all(isinstance(e, dict) for e in entries):
        raise Unusable("an entry that is not a dict")
    rep, facts = build(snap, device, entries)
    if not any(line.startswith("a ") for line in rep.lines[facts["prefix_lines"]:]):
        raise Unusable("no allocation in the entries compared")
    rep_path = os.path.join(out_dir, "%s.d%d.rep" % (name, device))
    rep.write(rep_path)
    row = replay(args.stowage, rep_path, facts["policy"])
    model_peak = row["peak_reserved_bytes"]
    err = model_peak / facts["real_peak"] - 1 if facts["real_peak"] else 0.0
    if facts["real_mallocs"] is None:
        mallocs, calls_agree = "(pages)", True
    else:
        model_mallocs = row["backend_calls"] - facts["prefix_segments"]
        mallocs = "%d / %d" % (facts["real_mallocs"], model_mallocs)
        calls_agree = model_mallocs == facts["real_mallocs"]
    if abs(err) <= args.tolerance and calls_agree:
        verdict = "exact" if err == 0 else "within"
    elif facts["ties"] and not facts["not_best"]:
        verdict = "ties"
    else:
        verdict = "differs"
    note = {"exact": "", "within": "", "differs": " **differs**",
            "ties": " (PyTorch broke %d best-fit ties by cudaMalloc address)" % facts["ties"]}
    if facts["not_best"]:
        note["differs"] += " (%d placements not best fit)" % facts["not_best"]
    cells = "| %s | %d | %s | %d of %d | %d | %d | %d | %+.3f%% | %s%s |" % (
        name, device, facts["policy"], facts["stop"] - facts["start"], facts["entries"],
        facts["prefix_segments"], facts["real_peak"], model_peak, 100 * err, mallocs,
        note[verdict])
    return cells, verdict, abs(err), facts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("snapshots", nargs="+")
    ap.add_argument("--stowage", default=os.path.join(HERE, "..", "build", "stowage"))
    ap.add_argument("--write", help="keep the .rep traces in this directory")
    ap.add_argument("--workloads", help="also write each trace's requests from an empty device "
                    "(NAME.dN.rep) to this directory, for any policy")
    ap.add_argument("--iterations", type=int, default=1,
                    help="in those workloads, run the trace's requests this many times")
    ap.add_argument("--tolerance", type=float, default=0.01)
    args = ap.parse_args(argv)
    if args.iterations < 1:
        ap.error("--iterations: at least 1, not %d" % args.iterations)
    if args.write:
        os.makedirs(args.write, exist_ok=True)
        return check_all(args, args.write)
    # Without --write the traces are scratch: removed however the check ends (they used
    # to be left behind, one directory per run).
    with tempfile.TemporaryDirectory(prefix="snapshot_check.") as out_dir:
        return check_all(args, out_dir)


def check_all(args, out_dir):
    print("| snapshot | device | model | entries compared | segments at start "
          "| PyTorch peak reserved | model | error | cudaMalloc PyTorch / model |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    verdicts = {"exact": 0, "within": 0, "ties": 0, "differs": 0}
    worst = 0.0
    placed = not_best = 0
    skipped = []
    bad_input = False
    for path in args.snapshots:
        try:
            with open(path, "rb") as f:
                data = f.read()
            if data[:2] == b"\x1f\x8b":  # gzip'ed (bench/gpu/record_unseen.py writes them so)
                data = gzip.decompress(data)
            snap = importer.load_snapshot(data)
        except (OSError, ValueError, pickle.UnpicklingError, EOFError) as exc:
            print("snapshot_check: %s: %s" % (path, exc), file=sys.stderr)
            bad_input = True
            continue
        name = os.path.basename(path)
        traces = [(d, t) for d, t in enumerate(snap["device_traces"]) if t]
        if not traces:
            skipped.append("%s: no trace entries (recorded without _record_memory_history)"
                           % name)
        for device, entries in traces:
            try:
                # The importer's checks of every entry (integer addresses, sizes in
                # [0, 2^62], integer streams, no alloc of a live address): a malformed
                # entry is named, and nothing of this trace is written or replayed.
                importer.convert(entries)
            except ValueError as exc:
                skipped.append("%s device %d: malformed (%s)" % (name, device, exc))
                continue
            if args.workloads:
                try:
                    os.makedirs(args.workloads, exist_ok=True)
                    workload(snap, device, entries, args.iterations).write(
                        os.path.join(args.workloads, "%s.d%d.rep" % (name, device)))
                except (Unusable, KeyError, TypeError, ValueError) as why:
                    skipped.append("%s device %d: no workload (%s)" % (name, device, why))
            try:
                cells, verdict, err, facts = compare(args, out_dir, name, snap, device, entries)
            except Unusable as why:
                skipped.append("%s device %d: %s" % (name, device, why))
                continue
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                skipped.append("%s device %d: malformed (%s: %s)" % (
                    name, device, type(exc).__name__, exc))
                continue
            print(cells)
            verdicts[verdict] += 1
            placed += facts["placed"]
            not_best += facts["not_best"]
            if verdict != "ties":
                worst = max(worst, err)
    for line in skipped:
        print("not compared: %s" % line)
    print("%d device traces compared: %d exact, %d within %g%%, %d apart where PyTorch broke "
          "best-fit ties by cudaMalloc address, %d differ (worst error otherwise %.3f%%); "
          "%d not comparable" % (
              sum(verdicts.values()), verdicts["exact"], verdicts["within"],
              100 * args.tolerance, verdicts["ties"], verdicts["differs"], 100 * worst,
              len(skipped)))
    print("PyTorch's own placements in the native traces: %d of %d as best fit predicts (the "
          "smallest free block that fits, the lowest address among equal ones)"
          % (placed - not_best, placed))
    return 2 if bad_input else 1 if verdicts["differs"] else 0


if __name__ == "__main__":
    sys.exit(main())
