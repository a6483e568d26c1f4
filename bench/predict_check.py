"""Predicted against real: `stowage predict` on the five workloads of ../shared/traces.

    python bench/predict_check.py [--gpu H200] [--traces ../shared/traces] [--only NAME ...]
                                  [--keep DIR] [--compare]

Each workload of ../shared/tools/record_torch_trace.py is a plain script in bench/predict/ (same
model, seeds and steps). This runs each under the recorder (a child process each, as
`python -m stowage predict` does), replays the predicted trace and the real one under the
PyTorch models (`stowage replay`), and prints, per workload: peak live bytes (what
torch.cuda.max_memory_allocated measures, unrounded), PyTorch native and expandable reserved
peaks, and events, predicted against real with the error in percent, and the seconds the
prediction took. The real figures are computed from the real trace, which gives those of
../shared/traces/README.md.

--compare adds, per workload, the difference of the two traces' allocation-size histograms
and the first allocation where the predicted sequence departs from the real one. --keep DIR
keeps the predicted traces. Exit status 1 if a prediction failed.

Needs the venv of python/requirements.txt (torch) and the stowage tool (build/stowage or PATH).
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

WORKLOADS = ["gpt2_train", "resnet50_train", "resnet_multiscale_train", "vit_train",
             "gpt2_generate"]


def replay_figures(trace):
    """{'live', 'native', 'expandable', 'events'} of a .rep file via `stowage replay`."""
    from stowage.__main__ import cli_path
    tool = cli_path()
    if tool is None:
        raise SystemExit("predict_check: the stowage tool was not found (make build)")
    cmd = [tool, "replay", "--json", "--repeats", "0", "--policy", "pytorch",
           "--policy", "pytorch-expandable", trace]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, check=True).stdout.decode()
    res = {}
    for line in out.splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            res["live"] = d["peak_live_bytes"]
            res["events"] = d["events"]
            key = "native" if d["policy"] == "pytorch" else "expandable"
            res[key] = d["peak_reserved_bytes"]
    return res


def read_allocs(trace):
    sizes = []
    with open(trace) as f:
        f.readline()
        for line in f:
            p = line.split()
            if p and p[0] == "a":
                sizes.append(int(p[2]))
    return sizes


def compare(real, pred, out=sys.stdout):
    a, b = read_allocs(real), read_allocs(pred)
    ca, cb = collections.Counter(a), collections.Counter(b)
    diff = sorted(((s, ca[s] - cb[s]) for s in set(ca) | set(cb) if ca[s] != cb[s]),
                  key=lambda d: -abs(d[1]) * d[0])
    out.write("    allocations: real %d, predicted %d\n" % (len(a), len(b)))
    if diff:
        out.write("    sizes real-minus-predicted (by bytes): %s\n"
                  % ", ".join("%d:%+d" % d for d in diff[:10]))
    else:
        out.write("    allocation-size histograms identical\n")
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            out.write("    first departure at allocation %d: real %d, predicted %d\n" % (i, x, y))
            break
    else:
        if len(a) == len(b):
            out.write("    allocation sizes identical in order\n")


def pct(p, r):
    return 100.0 * (p - r) / r if r else float("nan")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", default="H200")
    ap.add_argument("--traces", default=os.path.normpath(os.path.join(ROOT, "..", "shared",
                                                                       "traces")))
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--keep")
    ap.add_argument("--compare", action="store_true")
    ap.add_argument("--json", action="store_true", help="one JSON object per workload")
    opts = ap.parse_args(argv)
    from stowage import predict
    names = opts.only or WORKLOADS
    rows, failed = [], 0
    for name in names:
        script = os.path.join(ROOT, "bench", "predict", name + ".py")
        real_trace = os.path.join(opts.traces, name + ".rep")
        t0 = time.time()
        try:
            rec = predict.run_script(script, gpu=opts.gpu, tags=False, quiet=True)
        except predict.PredictFailed as exc:
            print("%s: prediction failed: %s" % (name, exc))
            failed += 1
            continue
        seconds = time.time() - t0
        pred_trace = rec.trace_path()
        if opts.keep:
            os.makedirs(opts.keep, exist_ok=True)
            rec.save(os.path.join(opts.keep, name + ".rep"), tags=False)
        p = replay_figures(pred_trace)
        r = replay_figures(real_trace) if os.path.exists(real_trace) else None
        rows.append((name, p, r, seconds))
        if opts.json:
            print(json.dumps({"workload": name, "gpu": opts.gpu, "seconds": round(seconds, 1),
                              "predicted": p, "real": r}))
        if opts.compare and r is not None:
            print("%s:" % name)
            compare(real_trace, pred_trace)
    if not opts.json:
        print("%-24s %-10s %15s %15s %8s %15s %15s %8s %15s %15s %8s %8s %8s %7s %6s" % (
            "workload", "", "peak live", "real", "err%", "native", "real", "err%",
            "expandable", "real", "err%", "events", "real", "err%", "s"))
        for name, p, r, seconds in rows:
            r = r or {}
            print("%-24s %-10s %15d %15s %+8.3f %15d %15s %+8.3f %15d %15s %+8.3f %8d %8s %+7.2f %6.1f" % (
                name, opts.gpu, p["live"], r.get("live", "-"), pct(p["live"], r.get("live", 0)),
                p["native"], r.get("native", "-"), pct(p["native"], r.get("native", 0)),
                p["expandable"], r.get("expandable", "-"),
                pct(p["expandable"], r.get("expandable", 0)),
                p["events"], r.get("events", "-"), pct(p["events"], r.get("events", 0)), seconds))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
