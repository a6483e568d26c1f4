#!/usr/bin/env python3
"""bench/loop_calls.py: backend calls and modelled backend time per step of a loop, after its
first steps.

    python3 bench/loop_calls.py [--policy classic] [--conf KEY:VALUE,...]
        [--tuning KEY:VALUE,...] [--skip 3]
        [--long TRACE... [--long-steps 40]] [--loop FULL CUT [--loop-steps 64]] [--random FIRST:END [--random-steps 400]]
        [--varlen FIRST:END [--varlen-steps 60]] [--stowage build/stowage]

A pool that settles makes its backend calls (reserves and releases: cudaMalloc, cudaFree) in a
loop's first steps and none after. For each loop this replays the whole run and the run cut
after its first SKIP steps (the same events, so the same calls up to the cut) with
`stowage replay --json --repeats 0`, and prints per loop the backend calls and the modelled
backend milliseconds (`modelled_backend_ms`, H200 costs) of the steps after the cut, per step,
and the peak reserved / peak live of the whole run; then how many loops make more than one call
per ten steps after the cut (the goal: none). --conf gives the replays settings (STOWAGE_CONF's
keys); --tuning the pool's measured constants (stowage/tuning.h, `stowage replay --tuning`), to
measure one against its alternatives.

The loops:
- --long: each trace's last training step repeated LONG_STEPS times (bench/long_run.py, which
  finds the step; a trace without one is skipped). Steps are counted back from where the
  repetition starts, so the recorded steps before it count too.
- --loop FULL CUT: loops written twice, each trace of directory FULL run for LOOP_STEPS steps
  and the one of the same name in CUT for the first SKIP of them, as `bench/snapshot_check.py
  --workloads DIR --iterations N` writes the public snapshots' workloads (the first SKIP
  iterations of a loop are the start of a longer one).
- --random: bench/random_loops.py's seeded step programs, RANDOM_STEPS steps each.
- --varlen: bench/varlen_traces.py's seeded BERT-like runs with a random sequence length every
  step, VARLEN_STEPS steps each (its 32-512 tokens, 12288 tokens a step).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import long_run  # noqa: E402
import random_loops  # noqa: E402
import varlen_traces  # noqa: E402


def long_loops(paths, steps):
    """(name, events, step ends) of each trace's long run."""
    for path in paths:
        events = long_run.load(path)
        sig = long_run.signatures(path, events)
        found = long_run.find_step(sig)
        name = os.path.basename(path)[:-4] + "_long"
        if not found:
            print("%s: no repeating step, skipped" % name, file=sys.stderr)
            continue
        period, end = found
        out = long_run.extend(sig, period, end, steps)
        # Step ends: every period back from where the repetition starts (a first piece
        # shorter than half a step belongs to the next), then every period after it.
        first = end % period
        if first < period // 2:
            first += period
        ends = list(range(first, end, period)) + [end + k * period for k in range(steps + 1)]
        lines = ["a %d %d %d" % (i, size, stream) if kind == "a" else "f %d" % i
                 for kind, i, size, stream in out]
        yield name, lines, ends


def random_loop_runs(seeds, steps):
    """Each seed's loop; its weights (allocated first, never freed) open the first step."""
    for seed in seeds:
        lines = random_loops.trace_lines(seed, steps)[1:]
        freed = {int(l.split()[1]) for l in lines if l[0] == "f"}
        weights = 0
        while lines[weights][0] == "a" and int(lines[weights].split()[1]) not in freed:
            weights += 1
        per_step = (len(lines) - weights) // steps
        yield "r%d" % seed, lines, [weights + per_step * (k + 1) for k in range(steps)]


def varlen_runs(seeds, steps):
    for seed in seeds:
        lines, _, ends = varlen_traces.trace_lines(seed, steps)
        yield "bert_varlen_s%d" % seed, lines[1:], ends


def write(path, lines):
    """A .rep of these events; ids are dense in allocation order in every loop above, so a
    prefix's allocations are its ids."""
    allocs = sum(1 for l in lines if l[0] == "a")
    with open(path, "w") as f:
        f.write("%d %d\n" % (allocs, len(lines)))
        f.write("\n".join(lines) + "\n")


def replay(stowage, policy, conf, tuning, paths):
    cmd = [stowage, "replay", "--policy", policy, "--json", "--repeats", "0"]
    if conf:
        cmd += ["--conf", conf]
    if tuning:
        cmd += ["--tuning", tuning]
    out = subprocess.run(cmd + paths, check=True, capture_output=True, text=True).stdout
    rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    return {r["trace"]: r for r in rows}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stowage", default=os.path.join(HERE, "..", "build", "stowage"))
    ap.add_argument("--policy", default="classic")
    ap.add_argument("--conf", default="", help="settings (STOWAGE_CONF's keys)")
    ap.add_argument("--tuning", default="",
                    help="the pool's measured constants (stowage/tuning.h)")
    ap.add_argument("--skip", type=int, default=3, help="steps not counted (default 3)")
    ap.add_argument("--long", nargs="+", default=[], metavar="TRACE")
    ap.add_argument("--long-steps", type=int, default=40)
    ap.add_argument("--loop", nargs=2, metavar=("FULL", "CUT"))
    ap.add_argument("--loop-steps", type=int, default=64)
    ap.add_argument("--random", type=random_loops.seed_range, metavar="FIRST:END")
    ap.add_argument("--random-steps", type=int, default=400)
    ap.add_argument("--varlen", type=random_loops.seed_range, metavar="FIRST:END")
    ap.add_argument("--varlen-steps", type=int, default=60)
    args = ap.parse_args(argv)
    if args.skip < 1:
        ap.error("--skip: at least 1")
    loops = list(long_loops(args.long, args.long_steps))
    if args.random:
        loops += list(random_loop_runs(args.random, args.random_steps))
    if args.varlen:
        loops += list(varlen_runs(args.varlen, args.varlen_steps))
    if not loops and not args.loop:
        ap.error("no loop: give --long, --loop, --random or --varlen")
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        if args.loop:
            full_dir, cut_dir = args.loop
            for n in sorted(os.listdir(full_dir)):
                cut = os.path.join(cut_dir, n)
                if n.endswith(".rep") and os.path.exists(cut):
                    paths.append((n[:-4], os.path.join(full_dir, n), cut,
                                  args.loop_steps - args.skip))
        for name, lines, ends in loops:
            if len(ends) <= args.skip:
                sys.exit("%s: %d steps, not more than --skip %d" % (name, len(ends), args.skip))
            full, cut = os.path.join(tmp, name + ".rep"), os.path.join(tmp, name + "_cut.rep")
            write(full, lines)
            write(cut, lines[:ends[args.skip - 1]])
            paths.append((name, full, cut, len(ends) - args.skip))
        result = replay(args.stowage, args.policy, args.conf, args.tuning,
                        [p for _, full, cut, _ in paths for p in (full, cut)])
    print("| loop | steps after the first %d | backend calls | per step | modelled backend ms "
          "per step | peak reserved / live |" % args.skip)
    print("|---|---:|---:|---:|---:|---:|")
    over = []
    for name, full, cut, steps in paths:
        a, b = result[full], result[cut]
        calls = a["backend_calls"] - b["backend_calls"]
        ms = a.get("modelled_backend_ms", 0.0) - b.get("modelled_backend_ms", 0.0)
        print("| %s | %d | %d | %.3f | %.3f | %.4f |" % (name, steps, calls, calls / steps,
                                                      ms / steps, a["reserved_over_live"]))
        if calls * 10 > steps:
            over.append("%s (%.2f)" % (name, calls / steps))
    print()
    print("%s%s: %d loops; more than one backend call per ten steps after the first %d: %d%s"
          % (args.policy, (" --conf " + args.conf if args.conf else "") +
             (" --tuning " + args.tuning if args.tuning else ""), len(paths), args.skip,
             len(over), (": " + ", ".join(over)) if over else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
