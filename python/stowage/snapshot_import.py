#!/usr/bin/env python3
"""Convert a PyTorch memory snapshot to a Stowage .rep trace.

The snapshot is the pickle written by torch.cuda.memory._dump_snapshot(): a
dict with 'segments' and 'device_traces' (one list of trace entries per
device; each entry has 'action', 'addr', 'size', 'stream', 'frames', ...).

    python3 python/stowage/snapshot_import.py snapshot.pickle -o out.rep [--device N]

Only the standard library is used. The pickle is read with an Unpickler that
refuses every class, so a snapshot cannot run code: _dump_snapshot pickles
plain dicts, lists, strings and numbers, and anything else is an error.

Mapping (docs/report.md, "Importers"):
- 'alloc' gives a new dense id for its address; the id lives until the
  address's 'free_completed' (the memory may be reused), or its
  'free_requested' when the trace has no completion for it (the id is then
  freed at the next alloc of the address or at the end of the trace).
- Streams become dense indices in order of first use.
- Frees of addresses allocated before the ring buffer's first entry are
  skipped (counted); 'oom', 'segment_*' and 'snapshot' entries are counted
  and left out.
- When entries carry 'frames', OUT.rep.tags gets '<id> <file>:<line> <name>'
  of the frame that stowage/stack_tags.py picks (the user's code first; read by
  `stowage report` and `diff`).
"""

import argparse
import io
import os
import pickle
import sys

if not __package__:  # run as a script: the stowage package beside it, not an installed one
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from stowage.stack_tags import stack_tag  # noqa: E402


class RefusingUnpickler(pickle.Unpickler):
    """Loads plain containers only: any class or function is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(
            "snapshot references %r.%r: refusing to load classes" % (module, name))


def load_snapshot(data):
    """The snapshot dict from the pickle bytes `data`; ValueError if it is not one."""
    try:
        snap = RefusingUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # noqa: BLE001
        # A damaged pickle raises more than UnpicklingError (the pickle module
        # documents AttributeError, EOFError, ImportError, IndexError, ...).
        raise ValueError("not a readable pickle: %s: %s" % (type(exc).__name__, exc)) from exc
    if not isinstance(snap, dict) or "device_traces" not in snap:
        raise ValueError("not a memory snapshot: no 'device_traces' key")
    traces = snap["device_traces"]
    if not isinstance(traces, list):
        raise ValueError("'device_traces' is not a list")
    for d, t in enumerate(traces):
        if t is not None and not isinstance(t, list):
            raise ValueError("device %d: its trace is not a list" % d)
    return snap


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def convert(entries):
    """(events, tags, counts) for one device's trace entries.

    events: list of ('a', id, size, stream) and ('f', id); tags: {id: text}.
    """
    events, tags = [], {}
    counts = {"alloc": 0, "free": 0, "unknown_free": 0, "ignored": 0, "zero_size": 0}
    streams = {}
    live = {}          # addr -> id
    pending = {}       # addr -> id, free_requested but not completed
    zero = set()       # addresses of live 0-byte allocations: no event, nor for their frees
    zero_requested = set()  # 0-byte allocations whose free was requested, not yet completed
    #                         (their completion, of size 0, is absorbed even after the
    #                         address came back)
    completed = any(isinstance(e, dict) and e.get("action") == "free_completed"
                    for e in entries)
    next_id = 0
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or "action" not in e:
            raise ValueError("entry %d: not a trace entry" % i)
        act = e["action"]
        if act in ("alloc", "free_requested", "free_completed") and not _is_int(e.get("addr")):
            raise ValueError("entry %d: %s without an integer addr" % (i, act))
        if act == "alloc":
            addr, size, stream_key = e["addr"], e.get("size"), e.get("stream", 0)
            # 2^62: the largest size a .rep trace holds (STOW_TRACE_MAX_SIZE_BYTES).
            if not _is_int(size) or not 0 <= size <= 2 ** 62:
                raise ValueError("entry %d: alloc without a size in [0, 2^62]" % i)
            if not _is_int(stream_key):
                raise ValueError("entry %d: alloc with a stream that is not an integer" % i)
            if addr in pending:
                events.append(("f", pending.pop(addr)))
                counts["free"] += 1
            if addr in live or addr in zero:
                raise ValueError("entry %d: alloc of live address 0x%x" % (i, addr))
            if size == 0:
                # No memory, and the .rep format has no 0-byte allocation.
                zero.add(addr)
                counts["zero_size"] += 1
                continue
            if stream_key not in streams and len(streams) == 65536:
                raise ValueError("entry %d: more than 65536 streams" % i)
            stream = streams.setdefault(stream_key, len(streams))
            live[addr] = next_id
            events.append(("a", next_id, size, stream))
            t, _ = stack_tag(e.get("frames"))
            if t:
                tags[next_id] = t
            next_id += 1
            counts["alloc"] += 1
        elif act in ("free_requested", "free_completed"):
            addr = e["addr"]
            if addr in zero:
                # A 0-byte allocation holds nothing: its free ends it at once;
                # a completion still to come is absorbed below.
                zero.discard(addr)
                if act == "free_requested" and completed:
                    zero_requested.add(addr)
                continue
            if act == "free_completed" and addr in zero_requested and e.get("size") == 0:
                zero_requested.discard(addr)  # the late completion of a 0-byte one
                continue
            if act == "free_completed":
                if addr in live:
                    events.append(("f", live.pop(addr)))
                    counts["free"] += 1
                elif addr in pending:
                    events.append(("f", pending.pop(addr)))
                    counts["free"] += 1
                else:
                    counts["unknown_free"] += 1
            elif addr in live:
                if completed:
                    pending[addr] = live.pop(addr)
                else:
                    events.append(("f", live.pop(addr)))
                    counts["free"] += 1
            else:
                counts["unknown_free"] += 1
        else:
            counts["ignored"] += 1
    for addr in list(pending):
        events.append(("f", pending.pop(addr)))
        counts["free"] += 1
    return events, tags, counts


def write_rep(f, events):
    nids = sum(1 for e in events if e[0] == "a")
    f.write("%d %d\n" % (nids, len(events)))
    for e in events:
        if e[0] == "a":
            f.write("a %d %d %d\n" % (e[1], e[2], e[3]))
        else:
            f.write("f %d\n" % e[1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("snapshot")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--device", type=int, default=None,
                    help="device index (default: the one with the most entries)")
    args = ap.parse_args(argv)
    try:
        with open(args.snapshot, "rb") as f:
            snap = load_snapshot(f.read())
        traces = snap["device_traces"]
        if not traces:
            raise ValueError("no device traces")
        dev = args.device
        if dev is None:
            dev = max(range(len(traces)), key=lambda d: len(traces[d] or []))
        if not 0 <= dev < len(traces):
            raise ValueError("no device %d (%d in the snapshot)" % (dev, len(traces)))
        events, tags, counts = convert(traces[dev] or [])
    except (OSError, ValueError, pickle.UnpicklingError, EOFError) as exc:
        print("%s: %s" % (args.snapshot, exc), file=sys.stderr)
        return 2
    with open(args.output, "w") as f:
        write_rep(f, events)
    if tags:
        with open(args.output + ".tags", "w") as f:
            for i in sorted(tags):
                f.write("%d %s\n" % (i, tags[i]))  # one line each (stack_tag)
    print("wrote %s: device %d, %d allocations, %d frees, %d frees of earlier "
          "allocations skipped, %d allocations of 0 bytes and %d other entries left out%s"
          % (args.output, dev, counts["alloc"], counts["free"], counts["unknown_free"],
             counts["zero_size"], counts["ignored"],
             ", tags in %s.tags" % args.output if tags else ""),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
