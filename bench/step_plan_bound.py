#!/usr/bin/env python3
"""bench/step_plan_bound.py: what a layout learned from one step of a loop would reserve.

A page-mapped pool (policy vmm) stops remapping in a loop only once every granule the
step's blocks touch stays mapped: its steady reserved memory is the footprint of the
layout its online placement reached (docs/design.md, adaptive allowance). This asks what
a layout learned from the loop itself would reserve: each block of a steady step keeps
a fixed offset, the same in every step. Such a layout repeats by construction, so once
mapped it makes no backend call, and its physical memory is its height rounded up to
whole granules. This plans the blocks that stay with the step: a bound for a pool, which
must plan around them where they lie (vmm_learn_step does, docs/design.md).

The step: the period with which the trace repeats from its end back over at least half
its events and three periods (two events a period apart match as in bench/long_run.py: the same size and stream, or a free of the
allocation made as many events before); the step taken is the one MAX_STEPS + 1 steps
before the end, so that the frees of its blocks are in the trace.

Its blocks, on a cycle of the layout's period:
- blocks live when the step begins that the trace never frees (weights, optimizer
  state), and blocks of the step it never frees, live over the whole cycle;
- each block the step allocates lives from its allocation for as many events as it
  did in the trace. When one outlives the step (an input batch prefetched for the next
  step), copies from two steps are live at once and the layout repeats every 2 steps
  (or 3, 4), each copy in a slot of its own;
- sizes are rounded up to 512 bytes, as the pool rounds them.

Two layouts of that cycle, the lower height counts:
- "cut": the project's planner (`build/stowage plan`, --time-limit) on the cycle cut at
  one of the 64 phases where the step's own blocks hold the fewest bytes (the one whose
  problem has the lowest load bound); a block that crosses the cut is given the whole
  cycle, which overstates what it needs;
- "cyclic": first fit by decreasing size on the cycle itself, each block at the lowest
  offset where no block that overlaps it in time lies.

    python3 bench/step_plan_bound.py TRACE... [--time-limit SECONDS] [--granule-mib 2]

Prints per trace the period, the step's peak live bytes, the lower height, each layout's
height over the peak live, the lower one in whole granules over the peak live, and the
steps per layout cycle; then how many traces are within 1.01 x live. A trace whose end
does not repeat is reported and skipped; a malformed trace exits non-zero naming its
file, line and reason.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import long_run  # noqa: E402  (the same step finder as the long runs)

ROUND = 512
CUTS = 64
MAX_STEPS = 4  # the step is taken MAX_STEPS + 1 steps before the end


def rounded(size):
    return (size + ROUND - 1) // ROUND * ROUND


def find_step(sig):
    """(period, end of the trace): the smallest distance between two allocations of
    the largest size of the trace's second half with which the trace repeats from
    its end back over at least half its events and three periods: a loop is mostly
    its step, run on to its end. (long_run.find_step's search over every pair of
    those allocations is quadratic in the number of steps.)"""
    n = len(sig)
    # The largest size the second half of the trace allocates (the weights, the
    # largest blocks of many loops, are allocated once, before the steps).
    sizes = [s[1] for s in sig[n // 2:] if s[0] == "a"]
    if not sizes:
        return None
    biggest = max(sizes)
    at = [i for i, s in enumerate(sig) if s[0] == "a" and s[1] == biggest]
    for period in sorted({b - at[0] for b in at[1:]} | {at[-1] - a for a in at[:-1]}):
        if period < long_run.MIN_PERIOD or 3 * period > n:
            continue
        i = n - 1
        while i >= period and sig[i] == sig[i - period]:
            i -= 1
        if n - 1 - i >= max(3 * period, n // 2):
            return period, n
    return None


def lifetimes(events):
    """made[i] / freed[i]: event indexes of id i's allocation and free (None: never)."""
    made, freed, size = {}, {}, {}
    for i, (kind, ident, nbytes, _stream) in enumerate(events):
        if kind == "a":
            made[ident], size[ident] = i, nbytes
        else:
            freed[ident] = i
    return made, freed, size


def cut_at(persistent, cyclic, period, cut):
    """The buffers over [0, period) with the period cut at phase `cut`."""
    buffers = [(0, period, nbytes) for nbytes in persistent]
    for phase, life, nbytes in cyclic:
        lo = (phase - cut) % period
        if lo + life <= period:
            buffers.append((lo, lo + life, nbytes))
        else:
            buffers.append((0, period, nbytes))  # crosses the cut
    return buffers


def load_bound(buffers, period):
    """The most bytes the buffers hold at once (no layout can be lower)."""
    delta = [0] * (period + 1)
    for lo, hi, nbytes in buffers:
        delta[lo] += nbytes
        delta[hi] -= nbytes
    load = most = 0
    for d in delta:
        load += d
        most = max(most, load)
    return most


def step_problem(events, period, start):
    """(persistent sizes, cyclic blocks (phase, life, size), the layout's cycle in
    events, the step's peak live bytes (the trace's own, event by event), steps per
    cycle) for the step of `period` events starting at event `start`."""
    made, freed, size = lifetimes(events)
    end = start + period
    persistent, blocks = [], []
    for ident, at in made.items():
        gone = freed.get(ident)
        if at >= end or (at < start and gone is not None):
            continue  # a later step's, or an earlier copy of one of the step's blocks
        if gone is None:
            persistent.append(rounded(size[ident]))
        else:
            blocks.append((at - start, gone - at, rounded(size[ident])))
    steps = max([life // period + 1 for _phase, life, _nbytes in blocks] or [1])
    if steps > MAX_STEPS:
        sys.exit(f"a block of the step lives {steps - 1} steps or more: not a loop")
    cyclic = [(phase + k * period, life, nbytes) for phase, life, nbytes in blocks
              for k in range(steps)]
    live = peak = 0
    for i, (kind, ident, nbytes, _stream) in enumerate(events[:end]):
        live += nbytes if kind == "a" else -size[ident]
        if i >= start:
            peak = max(peak, live)
    return persistent, cyclic, steps * period, peak, steps


def cut_problem(persistent, cyclic, cycle):
    """Buffers (lower, upper, size) of the cycle cut where that costs least (see the
    module's text)."""
    delta = [0] * (cycle + 1)
    for phase, life, nbytes in cyclic:
        for lo, hi in arcs(phase, life, cycle):
            delta[lo] += nbytes
            delta[hi] -= nbytes
    loads, load = [], 0
    for phase in range(cycle):
        load += delta[phase]
        loads.append((load, phase))
    best = None
    for _load, cut in sorted(loads)[:CUTS]:
        buffers = cut_at(persistent, cyclic, cycle, cut)
        bound = load_bound(buffers, cycle)
        if best is None or bound < best[0]:
            best = (bound, buffers)
    return best[1]


def max_cyclic_load(cyclic, period):
    """The most bytes the cyclic blocks hold at once."""
    return load_bound([(lo, hi, nbytes) for phase, life, nbytes in cyclic
                       for lo, hi in arcs(phase, life, period)], period)


def arcs(phase, life, period):
    """The time intervals of a block living `life` events from `phase`, on a cycle."""
    if phase + life <= period:
        return ((phase, phase + life),)
    return ((phase, period), (0, phase + life - period))


def cyclic_first_fit(persistent, cyclic, period):
    """(height, [(arcs, offset, end)]) of a layout that repeats every `period` events
    with no cut: blocks by decreasing size (then lifetime), each at the lowest offset
    where no block that overlaps it in time lies."""
    blocks = [(nbytes, period, ((0, period),)) for nbytes in persistent]
    blocks += [(nbytes, life, arcs(phase, life, period)) for phase, life, nbytes in cyclic]
    blocks.sort(key=lambda b: (-b[0], -b[1]))
    placed, height = [], 0  # (arcs, offset, end)
    for nbytes, _life, mine in blocks:
        taken = sorted((off, end) for theirs, off, end in placed
                       if any(a < d and c < b for a, b in mine for c, d in theirs))
        offset = 0
        for off, end in taken:
            if off >= offset + nbytes:
                break
            offset = max(offset, end)
        placed.append((mine, offset, offset + nbytes))
        height = max(height, offset + nbytes)
    return height, placed


def plan_height(stowage, buffers, time_limit):
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write("id,lower,upper,size\n")
        for k, (lo, hi, nbytes) in enumerate(buffers):
            f.write(f"b{k},{lo},{hi},{nbytes}\n")
        path = f.name
    try:
        out = subprocess.run([stowage, "plan", "--json", "--time-limit", str(time_limit), path],
                             capture_output=True, text=True)
    finally:
        os.unlink(path)
    if out.returncode not in (0, 1):
        sys.exit(f"stowage plan failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--time-limit", type=float, default=5.0)
    ap.add_argument("--granule-mib", type=int, default=2)
    ap.add_argument("--stowage", default=os.path.join(os.path.dirname(__file__), "..", "build",
                                                      "stowage"))
    args = ap.parse_args()
    granule = args.granule_mib << 20
    within = total = 0
    print(f"{'trace':44} {'period':>7} {'peak live':>13} {'height':>13} {'cut':>7} "
          f"{'cyclic':>7} {'granules/live':>13} {'steps':>5}")
    for path in args.traces:
        events = long_run.load(path)
        sig = long_run.signatures(path, events)
        found = find_step(sig)
        if not found:
            print(f"{os.path.basename(path):44} no repeating step, skipped")
            continue
        period, end = found
        start = end - (MAX_STEPS + 1) * period
        if start < 0:
            print(f"{os.path.basename(path):44} fewer than {MAX_STEPS + 1} steps, skipped")
            continue
        persistent, cyclic, layout, peak, steps = step_problem(events, period, start)
        plan = plan_height(args.stowage, cut_problem(persistent, cyclic, layout),
                           args.time_limit)
        if not plan.get("valid"):
            sys.exit(f"{path}: stowage plan returned a plan its check refused")
        first_fit, _placed = cyclic_first_fit(persistent, cyclic, layout)
        model_peak = sum(persistent) + max_cyclic_load(cyclic, layout)
        if abs(model_peak - peak) > peak * 0.001:
            print(f"{os.path.basename(path)}: the step's model holds {model_peak} bytes at "
                  f"its peak, the trace {peak}", file=sys.stderr)
        height = min(plan["height"], first_fit)
        granules = -(-height // granule) * granule
        ratio = granules / peak
        total += 1
        within += ratio <= 1.01
        print(f"{os.path.basename(path):44} {period:7d} {peak:13d} {height:13d} "
              f"{plan['height'] / peak:7.4f} {first_fit / peak:7.4f} {ratio:13.4f} {steps:5d}")
    print(f"{within} of {total} within 1.01 x live in whole granules")


if __name__ == "__main__":
    main()
