#!/usr/bin/env python3
"""bench/changed_steps.py: a trace with step markers, its steps changed (docs/planned.md).

    python3 bench/changed_steps.py IN.rep OUT.rep [--seed 0] [--rate 0.002] [--alternate KEY]
                                   [--streams 2]

From the fourth marker on, each event is changed with probability RATE (seeded):
an allocation and its free deleted; an extra request (0.5-64 MiB) inserted and freed
1-200 events later; a free moved 1-400 events later (a late free). With --alternate
KEY, every third step is marked KEY instead and its allocations are 3/4 of their size
(another phase of the loop: an evaluation step). With --streams 2, the allocations of
every other step go to stream 1. The trace stays valid: every free follows its
allocation, and what is live at the end stays live.
"""
import argparse
import random
import sys


def load(path):
    with open(path) as f:
        header = f.readline().split()
        lines = [l.split() for l in f if l.strip() and not l.startswith("#")]
    return int(header[0]), lines


def change(lines, next_id, rng, rate, alternate, streams):
    out, delayed, deleted, markers = [], [], set(), 0
    step_scale, step_stream = 1.0, None
    for ln in lines:
        while delayed and delayed[0][0] <= len(out):
            out.append(delayed.pop(0)[1])
        if ln[0] == "m":
            markers += 1
            step_scale, step_stream = 1.0, None
            key = ln[1]
            if alternate and markers > 3 and markers % 3 == 0:
                key, step_scale = alternate, 0.75
            if streams > 1 and markers % 2 == 0:
                step_stream = "1"
            out.append(["m", key])
            continue
        if ln[0] == "e":
            out.append(ln)
            continue
        changing = markers > 3 and rng.random() < rate
        if ln[0] == "a":
            if ln[1] in deleted:
                continue
            size = max(1, int(int(ln[2]) * step_scale))
            stream = step_stream if step_stream is not None else ln[3]
            if changing and rng.random() < 0.5:
                deleted.add(ln[1])
                continue
            out.append(["a", ln[1], str(size), stream])
            if changing:
                extra = next_id
                next_id += 1
                out.append(["a", str(extra), str(rng.randint(1, 128) * 512 * 1024), stream])
                delayed.append((len(out) + rng.randint(1, 200), ["f", str(extra)]))
                delayed.sort(key=lambda d: d[0])
        else:
            if ln[1] in deleted:
                deleted.discard(ln[1])
                continue
            if changing:
                delayed.append((len(out) + rng.randint(1, 400), ln))
                delayed.sort(key=lambda d: d[0])
                continue
            out.append(ln)
    out.extend(d[1] for d in delayed)
    return next_id, out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=float, default=0.002)
    ap.add_argument("--alternate", metavar="KEY")
    ap.add_argument("--streams", type=int, default=1, choices=(1, 2))
    args = ap.parse_args(argv)
    next_id, lines = load(args.src)
    next_id, out = change(lines, next_id, random.Random(args.seed), args.rate, args.alternate,
                          args.streams)
    events = sum(1 for l in out if l[0] in "af")
    with open(args.dst, "w") as f:
        f.write("%d %d\n" % (next_id, events))
        f.write("\n".join(" ".join(l) for l in out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
