#!/usr/bin/env python3
"""bench/mixed_traces.py: held-out traces made of two workloads sharing one pool.

Writes, for each pair of .rep traces of SRC (default ../shared/traces), one
trace whose events are those of both, interleaved in proportion to their
lengths: two models served by one process, or training beside evaluation.
With --chunk N the two take turns of about N events of the longer trace (and
the same fraction of the shorter one); N = 1 interleaves event by event.
--streams same keeps both on their own stream indices (every shared trace uses
stream 0: one stream, one set of free lists); separate moves the second
trace's streams past the first's, so the pool sees two streams. The second
trace's allocation ids follow the first's. Policies tuned on the shared traces
are checked on these as on the scaled ones (docs/benchmarks.md, held-out traces).

    python3 bench/mixed_traces.py OUT [--src DIR] [--pairs A+B,...]
                                      [--chunks 1,1000] [--streams same,separate]

Each output is OUT/A+B_cN_same.rep or OUT/A+B_cN_separate.rep; the paths are
printed one per line. Exit status: 0 ok, 2 bad arguments or a malformed trace
(FILE:LINE: reason).
"""
import argparse
import itertools
import os
import sys


class TraceError(Exception):
    pass


# The trace format's limits (docs/trace_format.md), which the mixed trace must keep too.
MAX_SIZE_BYTES = 1 << 62
MAX_STREAMS = 1 << 16
MAX_IDS = 1 << 32


def load(path):
    """(id_count, events) of the trace file at path (parse)."""
    try:
        with open(path) as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: cannot read: {e}")
    return parse(path, text)


def parse(path, text):
    """(id_count, events) of a trace's text: events as ('a', id, size, stream) or ('f', id).
    Errors name path and line."""
    lines = text.splitlines()
    if not lines:
        raise TraceError(f"{path}:1: empty trace: missing header '<ids> <events>'")
    head = lines[0].split()
    if len(head) != 2 or not all(x.isdigit() for x in head):
        raise TraceError(f"{path}:1: expected header '<ids> <events>'")
    id_count, event_count = int(head[0]), int(head[1])
    events = []
    for number, line in enumerate(lines[1:], start=2):
        f = line.split()
        if not f:
            continue
        if f[0] == "a" and len(f) == 4 and all(x.isdigit() for x in f[1:]):
            event = ("a", int(f[1]), int(f[2]), int(f[3]))
        elif f[0] == "f" and len(f) == 2 and f[1].isdigit():
            event = ("f", int(f[1]))
        else:
            raise TraceError(f"{path}:{number}: expected 'a ID SIZE STREAM' or 'f ID'")
        if event[1] >= id_count:
            raise TraceError(f"{path}:{number}: id {event[1]} not below the header's {id_count}")
        if event[0] == "a" and not 0 < event[2] <= MAX_SIZE_BYTES:
            raise TraceError(f"{path}:{number}: size {event[2]} is not in [1, 2^62]")
        if event[0] == "a" and event[3] >= MAX_STREAMS:
            raise TraceError(f"{path}:{number}: stream index {event[3]} too large")
        events.append(event)
    if len(events) != event_count:
        raise TraceError(f"{path}:1: header says {event_count} events, the file has {len(events)}")
    return id_count, events


def mix(a, b, chunk, separate):
    """The events of traces a and b ((id_count, events) each), interleaved."""
    ids_a, ev_a = a
    ids_b, ev_b = b
    stream_shift = 0
    if separate:
        stream_shift = 1 + max((e[3] for e in ev_a if e[0] == "a"), default=0)
    top_stream = max((e[3] for e in ev_b if e[0] == "a"), default=0) + stream_shift
    if ids_a + ids_b > MAX_IDS or top_stream >= MAX_STREAMS:
        raise TraceError(f"mixed_traces: the two traces together have {ids_a + ids_b} ids and "
                         f"stream index {top_stream}: more than a trace may hold")
    turns = max(1, max(len(ev_a), len(ev_b)) // chunk)
    out, i, j = [], 0, 0
    for k in range(1, turns + 1):
        end_a, end_b = len(ev_a) * k // turns, len(ev_b) * k // turns
        out.extend(ev_a[i:end_a])
        for e in ev_b[j:end_b]:
            out.append(("a", e[1] + ids_a, e[2], e[3] + stream_shift) if e[0] == "a"
                       else ("f", e[1] + ids_a))
        i, j = end_a, end_b
    return ids_a + ids_b, out


def write(path, id_count, events):
    with open(path, "w") as f:
        f.write(f"{id_count} {len(events)}\n")
        for e in events:
            f.write(f"a {e[1]} {e[2]} {e[3]}\n" if e[0] == "a" else f"f {e[1]}\n")


def parse_list(text, what, convert):
    try:
        values = [convert(x) for x in text.split(",") if x]
    except ValueError:
        values = []
    if not values:
        raise TraceError(f"mixed_traces: {what}: '{text}' is not a comma-separated list")
    return values


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--src", default=os.path.join(here, "..", "..", "shared", "traces"))
    ap.add_argument("--pairs", default="", help="A+B,... (trace names without .rep); "
                    "default every pair of SRC's traces")
    ap.add_argument("--chunks", default="1,1000")
    ap.add_argument("--streams", default="same,separate")
    args = ap.parse_args()
    try:
        chunks = parse_list(args.chunks, "--chunks", int)
        if any(c < 1 for c in chunks):
            raise TraceError("mixed_traces: --chunks must be at least 1")
        streams = parse_list(args.streams, "--streams", str)
        if any(s not in ("same", "separate") for s in streams):
            raise TraceError("mixed_traces: --streams takes same and/or separate")
        try:
            names = sorted(n[:-4] for n in os.listdir(args.src) if n.endswith(".rep"))
        except OSError as e:
            raise TraceError(f"mixed_traces: {args.src}: {e.strerror}")
        if args.pairs:
            pairs = [tuple(p.split("+")) for p in parse_list(args.pairs, "--pairs", str)]
            for p in pairs:
                if len(p) != 2 or not all(n in names for n in p):
                    raise TraceError(f"mixed_traces: --pairs: '{'+'.join(p)}' is not two "
                                     f"traces of {args.src}")
        else:
            pairs = list(itertools.combinations(names, 2))
        if not pairs:
            raise TraceError(f"mixed_traces: fewer than two .rep files in {args.src}")
        traces = {n: load(os.path.join(args.src, n + ".rep")) for p in pairs for n in p}
        os.makedirs(args.out, exist_ok=True)
        for (a, b), chunk, how in itertools.product(pairs, chunks, streams):
            id_count, events = mix(traces[a], traces[b], chunk, how == "separate")
            path = os.path.join(args.out, f"{a}+{b}_c{chunk}_{how}.rep")
            write(path, id_count, events)
            print(path)
    except TraceError as e:
        print(e, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
