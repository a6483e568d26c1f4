#!/usr/bin/env python3
"""bench/model_check.py: the PyTorch models against PyTorch itself on recorded workloads.

    python3 bench/model_check.py DIR [--stowage build/stowage] [--tolerance 0.01]

DIR holds what bench/gpu/record_unseen.py wrote on a GPU machine (bench/gpu/run.sh, part 6,
puts it under $OUT/unseen): for each workload W, W.rep (its allocation trace; W.rep.gz where
gzipped), W.native.json (PyTorch's max_memory_reserved with its default allocator, in the run
that recorded the trace) and, when present, W.expandable.json (the same workload with
expandable_segments:True). Each trace is replayed under the `pytorch` and `pytorch-expandable`
models on the simulated device (`stowage replay --json`), and their peak reserved bytes are
compared with PyTorch's. Prints one Markdown row per (workload, mode) and exits 1 when a model
is off by more than the tolerance (the models hold within 1% on traces they were not tuned on),
2 on bad input (the file and the reason), 0 otherwise.
"""
import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile

MODES = (("native", "pytorch"), ("expandable", "pytorch-expandable"))


def fail(msg):
    print(f"model_check: {msg}", file=sys.stderr)
    sys.exit(2)


def load_summary(path):
    try:
        with open(path) as f:
            summary = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: {e}")
    reserved = summary.get("max_reserved_bytes") if isinstance(summary, dict) else None
    if not isinstance(reserved, int) or isinstance(reserved, bool) or reserved <= 0:
        fail(f"{path}: no positive integer 'max_reserved_bytes'")
    return summary


def model_peaks(stowage, trace):
    """Peak reserved bytes of each model on the trace, from `stowage replay --json`."""
    cmd = [stowage, "replay", "--json"]
    for _, policy in MODES:
        cmd += ["--policy", policy]
    cmd.append(trace)
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        fail(f"{trace}: stowage replay exited {run.returncode}: {run.stderr.strip()}")
    peaks = {}
    for line in run.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            peaks[row["policy"]] = (row["peak_reserved_bytes"], row["ooms"])
    return peaks


def trace_path(directory, w, scratch):
    """W.rep, else W.rep.gz unpacked into the directory scratch."""
    path = os.path.join(directory, w + ".rep")
    if os.path.exists(path):
        return path
    unpacked = os.path.join(scratch, w + ".rep")
    try:
        with gzip.open(path + ".gz", "rb") as src, open(unpacked, "wb") as dst:
            shutil.copyfileobj(src, dst)
    except (OSError, EOFError) as e:
        fail(f"{path}.gz: {e}")
    return unpacked


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--stowage", default=os.path.join(os.path.dirname(__file__), "..", "build",
                                                      "stowage"))
    ap.add_argument("--tolerance", type=float, default=0.01)
    args = ap.parse_args()
    if not os.path.isdir(args.dir):
        fail(f"{args.dir}: not a directory")
    names = os.listdir(args.dir)
    workloads = sorted({n[:-4] for n in names if n.endswith(".rep")} |
                       {n[:-7] for n in names if n.endswith(".rep.gz")})
    if not workloads:
        fail(f"{args.dir}: no .rep trace")
    inputs = []  # every summary is read and checked before anything is replayed
    for w in workloads:
        summaries = {}
        for mode, _ in MODES:
            path = os.path.join(args.dir, f"{w}.{mode}.json")
            if os.path.exists(path):
                summaries[mode] = load_summary(path)
        if "native" not in summaries:
            fail(f"{os.path.join(args.dir, w + '.rep')}: no {w}.native.json beside it")
        if summaries["native"].get("history_full"):
            print(f"model_check: {w}: PyTorch's history ring was full; the trace misses its "
                  "first events", file=sys.stderr)
        inputs.append((w, summaries))
    print("| workload | mode | model peak reserved | PyTorch max reserved | relative error |")
    print("|---|---|---:|---:|---:|")
    worst, off, compared = 0.0, 0, 0
    for w, summaries in inputs:
        with tempfile.TemporaryDirectory() as scratch:
            peaks = model_peaks(args.stowage, trace_path(args.dir, w, scratch))
        for mode, policy in MODES:
            if mode not in summaries:
                continue
            real = summaries[mode]["max_reserved_bytes"]
            model, ooms = peaks[policy]
            err = (model - real) / real
            compared += 1
            worst = max(worst, abs(err))
            flag = "" if abs(err) <= args.tolerance and ooms == 0 else " **off**"
            off += bool(flag)
            print(f"| {w} | {mode} | {model} | {real} | {err * 100:+.3f}%{flag} |")
    print()
    print(f"{compared} comparisons on {len(workloads)} workloads, worst {worst * 100:.3f}%, "
          f"{off} beyond {args.tolerance * 100:g}%")
    return 1 if off else 0


if __name__ == "__main__":
    sys.exit(main())
