#!/usr/bin/env python3
"""bench/random_loops.py: training-loop-shaped traces from random step programs (seeded).

    python3 bench/random_loops.py OUTDIR [--seeds 0:40] [--steps 400]

Each seed draws one step program: 6-12 slots, each with a size of 1-300 MiB (plus 0, 0.5 or 1.5
MiB), and 40-80 entries, each allocating its slot's size or, when the slot holds a block,
freeing it; then 5-20 blocks of 24, 40 or 64 MiB that stay (the weights). The trace allocates
the weights, then runs the step --steps times; what a step leaves allocated is freed, oldest
first, before the next. Written as OUTDIR/rSEED.rep, one per seed (docs/trace_format.md).

docs/design.md (adaptive allowance) replays them with
`build/vmm_churn --replays 1 --parts 8 OUTDIR/r*.rep`: a page-mapped pool that still maps or
unmaps in the last eighth of the run remaps on every step.
"""
import argparse
import os
import random
import sys

MIB = 1 << 20


def trace_lines(seed, steps):
    """The .rep lines (header first) of seed's loop of `steps` steps."""
    rng = random.Random(seed)
    slots = rng.randint(6, 12)
    sizes = [rng.choice([1, 2, 3, 6, 16, 40, 96, 130, 200, 256, 300]) * MIB
             + rng.choice([0, 512 * 1024, 1536 * 1024]) for _ in range(slots)]
    program = [rng.randrange(slots) for _ in range(rng.randint(40, 80))]
    weights = [rng.choice([24, 40, 64]) * MIB for _ in range(rng.randint(5, 20))]
    lines, next_id = [], 0
    for size in weights:
        lines.append("a %d %d 0" % (next_id, size))
        next_id += 1
    for _ in range(steps):
        held = {}  # slot -> id, in allocation order
        for slot in program:
            if slot in held:
                lines.append("f %d" % held.pop(slot))
            else:
                held[slot] = next_id
                lines.append("a %d %d 0" % (next_id, sizes[slot]))
                next_id += 1
        lines.extend("f %d" % i for i in held.values())
    return ["%d %d" % (next_id, len(lines))] + lines


def seed_range(text):
    lo, sep, hi = text.partition(":")
    try:
        lo, hi = int(lo), int(hi) if sep else int(lo) + 1
    except ValueError:
        raise argparse.ArgumentTypeError("'%s' is not FIRST:END (END excluded)" % text)
    if not 0 <= lo < hi:
        raise argparse.ArgumentTypeError("'%s': no seed in it" % text)
    return range(lo, hi)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--seeds", type=seed_range, default=range(0, 40),
                    help="FIRST:END, END excluded (default 0:40)")
    ap.add_argument("--steps", type=int, default=400)
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps: at least 1, not %d" % args.steps)
    os.makedirs(args.outdir, exist_ok=True)
    for seed in args.seeds:
        with open(os.path.join(args.outdir, "r%d.rep" % seed), "w") as f:
            f.write("\n".join(trace_lines(seed, args.steps)) + "\n")
    print("wrote %d traces to %s" % (len(args.seeds), args.outdir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
