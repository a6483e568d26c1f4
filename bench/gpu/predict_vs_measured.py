"""`stowage predict` against the GPU: run.sh part 10.

    python3 bench/gpu/predict_vs_measured.py --out FILE [--gpu H100|H200] [--only NAME ...]
    python3 bench/gpu/predict_vs_measured.py --table FILE

For each script of bench/predict/ (or those --only names): `python3 -m stowage predict --json
--gpu CARD` (CARD from nvidia-smi, else torch.cuda.get_device_name: H200 or H100), then the same
script for real under bench/gpu/measure_script.py, once with PyTorch's default allocator and
once with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True. FILE (JSON, rewritten after each
workload) holds both sides; the table printed last gives, per workload, predicted against
measured peak allocated bytes, native reserved and expandable reserved, each with the error
in percent ((predicted - measured) / measured). --table prints that table from such a FILE.

The predicted reserved peaks need the stowage tool (build/stowage, or on PATH: run.sh puts
.gpu-carry/prof/stowage there); without it they are null. Exit status 1 if a run failed.
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
PREDICT_DIR = os.path.join(ROOT, "bench", "predict")
MEASURE = os.path.join(ROOT, "bench", "gpu", "measure_script.py")
COLUMNS = [("allocated", "peak allocated"), ("native", "native reserved"),
           ("expandable", "expandable reserved")]


def workloads():
    return sorted(os.path.splitext(os.path.basename(p))[0]
                  for p in glob.glob(os.path.join(PREDICT_DIR, "*.py")))


def card_of(name):
    """'H200' or 'H100' from a device name; None for any other card."""
    name = (name or "").upper()
    for key in ("H200", "H100"):
        if key in name:
            return key
    return None


def detect_card():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
        names = out.splitlines()
    except (OSError, subprocess.SubprocessError):
        names = []
    if not names or card_of(names[0]) is None:
        r = subprocess.run([sys.executable, "-c",
                            "import torch; print(torch.cuda.get_device_name(0))"],
                           capture_output=True, text=True, timeout=120)
        names = r.stdout.splitlines()
    return (card_of(names[0]) if names else None), (names[0].strip() if names else "")


def last_json(text):
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    return None


def run_json(cmd, env, timeout, log):
    """The last JSON line CMD prints, or None (its output tail goes to LOG)."""
    t0 = time.time()
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        out, rc = r.stdout, r.returncode
        err = r.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err, rc = "timeout after %ds" % timeout, 124
    d = last_json(out) if rc == 0 else None
    if d is None:
        log.write("  %s: rc %d\n%s\n" % (" ".join(cmd[-3:]), rc, "\n".join(
            (out + "\n" + err).strip().splitlines()[-15:])))
    log.write("  %s: %.1fs\n" % (os.path.basename(cmd[-1]), time.time() - t0))
    log.flush()
    return d


def err_pct(pred, meas):
    if pred is None or not meas:
        return None
    return 100.0 * (pred - meas) / meas


def measure_workload(name, card, timeout):
    script = os.path.join("bench", "predict", name + ".py")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "python") + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    p = run_json([sys.executable, "-m", "stowage", "predict", "--json", "--gpu", card, script],
                 env, timeout, sys.stderr)
    plain = dict(os.environ)
    plain.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    plain.pop("STOWAGE_CONF", None)
    m_native = run_json([sys.executable, MEASURE, script], plain, timeout, sys.stderr)
    m_exp = run_json([sys.executable, MEASURE, script],
                     dict(plain, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"),
                     timeout, sys.stderr)
    pol = (p or {}).get("policies") or {}
    predicted = {"allocated": (p or {}).get("peak_allocated_bytes"),
                 "native": (pol.get("pytorch") or {}).get("peak_reserved_bytes"),
                 "expandable": (pol.get("pytorch-expandable") or {}).get("peak_reserved_bytes"),
                 "seconds": (p or {}).get("seconds")}
    measured = {"allocated": (m_native or {}).get("peak_allocated_bytes"),
                "allocated_expandable": (m_exp or {}).get("peak_allocated_bytes"),
                "native": (m_native or {}).get("peak_reserved_bytes"),
                "expandable": (m_exp or {}).get("peak_reserved_bytes")}
    row = {"workload": name, "predicted": predicted, "measured": measured,
           "error_pct": {k: err_pct(predicted[k], measured[k]) for k, _ in COLUMNS},
           "ok": p is not None and m_native is not None and m_exp is not None}
    return row


def gib(n):
    return "-" if n is None else "%.2f" % (n / 2.0 ** 30)


def pct(e):
    return "-" if e is None else "%+.1f%%" % e


def table(result):
    """The table's lines from a predict_vs_measured.json object."""
    lines = ["predicted against measured on %s (%s), GiB: predicted / measured (error)"
             % (result.get("gpu", "?"), result.get("device_name", "?")),
             "| workload | " + " | ".join(t for _, t in COLUMNS) + " |",
             "|---|" + "---|" * len(COLUMNS)]
    for row in result.get("workloads", []):
        cells = []
        for k, _ in COLUMNS:
            pr, me = row["predicted"].get(k), row["measured"].get(k)
            cells.append("%s / %s (%s)" % (gib(pr), gib(me), pct(err_pct(pr, me))))
        lines.append("| %s | %s |" % (row["workload"], " | ".join(cells)))
    return lines


def write(path, result):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="the JSON file written")
    ap.add_argument("--table", metavar="FILE", help="print the table of FILE and exit")
    ap.add_argument("--gpu", choices=["H100", "H200"], help="the card (default: this one)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="these workloads alone")
    ap.add_argument("--timeout", type=int, default=150, help="seconds per run (150)")
    a = ap.parse_args(argv)
    if a.table:
        with open(a.table) as f:
            print("\n".join(table(json.load(f))))
        return 0
    if not a.out:
        ap.error("--out FILE or --table FILE")
    names = workloads()
    if a.only:
        unknown = [n for n in a.only if n not in names]
        if unknown:
            ap.error("no such workload: %s (bench/predict has %s)"
                     % (", ".join(unknown), ", ".join(names)))
        names = a.only
    card, device_name = (a.gpu, "") if a.gpu else detect_card()
    if card is None:
        sys.stderr.write("predict_vs_measured: not an H100 or H200 (%r); say --gpu\n"
                         % device_name)
        return 2
    result = {"gpu": card, "device_name": device_name, "workloads": []}
    for name in names:
        sys.stderr.write("%s\n" % name)
        result["workloads"].append(measure_workload(name, card, a.timeout))
        write(a.out, result)
    write(a.out, result)
    print("\n".join(table(result)))
    return 0 if all(r["ok"] for r in result["workloads"]) else 1


if __name__ == "__main__":
    sys.exit(main())
