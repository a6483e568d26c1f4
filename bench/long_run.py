#!/usr/bin/env python3
"""bench/long_run.py: a training trace run for more steps, as a real run is.

A recorded trace holds a few training steps and then the end of the run (the
weights and optimizer state freed). Replaying the whole trace again and again
on one pool (build/vmm_churn) frees and allocates the weights anew every
time, which a real run never does. This writes the run as it would go on:
the events up to the end of the last whole step, then that step again and
again (STEPS more times, with fresh allocation ids), and not the end of the
run, so what was live before the steps (weights, optimizer state) stays live,
as in a long training run.

The step is found, not assumed: the period P of the event sequence, where two
events P apart match when both allocate the same size on the same stream or
both free the allocation made the same number of events before. P is the
period with the longest stretch of matching events (at least two steps, at
least MIN_PERIOD events); the step repeated is the last P events of that
stretch. A trace without such a stretch (shapes that change every step, as
in resnet_multiscale_train or gpt2_generate) is reported and skipped.

    python3 bench/long_run.py OUT TRACE... [--steps 12] [--markers KEY]

A TRACE may be gzip-compressed (bench/zoo's .rep.gz). Writes OUT/<name>_long.rep
(<name> without .rep or .rep.gz) and prints, per trace, the period, where the
repeated step starts and the number of events written.

With --markers KEY, a step marker `m KEY` (docs/trace_format.md) comes before
each step of the periodic stretch and of the copies, as a training loop that
calls stowage.torch.step(KEY) at the top of each iteration would record it.
Where the loop's iteration begins is not in the trace; the marker goes at the
phase of the step where the fewest bytes of the step's own allocations are
live (the earliest such phase), which is where an iteration boundary lies: the
previous step's activations freed, the next ones not made yet.
"""
import argparse
import gzip
import operator
import os
import re
import sys

MIN_PERIOD = 50


def lines_of(path):
    """(line number, fields) of each line; exits naming a line that is not ASCII
    (the format is ASCII, and str.isdigit below would take other digits, such
    as superscripts, that int() refuses)."""
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"  # gzip-compressed, as bench/zoo commits its traces
    with (gzip.open if gz else open)(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                yield number, raw.decode("ascii").split()
            except UnicodeDecodeError:
                sys.exit(f"{path}:{number}: not ASCII text")


def load(path):
    """Events as (kind, id, size, stream); frees have size and stream 0."""
    events, header = [], None
    for number, fields in lines_of(path):
        if header is None:
            header = fields
            if len(header) != 2 or not all(x.isdigit() for x in header):
                sys.exit(f"{path}:1: expected 'IDS EVENTS' (whole numbers)")
            continue
        if not fields or fields[0] in ("m", "e"):
            continue  # step markers: not events (a marked trace is read as unmarked)
        numbers = fields[1:]
        if not all(x.isdigit() for x in numbers) or \
                (fields[0], len(fields)) not in (("a", 4), ("f", 2)):
            sys.exit(f"{path}:{number}: expected 'a ID SIZE STREAM' or 'f ID' "
                     "(whole numbers)")
        if fields[0] == "a":
            if int(numbers[1]) == 0:
                sys.exit(f"{path}:{number}: an allocation of 0 bytes")
            events.append(("a", int(numbers[0]), int(numbers[1]), int(numbers[2])))
        else:
            events.append(("f", int(numbers[0]), 0, 0))
    if header is None:
        sys.exit(f"{path}:1: empty file, expected 'IDS EVENTS'")
    if int(header[1]) != len(events):
        sys.exit(f"{path}:1: the header says {header[1]} events, the file has {len(events)}")
    return events


def signatures(path, events):
    """What must match between two events a step apart: the allocation's size
    and stream, or how many events back the freed allocation was made."""
    made_at, sig = {}, []  # made_at: live ids only
    for i, (kind, ident, size, stream) in enumerate(events):
        line = i + 2  # after the header
        if kind == "a":
            if ident in made_at:
                sys.exit(f"{path}:{line}: id {ident} allocated again while live")
            made_at[ident] = i
            sig.append(("a", size, stream))
        else:
            if ident not in made_at:
                sys.exit(f"{path}:{line}: frees id {ident}, which is not live")
            sig.append(("f", i - made_at.pop(ident)))
    return sig


def longest_periodic(sig, period):
    """(length, end) of the longest stretch where sig[i] == sig[i - period], the latest of
    equal ones; end is the index after it. The comparisons run as one map and the stretches
    are found by a regular expression over their bytes: a trace's largest size can be made
    a hundred times, and each distance between two of them is a period to check."""
    same = bytes(map(operator.eq, sig[period:], sig[:len(sig) - period]))
    best = (0, len(sig))
    for m in re.finditer(b"\x01+", same):
        best = max(best, (m.end() - m.start(), period + m.end()))
    return best


def find_step(sig):
    """(period, end of the periodic stretch) or None. Candidate periods are
    the distances between allocations of the trace's largest size (a step
    makes the same big allocations), checked in full."""
    sizes = [s[1] for s in sig if s[0] == "a"]
    if not sizes:
        return None
    biggest = max(sizes)
    at = [i for i, s in enumerate(sig) if s[0] == "a" and s[1] == biggest]
    candidates = sorted({b - a for a in at for b in at if b - a >= MIN_PERIOD})
    best = None
    for period in candidates:
        if best is not None and len(sig) - period <= best[0]:
            break  # no stretch of this period or a longer one can be longer
        length, end = longest_periodic(sig, period)
        if length >= period and (best is None or length > best[0]):
            best = (length, end, period)
    return (best[2], best[1]) if best else None


def least_loaded_phase(sig, period, end):
    """The phase of the step [end - period, end) before which the fewest bytes
    of the step's own allocations are live (the earliest on a tie). An
    allocation's life comes from the step before, [end - 2 period, end -
    period), whose frees all lie in the trace (find_step's stretch holds two
    steps at least); one that lives a whole period or more is live at every
    phase and changes nothing."""
    s0 = end - 2 * period
    life = {}
    for j in range(s0, len(sig)):
        if sig[j][0] == "f" and s0 <= j - sig[j][1] < s0 + period:
            life[j - sig[j][1]] = sig[j][1]
    load = [0] * (period + 1)  # difference array over phases
    for a in range(s0, s0 + period):
        if sig[a][0] != "a" or a not in life or life[a] >= period:
            continue
        start, stop = a - s0, a - s0 + life[a]  # live before phases (start, stop]
        for lo, hi in ((start + 1, min(stop, period - 1)), (0, stop - period)):
            if lo <= hi:
                load[lo] += sig[a][1]
                load[hi + 1] -= sig[a][1]
    best, live = (None, 0), 0
    for q in range(period):
        live += load[q]
        if best[0] is None or live < best[0]:
            best = (live, q)
    return best[1]


def extend(sig, period, end, steps):
    """Events [0, end) and then [end - period, end) `steps` more times, ids
    renumbered densely in order of allocation. A free names the allocation
    made as many events before as in the trace (the step's period keeps that
    true in the copies)."""
    out, id_at = [], []  # id_at[i]: the id output event i allocates (None: a free)
    next_id = 0
    for s in sig[:end] + sig[end - period:end] * steps:
        if s[0] == "a":
            id_at.append(next_id)
            out.append(("a", next_id, s[1], s[2]))
            next_id += 1
        else:
            ident = id_at[len(out) - s[1]]
            if ident is None:
                raise ValueError("a free does not match an allocation")
            id_at.append(None)
            out.append(("f", ident, 0, 0))
    return out


def valid_key(key):
    """The step-key rule of stowage/step_key.h."""
    ok = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:/-")
    return 1 <= len(key) <= 64 and all(c in ok for c in key)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--markers", metavar="KEY",
                    help="write a step marker 'm KEY' before each step")
    args = ap.parse_args()
    if args.steps < 1:
        sys.exit("--steps: at least 1")
    if args.markers is not None and not valid_key(args.markers):
        sys.exit("--markers: a key is 1-64 characters of [A-Za-z0-9_.:/-]")
    os.makedirs(args.out, exist_ok=True)
    for path in args.traces:
        name = os.path.basename(path)
        events = load(path)
        sig = signatures(path, events)
        found = find_step(sig)
        if not found:
            print(f"{name}: no repeating step, skipped")
            continue
        period, end = found
        try:
            out = extend(sig, period, end, args.steps)
        except ValueError as e:  # the stretch repeats, but not as a step the copies can repeat
            print(f"{name}: step of {period} events that does not repeat whole ({e}), skipped")
            continue
        ids = sum(1 for e in out if e[0] == "a")
        marks = set()
        if args.markers is not None:
            length, _ = longest_periodic(sig, period)
            first = end - period + least_loaded_phase(sig, period, end)
            while first - period >= end - length - period:
                first -= period
            marks = set(range(first, len(out), period))
        stem = next((name[:-len(x)] for x in (".rep.gz", ".rep") if name.endswith(x)), None)
        dst = os.path.join(args.out, stem + "_long.rep" if stem else name)
        with open(dst, "w") as f:
            f.write(f"{ids} {len(out)}\n")
            for i, (kind, ident, size, stream) in enumerate(out):
                if i in marks:
                    f.write(f"m {args.markers}\n")
                f.write(f"a {ident} {size} {stream}\n" if kind == "a" else f"f {ident}\n")
        print(f"{name}: step of {period} events, repeated from event {end - period + 1}; "
              f"{args.steps} more steps, {len(out)} events -> {dst}")


if __name__ == "__main__":
    main()
