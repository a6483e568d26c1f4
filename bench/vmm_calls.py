#!/usr/bin/env python3
"""bench/vmm_calls.py: the page-mapped pool's driver calls against PyTorch's
expandable segments, and its memory against the ideal-remap yardstick, on
single replays from a cold pool (docs/design.md, page-mapped segments).

For each trace, `stowage replay --policy vmm --policy pytorch-expandable
--policy ideal-remap --repeats 1 --json` (extra arguments go to the replay:
settings as --conf KEY:VALUE, the pool's measured constants as --tuning
KEY:VALUE) gives:
  - vmm's map + unmap calls against the pytorch-expandable model's (a call per
    physical handle for vmm, per 20 MiB or 2 MiB page for the model);
  - vmm's modelled driver time against the model's (the simulated device's cost
    model, stowage/sim.h, prices both);
  - vmm's peak reserved / peak live, and ideal-remap's.
It prints a Markdown row per trace and a summary of the goals: calls and time
at most LIMIT (2) x the model's on every trace, and peak reserved at most 1.01 x
live wherever ideal-remap is at most 1.005.

With --row LABEL it prints one Markdown row instead (bench/vmm_handles.sh
makes the curve of handle sizes from such rows; ROW_HEADER below is its
header): the label, calls and time against the model (median, max, traces
above LIMIT), reserved / live (median, max) and the traces above 1.01 where
ideal-remap is at most 1.005, and the calls and modelled milliseconds of all
traces together.

Usage: python3 bench/vmm_calls.py [--stowage build/stowage] [--jobs N]
           [--summary-only | --row LABEL] TRACE... [-- REPLAY_ARGS...]
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys

CALLS_LIMIT = 2.0
TIME_LIMIT = 2.0
MEMORY_LIMIT = 1.01
IDEAL_BOUND = 1.005


def replay(stowage, trace, extra):
    cmd = [stowage, "replay", "--policy", "vmm", "--policy", "pytorch-expandable",
           "--policy", "ideal-remap", "--repeats", "1", "--json"] + extra + [trace]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit("vmm_calls: %s exited %d:\n%s" % (" ".join(cmd), run.returncode,
                                                   run.stderr.strip()))
    out = run.stdout
    rows = {}
    for line in out.splitlines():
        if line.strip():
            j = json.loads(line)
            rows[j["policy"]] = j
    return trace, rows


def figures(rows):
    v, e, i = rows["vmm"], rows["pytorch-expandable"], rows["ideal-remap"]
    v_calls = v["map_calls"] + v["unmap_calls"]
    e_calls = e["map_calls"] + e["unmap_calls"]
    return {
        "reserved": v["reserved_over_live"],
        "ideal": i["reserved_over_live"],
        "v_calls": v_calls,
        "e_calls": e_calls,
        "calls_ratio": v_calls / e_calls if e_calls else float("inf") if v_calls else 0.0,
        "v_ms": v["modelled_backend_ms"],
        "e_ms": e["modelled_backend_ms"],
        "ms_ratio": v["modelled_backend_ms"] / e["modelled_backend_ms"]
        if e["modelled_backend_ms"] else float("inf"),
        "e_reserved": e["reserved_over_live"],
    }


ROW_HEADER = ("| vmm_handle_mb | calls / expandable: median | max | above 2 | time / expandable: "
              "median | max | above 2 | reserved / live: median | max | above 1.01 where "
              "ideal <= 1.005 | calls, all traces | modelled ms, all traces |\n"
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        k = argv.index("--")
        argv, extra = argv[:k], argv[k + 1:]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--stowage", default=os.path.join(os.path.dirname(__file__), "..", "build",
                                                      "stowage"))
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--summary-only", action="store_true")
    ap.add_argument("--row", metavar="LABEL")
    args = ap.parse_args(argv)

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as ex:
        results = list(ex.map(lambda t: replay(args.stowage, t, extra), args.traces))

    rows = [(os.path.basename(t)[:-4] if t.endswith(".rep") else os.path.basename(t),
             figures(r)) for t, r in results]
    if args.row is not None:
        print_row(args.row, rows)
        return
    if not args.summary_only:
        print("| trace | vmm reserved / live | ideal-remap | expandable | vmm calls | expandable "
              "calls | x | vmm ms | expandable ms | x |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for name, f in rows:
            print(f"| {name} | {f['reserved']:.4f} | {f['ideal']:.4f} | {f['e_reserved']:.4f} | "
                  f"{f['v_calls']} | {f['e_calls']} | {f['calls_ratio']:.2f} | {f['v_ms']:.1f} | "
                  f"{f['e_ms']:.1f} | {f['ms_ratio']:.2f} |")
        print()
    calls_over = [(n, f["calls_ratio"]) for n, f in rows if f["calls_ratio"] > CALLS_LIMIT]
    time_over = [(n, f["ms_ratio"]) for n, f in rows if f["ms_ratio"] > TIME_LIMIT]
    bound = [(n, f) for n, f in rows if f["ideal"] <= IDEAL_BOUND]
    mem_over = [(n, f["reserved"]) for n, f in bound if f["reserved"] > MEMORY_LIMIT]
    ratios = sorted(f["calls_ratio"] for _, f in rows)
    times = sorted(f["ms_ratio"] for _, f in rows)
    res = sorted(f["reserved"] for _, f in rows)
    print(f"traces: {len(rows)}; calls vs expandable: median {ratios[len(ratios) // 2]:.2f}, "
          f"max {ratios[-1]:.2f}; modelled time: median {times[len(times) // 2]:.2f}, "
          f"max {times[-1]:.2f}; reserved / live: median {res[len(res) // 2]:.4f}, "
          f"max {res[-1]:.4f}")
    print(f"calls above {CALLS_LIMIT} x expandable: {len(calls_over)} "
          + " ".join(f"{n} {r:.2f}" for n, r in calls_over))
    print(f"modelled time above {TIME_LIMIT} x expandable: {len(time_over)} "
          + " ".join(f"{n} {r:.2f}" for n, r in time_over))
    print(f"reserved above {MEMORY_LIMIT} x live where ideal-remap <= {IDEAL_BOUND} "
          f"({len(bound)} traces): {len(mem_over)} "
          + " ".join(f"{n} {r:.4f}" for n, r in mem_over))
    total_v = sum(f["v_calls"] for _, f in rows)
    total_e = sum(f["e_calls"] for _, f in rows)
    print(f"calls in all: vmm {total_v}, expandable {total_e}; modelled ms in all: vmm "
          f"{sum(f['v_ms'] for _, f in rows):.1f}, expandable {sum(f['e_ms'] for _, f in rows):.1f}")


def print_row(label, rows):
    calls = sorted(f["calls_ratio"] for _, f in rows)
    times = sorted(f["ms_ratio"] for _, f in rows)
    res = sorted(f["reserved"] for _, f in rows)
    mem_over = sum(1 for _, f in rows if f["ideal"] <= IDEAL_BOUND and f["reserved"] > MEMORY_LIMIT)
    bound = sum(1 for _, f in rows if f["ideal"] <= IDEAL_BOUND)
    mid = len(rows) // 2
    print(f"| {label} | {calls[mid]:.2f} | {calls[-1]:.2f} | "
          f"{sum(1 for c in calls if c > CALLS_LIMIT)} | {times[mid]:.2f} | {times[-1]:.2f} | "
          f"{sum(1 for t in times if t > TIME_LIMIT)} | {res[mid]:.4f} | {res[-1]:.4f} | "
          f"{mem_over} of {bound} | {sum(f['v_calls'] for _, f in rows)} | "
          f"{sum(f['v_ms'] for _, f in rows):.0f} |")


if __name__ == "__main__":
    main()
