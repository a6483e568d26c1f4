#!/usr/bin/env python3
"""bench/pool_goals.py: the pool's goals, set by set (docs/benchmarks.md, goals).

    python3 bench/pool_goals.py [--sets shared,scaled,...] [--policies classic,vmm]
        [--snapshots DIR] [--zoo DIR] [--work DIR] [--jobs N] [--conf KEY:VALUE,...]
        [--tuning KEY:VALUE,...] [--details] [--varlen-seeds 0:10] [--stowage build/stowage]
        [--planned-steps build/planned_steps]

--conf: settings (STOWAGE_CONF's keys) for every Stowage policy. --tuning: the pool's
measured constants (stowage/tuning.h), to measure one against its alternatives: they go to
`stowage replay --tuning` and, with the settings, to `build/planned_steps --conf`.

One row per set and policy, each cell "failing of traces (worst)":

- **reserved**: peak reserved above 1.005 x the smaller of the `pytorch` and
  `pytorch-expandable` models' (worst: the ratio to that smaller one); **native**: above
  1.005 x the `pytorch` model's (what a policy offered where expandable segments cannot run
  must meet).
- **device**: the smallest device the trace runs on (`--min-capacity`, 2 MiB steps) above
  1.005 x the `pytorch` model's.
- **1.01**: peak reserved or smallest device above 1.01 x peak live, of the traces whose
  `ideal-remap` peak (2 MiB pages mapped exactly under live data) is at most 1.005 x live.
- **calls**, **time**: map + unmap calls (vmm), or every backend call (classic), and the
  modelled driver time (the simulated device's H200 costs), above 2 x the
  `pytorch-expandable` model's map + unmap calls and time.
Loop sets (traces with step markers) add, from `build/planned_steps`:
- **settled**: loops that still call the backend after their fifth step, the markers hidden
  from the pool (worst: calls per step there); **below**: the same, counting only the steps
  that take the live peak no higher (a step that allocates past every earlier step's live
  peak, a longer sequence than any before, must grow under any allocator).
- **markers**: peak reserved with `planned_steps:true` and the markers above 1.01 x the same
  pool's peak with the markers hidden (worst: the ratio).
- **fixed 1.003**: fixed-shape loops (long, random) whose peak reserved with markers is above
  1.003 x peak live.

The sets (written under --work, and reused from there when present):
- shared: the five traces of ../shared/traces (STOW_TRACES_DIR), the design set.
- scaled: each shared trace with every size x 0.6, 0.7, 0.8, 0.9, 1.05, 1.1, 1.25, 1.5
  (bench/scaled_traces.py).
- mixes: each pair of shared traces in one pool and one stream, event by event and in turns
  of 1,000 events (bench/mixed_traces.py); streams: the same on two streams.
- snapshots: the distinct workloads of the public snapshots in --snapshots DIR
  (bench/snapshot_check.py --workloads; python3 bench/fetch_snapshots.py DIR fetches them).
- zoo: the traces of the model corpus (--zoo, bench/zoo: those of its index.csv, or all of its
  traces/ without one), replayed as committed, gzip-compressed.
- long: the shared traces whose step repeats, 40 more steps, a marker `train` a step
  (bench/long_run.py).
- varlen: BERT-base with a random sequence length each step, 24 steps, one key `train`
  (bench/varlen_traces.py, --varlen-seeds); buckets: the same padded to multiples of 64 with a
  key per length.
- random: 10 random step programs of 200 steps (bench/random_loops.py), a marker a step.

Exit status 0, or 1 when a command it runs fails (its error quoted); the table goes to
standard output, progress to standard error.
"""
import argparse
import concurrent.futures
import csv
import hashlib
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import random_loops  # noqa: E402
from heldout_table import trace_name  # noqa: E402

SETS = ["shared", "scaled", "mixes", "streams", "snapshots", "zoo", "long", "varlen",
        "buckets", "random"]
LOOP_SETS = {"long", "varlen", "buckets", "random"}
FIXED_SETS = {"long", "random"}
MODELS = ["pytorch", "pytorch-expandable", "ideal-remap"]
WITHIN = 1.005      # against the PyTorch models
LIVE_GOAL = 1.01    # x live where ideal-remap is at most IDEAL_BOUND
IDEAL_BOUND = 1.005
CALLS_LIMIT = 2.0   # x expandable's calls and modelled time
MARKERS_LIMIT = 1.01
FIXED_GOAL = 1.003
SETTLE_STEPS = 5
SCALE_FACTORS = "0.6,0.7,0.8,0.9,1.05,1.1,1.25,1.5"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("pool_goals: %s exited %d:\n%s" % (" ".join(cmd), out.returncode,
                                                     out.stderr.strip()))
    return out.stdout


def traces_dir():
    return os.environ.get("STOW_TRACES_DIR", os.path.join(ROOT, "..", "shared", "traces"))


def reps(d):
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".rep"))


def distinct(paths):
    """Paths whose contents differ (a workload committed under two names counts once)."""
    seen, out = set(), []
    for p in paths:
        with open(p, "rb") as f:
            h = hashlib.md5(f.read()).hexdigest()
        if h not in seen:
            seen.add(h)
            out.append(p)
    return out


def make_set(name, work, args):
    """The set's trace paths, written under work/name unless there already."""
    d = os.path.join(work, name)
    if name == "zoo":
        # The committed .rep.gz files themselves: the replays read them compressed.
        zoo = args.zoo
        index = os.path.join(zoo, "index.csv")
        if os.path.exists(index):
            with open(index) as f:
                files = [os.path.join(zoo, "traces", r["trace"]) for r in csv.DictReader(f)]
        else:
            files = [os.path.join(r, n) for r, _, ns in os.walk(os.path.join(zoo, "traces"))
                     for n in ns if n.endswith(".rep.gz")]
        return distinct(sorted(f for f in files if os.path.exists(f)))
    if name == "shared":
        return [os.path.join(traces_dir(), t + ".rep") for t in
                ("gpt2_train", "resnet50_train", "resnet_multiscale_train", "vit_train",
                 "gpt2_generate")]
    if os.path.isdir(d) and reps(d):
        return distinct(reps(d))
    os.makedirs(d, exist_ok=True)
    py = [sys.executable]
    if name == "scaled":
        run(py + [os.path.join(HERE, "scaled_traces.py"), d, "--src", traces_dir(),
                  "--factors", SCALE_FACTORS])
    elif name in ("mixes", "streams"):
        run(py + [os.path.join(HERE, "mixed_traces.py"), d, "--src", traces_dir(),
                  "--chunks", "1,1000", "--streams", "same" if name == "mixes" else "separate"])
    elif name == "snapshots":
        if not args.snapshots:
            os.rmdir(d)
            return []
        subprocess.run(py + [os.path.join(HERE, "snapshot_check.py"), "--stowage", args.stowage,
                             "--workloads", d] + sorted(
                                 os.path.join(args.snapshots, n)
                                 for n in os.listdir(args.snapshots)),
                       capture_output=True, text=True)
    elif name == "long":
        run(py + [os.path.join(HERE, "long_run.py"), d] + make_set("shared", work, args) +
            ["--steps", "40", "--markers", "train"])
    elif name == "varlen":
        run(py + [os.path.join(HERE, "varlen_traces.py"), d, "--seeds", args.varlen_seeds,
                  "--steps", "24", "--markers", "train"])
    elif name == "buckets":
        run(py + [os.path.join(HERE, "varlen_traces.py"), d, "--seeds", args.varlen_seeds,
                  "--steps", "24", "--pad-to", "64", "--markers", "len{len}"])
    elif name == "random":
        for seed in range(10):
            lines = random_loops.trace_lines(seed, 200)
            body = lines[1:]
            freed = {int(l.split()[1]) for l in body if l[0] == "f"}
            w = 0
            while body[w][0] == "a" and int(body[w].split()[1]) not in freed:
                w += 1
            per = (len(body) - w) // 200
            out = [lines[0]] + body[:w]
            for k in range(200):
                out.append("m train")
                out += body[w + k * per:w + (k + 1) * per]
            with open(os.path.join(d, "r%d.rep" % seed), "w") as f:
                f.write("\n".join(out) + "\n")
    return distinct(reps(d))


def replay_one(args, policies, path):
    cmd = [args.stowage, "replay", "--min-capacity", "--repeats", "1", "--json"]
    for p in policies + MODELS:
        cmd += ["--policy", p]
    if args.conf:
        cmd += ["--conf", args.conf]
    if args.tuning:
        cmd += ["--tuning", args.tuning]
    rows = {}
    for line in run(cmd + [path]).splitlines():
        if line.startswith("{"):
            j = json.loads(line)
            rows[j["policy"]] = j
    return path, rows


def steps_one(args, policy, path):
    """planned_steps of the pool alone (markers hidden) and with planned steps (markers)."""
    conf = ",".join(["policy:" + policy] + [c for c in (args.conf, args.tuning) if c])
    alone = json.loads(run([args.planned_steps, "--hide-markers", "--conf", conf, path]))
    marked = json.loads(run([args.planned_steps, "--conf", conf + ",planned_steps:true", path]))
    return path, policy, alone, marked


class Cell:
    """'failing of traces (worst)' of one goal."""

    def __init__(self, fmt="%.4f"):
        self.n, self.bad, self.worst, self.fmt, self.names = 0, 0, None, fmt, []

    def add(self, name, value, fails):
        self.n += 1
        if fails:
            self.bad += 1
            self.names.append("%s %s" % (name, self.fmt % value))
            if self.worst is None or value > self.worst:
                self.worst = value

    def __str__(self):
        if not self.n:
            return "-"
        return "%d of %d%s" % (self.bad, self.n,
                               " (%s)" % (self.fmt % self.worst) if self.bad else "")


def calls_of(j):
    if j.get("map_calls"):
        return j["map_calls"] + j["unmap_calls"]
    return j["backend_calls"] or 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--policies", default="classic,vmm")
    ap.add_argument("--snapshots", help="the snapshots of bench/snapshots.txt")
    ap.add_argument("--zoo", default=os.path.join(HERE, "zoo"),
                    help="the corpus of model workloads (default bench/zoo)")
    ap.add_argument("--work", help="where the sets' traces go (kept; reused when present)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--conf", default="", help="settings for every Stowage policy")
    ap.add_argument("--tuning", default="",
                    help="measured constants for every Stowage policy (stowage/tuning.h)")
    ap.add_argument("--details", action="store_true", help="name the failing traces")
    ap.add_argument("--varlen-seeds", default="0:10", type=str)
    ap.add_argument("--stowage", default=os.path.join(ROOT, "build", "stowage"))
    ap.add_argument("--planned-steps", default=os.path.join(ROOT, "build", "planned_steps"))
    args = ap.parse_args(argv)
    random_loops.seed_range(args.varlen_seeds)
    sets = args.sets.split(",")
    for s in sets:
        if s not in SETS:
            ap.error("--sets: unknown set '%s' (%s)" % (s, ", ".join(SETS)))
    policies = args.policies.split(",")
    tmp = None
    if not args.work:
        tmp = tempfile.TemporaryDirectory()
        args.work = tmp.name
    print("| set | policy | traces | reserved > models +0.5% | reserved > native +0.5% | "
          "device > native +0.5% | "
          "> 1.01 x live (ideal <= 1.005) | calls > 2 x expandable | time > 2 x expandable | "
          "calling after step 5 | calling below the live peak | markers > +1% | "
          "fixed > 1.003 x live |")
    print("|---|---|---:|---|---|---|---|---|---|---|---|---|---|")
    details = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as ex:
        for s in sets:
            paths = make_set(s, args.work, args)
            if not paths:
                log("%s: no traces, skipped" % s)
                continue
            log("%s: %d traces" % (s, len(paths)))
            replays = dict(ex.map(lambda p: replay_one(args, policies, p), paths))
            loops = {}
            if s in LOOP_SETS:
                jobs = [(p, pol) for p in paths for pol in policies]
                for path, pol, alone, marked in ex.map(lambda a: steps_one(args, a[1], a[0]),
                                                       jobs):
                    loops[(path, pol)] = (alone, marked)
            for pol in policies:
                cells = {k: Cell() for k in ("reserved", "native", "device", "live", "markers",
                                             "fixed")}
                cells["calls"], cells["time"], cells["settled"], cells["below"] = \
                    Cell("%.2f"), Cell("%.2f"), Cell("%.2f"), Cell("%.2f")
                for path in paths:
                    name = trace_name(path)
                    r = replays[path]
                    me, nat, exp, ideal = r[pol], r["pytorch"], r["pytorch-expandable"], \
                        r["ideal-remap"]
                    live = me["peak_live_bytes"]
                    models = min(nat["peak_reserved_bytes"], exp["peak_reserved_bytes"])
                    x = me["peak_reserved_bytes"] / models
                    cells["reserved"].add(name, x, x > WITHIN)
                    x = me["peak_reserved_bytes"] / nat["peak_reserved_bytes"]
                    cells["native"].add(name, x, x > WITHIN)
                    x = me["min_capacity_bytes"] / nat["min_capacity_bytes"]
                    cells["device"].add(name, x, x > WITHIN)
                    if ideal["peak_reserved_bytes"] <= IDEAL_BOUND * live:
                        x = max(me["peak_reserved_bytes"], me["min_capacity_bytes"]) / live
                        cells["live"].add(name, x, x > LIVE_GOAL)
                    ec, mc = calls_of(exp), calls_of(me)
                    x = mc / ec if ec else (float("inf") if mc else 0.0)
                    cells["calls"].add(name, x, x > CALLS_LIMIT)
                    et, mt = exp.get("modelled_backend_ms", 0.0), me.get("modelled_backend_ms",
                                                                         0.0)
                    x = mt / et if et else (float("inf") if mt else 0.0)
                    cells["time"].add(name, x, x > CALLS_LIMIT)
                    if (path, pol) in loops:
                        alone, marked = loops[(path, pol)]
                        settled = max(1, alone["steps"] - SETTLE_STEPS)
                        cells["settled"].add(name, alone["calls_settled"] / settled,
                                             alone["steps_calling_settled"] > 0)
                        cells["below"].add(name, alone["calls_settled_below_peak"] / settled,
                                           alone["steps_calling_settled_below_peak"] > 0)
                        x = marked["peak_reserved_over_live"] / alone["peak_reserved_over_live"]
                        cells["markers"].add(name, x, x > MARKERS_LIMIT)
                        if s in FIXED_SETS:
                            x = marked["peak_reserved_over_live"]
                            cells["fixed"].add(name, x, x > FIXED_GOAL)
                print("| %s | %s | %d | %s |" % (s, pol, len(paths), " | ".join(
                    str(cells[k]) for k in ("reserved", "native", "device", "live", "calls", "time",
                                            "settled", "below", "markers", "fixed"))),
                      flush=True)
                for k, c in cells.items():
                    if c.names:
                        details.append("%s %s %s: %s" % (s, pol, k, ", ".join(c.names)))
    if args.details and details:
        print()
        print("\n".join(details))
    return 0


if __name__ == "__main__":
    sys.exit(main())
