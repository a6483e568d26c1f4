"""Training step time under Stowage against PyTorch native, in interleaved rounds.

    python3 bench/gpu/step_time.py --out DIR [--models resnet50,gpt2]
        [--modes native,stowage] [--rounds 3] [--steps 60] [--warmup 5] [--timeout 150]
    python3 bench/gpu/step_time.py --summarise DIR

A process's allocator is fixed once CUDA is in use, so every run is its own process
(bench/gpu/train.py --model M --mode MODE --steps WARMUP+STEPS --warmup WARMUP). A round runs
every model under every mode, the modes in turn and their order reversed every other round, so
that the machine's drift over the rounds falls on both allocators alike. Each run writes
DIR/step_MODEL_MODE_rK.json.

The table (Markdown, also DIR/step_time.json): per model and mode the median step time over
the timed steps of all rounds, the 10th-90th percentile of those steps, the median of each
round, and the device calls (cudaMalloc + cudaFree) per timed step; per model the ratio of each
mode's round median to native's in the same round: their median and range. A ratio at or below
1 is a step no slower than PyTorch native's.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def percentile(values, q):
    """The q-th percentile (0-100) of values, linearly interpolated."""
    v = sorted(values)
    if not v:
        raise ValueError("no values")
    pos = (len(v) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def run_rounds(args):
    os.makedirs(args.out, exist_ok=True)
    failed = 0
    for r in range(1, args.rounds + 1):
        modes = args.modes if r % 2 else list(reversed(args.modes))
        for model in args.models:
            for mode in modes:
                path = os.path.join(args.out, "step_%s_%s_r%d.json" % (model, mode, r))
                cmd = [sys.executable, os.path.join(HERE, "train.py"), "--model", model,
                       "--mode", mode, "--steps", str(args.warmup + args.steps),
                       "--warmup", str(args.warmup), "--out", path]
                try:
                    run = subprocess.run(cmd, capture_output=True, text=True,
                                         timeout=args.timeout)
                    ok = run.returncode == 0
                    tail = (run.stdout + run.stderr).strip().splitlines()[-3:]
                except subprocess.TimeoutExpired:
                    ok, tail = False, ["timed out after %d s" % args.timeout]
                print("round %d %s %s: %s" % (r, model, mode, "ok" if ok else "FAILED"),
                      flush=True)
                if not ok:
                    failed += 1
                    for line in tail:
                        print("    | " + line)
    return failed


def load_runs(directory):
    """{(model, mode): {round: result}} from DIR/step_*_r*.json."""
    runs = {}
    for name in sorted(os.listdir(directory)):
        if not (name.startswith("step_") and name.endswith(".json")) or "_r" not in name:
            continue
        with open(os.path.join(directory, name)) as f:
            res = json.load(f)
        if "step_ms" not in res:
            continue  # skipped (no GPU, pool creation failed)
        rnd = int(name[:-5].rsplit("_r", 1)[1])
        runs.setdefault((res["model"], res["mode"]), {})[rnd] = res
    return runs


def summarise(directory):
    runs = load_runs(directory)
    if not runs:
        print("step_time: no run with step times in %s" % directory)
        return None
    rows, ratios = [], []
    for (model, mode), by_round in sorted(runs.items()):
        timed, medians, calls, steps = [], [], 0, 0
        counted = True
        for rnd in sorted(by_round):
            res = by_round[rnd]
            ms = res["step_ms"][res.get("warmup", 0):]
            timed += ms
            medians.append(statistics.median(ms))
            if res.get("device_calls_after_warmup") is None:
                counted = False
            else:
                calls += res["device_calls_after_warmup"]
            steps += len(ms)
        rows.append({"model": model, "mode": mode, "rounds": len(by_round), "steps": steps,
                     "median_ms": statistics.median(timed), "p10_ms": percentile(timed, 10),
                     "p90_ms": percentile(timed, 90), "round_medians_ms": medians,
                     "device_calls_per_step": calls / steps if counted and steps else None})
    for model in sorted({m for m, _ in runs}):
        native = runs.get((model, "native"), {})
        for (m, mode), by_round in sorted(runs.items()):
            if m != model or mode == "native":
                continue
            paired = [statistics.median(by_round[r]["step_ms"][by_round[r].get("warmup", 0):])
                      / statistics.median(native[r]["step_ms"][native[r].get("warmup", 0):])
                      for r in sorted(by_round) if r in native]
            if paired:
                ratios.append({"model": model, "mode": mode, "rounds": len(paired),
                               "median": statistics.median(paired), "min": min(paired),
                               "max": max(paired)})
    print("| model | allocator | rounds x steps | median step ms | p10-p90 ms | round medians ms "
          "| device calls / step |")
    print("|---|---|---:|---:|---:|---|---:|")
    for r in rows:
        calls = "-" if r["device_calls_per_step"] is None else "%.2f" % r["device_calls_per_step"]
        print("| %s | %s | %d x %d | %.2f | %.2f-%.2f | %s | %s |" % (
            r["model"], r["mode"], r["rounds"], r["steps"] // max(1, r["rounds"]),
            r["median_ms"], r["p10_ms"], r["p90_ms"],
            " ".join("%.2f" % m for m in r["round_medians_ms"]), calls))
    if ratios:
        print()
        print("| model | allocator / native, same round | median | range |")
        print("|---|---|---:|---:|")
        for q in ratios:
            print("| %s | %s (%d rounds) | %.3f | %.3f-%.3f |" % (
                q["model"], q["mode"], q["rounds"], q["median"], q["min"], q["max"]))
    summary = {"rows": rows, "ratios": ratios}
    with open(os.path.join(directory, "step_time.json"), "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)
    return summary


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="run the rounds, results into this folder")
    ap.add_argument("--summarise", metavar="DIR", help="only print the table of DIR's runs")
    ap.add_argument("--models", default="resnet50,gpt2")
    ap.add_argument("--modes", default="native,stowage")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60, help="timed steps per run (at least 60)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--timeout", type=int, default=150, help="seconds per run")
    args = ap.parse_args(argv)
    if args.summarise:
        return 0 if summarise(args.summarise) else 1
    if not args.out:
        ap.error("--out DIR or --summarise DIR")
    args.models = [m for m in args.models.split(",") if m]
    args.modes = [m for m in args.modes.split(",") if m]
    if "native" not in args.modes:
        ap.error("--modes: native is the baseline every ratio is taken against")
    if args.rounds < 1 or args.steps < 1 or args.warmup < 0:
        ap.error("--rounds and --steps: at least 1; --warmup: at least 0")
    failed = run_rounds(args)
    summarise(args.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
