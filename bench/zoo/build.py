#!/usr/bin/env python3
"""bench/zoo/build.py: records the corpus of model workloads and writes its index.

    nice -n 10 PYTHON bench/zoo/build.py [--models A,B,...] [--jobs N] [--timeout S]
    python3 bench/zoo/build.py --unpack DIR [--models A,B,...]
    python3 bench/zoo/build.py --list
    python3 bench/zoo/build.py --training [--models A,B,...]

PYTHON is the recorder's environment (python/requirements.txt, `make deps`). Every workload of
bench/zoo/models.py (a model, a mode, a batch size) runs under `stowage.predict.record` with the
target card H100: a training run (AdamW, bf16 autocast, 3 steps; `train-ckpt` with activation
checkpointing, `train-varlen` with a new sequence length or image size at each of 4 steps), an
inference run (2 forward passes without gradients; transformers' token models in bf16 weights,
the others under bf16 autocast) or, for some decoders, `generate` (32 new tokens). Each model runs
in its own process, which stops after --timeout seconds.

Each trace goes to bench/zoo/traces/LIBRARY/MODEL.MODE.bBATCH.rep.gz (its tags beside it, as
.rep.tags.gz). bench/zoo/index.csv lists every recorded workload
(model,library,mode,batch,events,peak_live_bytes,trace); bench/zoo/failures.csv every workload
that could not be recorded (model,mode,batch,reason). With --models only those models are
recorded again; the rows of the others stay as they were.

Every `stowage` command reads the .rep.gz files as they are. --unpack DIR writes every indexed
trace there as a plain DIR/MODEL.MODE.bBATCH.rep (and its .rep.tags), for tools that read only
plain text. --training prints the paths of the training runs (modes train and train-ckpt), the
long runs of docs/benchmarks.md.
"""

import argparse
import csv
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))

import models as zoo  # noqa: E402

TRACES = os.path.join(HERE, "traces")
INDEX = os.path.join(HERE, "index.csv")
FAILURES = os.path.join(HERE, "failures.csv")
INDEX_FIELDS = ["model", "library", "mode", "batch", "events", "peak_live_bytes", "trace"]
FAILURE_FIELDS = ["model", "mode", "batch", "reason"]
GPU = "H100"
DEVICE = "cuda"


# ---- the traces ------------------------------------------------------------------------------

def trace_figures(lines):
    """(events, peak live bytes) of a .rep trace given as an iterable of lines: the header's
    event count checked against the events, the peak as `stow_trace_t.peak_live_bytes` (the
    largest sum of live requested sizes)."""
    it = iter(lines)
    header = next(it).split()
    ids, announced = int(header[0]), int(header[1])
    sizes, live, peak, events = {}, 0, 0, 0
    for line in it:
        f = line.split()
        if not f or f[0] in ("#", "m", "e") or f[0].startswith("#"):
            continue
        events += 1
        if f[0] == "a":
            sizes[f[1]] = int(f[2])
            live += int(f[2])
            peak = max(peak, live)
        elif f[0] == "f":
            live -= sizes.pop(f[1])
        else:
            raise ValueError(f"unexpected line {line!r}")
    if events != announced:
        raise ValueError(f"header announces {announced} events, trace has {events}")
    if ids < 0:
        raise ValueError("negative id count")
    return events, peak


def gz_figures(path):
    with gzip.open(path, "rt") as f:
        return trace_figures(f)


# ---- one workload, as a user's script would run it -----------------------------------------

def run_workload(m, mode, batch, dev):
    """Builds model m on device dev and runs one workload of it."""
    import torch
    torch.manual_seed(0)
    dev_type = torch.device(dev).type
    autocast = torch.autocast(dev_type, dtype=torch.bfloat16)
    if mode in ("infer", "generate"):
        bf16_weights = m.kind in ("mlm", "cls", "causal", "seq2seq")
        model = m.build().to(dev, dtype=torch.bfloat16) if bf16_weights else m.build().to(dev)
        model.eval()
        with torch.no_grad():
            if mode == "generate":
                L = m.opts["seq"] // 4
                ids = torch.randint(0, m.opts["vocab"], (batch, L), device=dev)
                model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                               max_new_tokens=32, min_new_tokens=32, do_sample=False,
                               pad_token_id=0)
                return
            for _ in range(zoo.INFER_STEPS):
                d = zoo.inputs(m, batch, dev)
                if bf16_weights:
                    out = zoo.forward(m, model, d)
                else:
                    with autocast:
                        out = zoo.forward(m, model, d)
                del out, d
        return
    model = m.build().to(dev)
    model.train()
    if mode == "train-ckpt":
        if m.library == "timm":
            model.set_grad_checkpointing(True)
        elif m.library == "diffusers":
            model.enable_gradient_checkpointing()
        else:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lengths = (zoo.seq_lengths(m, zoo.VARLEN_STEPS) if mode == "train-varlen"
               else [None] * zoo.TRAIN_STEPS)
    for length in lengths:
        d = zoo.inputs(m, batch, dev, length)
        with autocast:
            out = zoo.forward(m, model, d)
            loss = zoo.loss(m, out, d)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del out, loss, d


def recorder():
    """stowage.predict.record, imported before torch (the emulated card loads first)."""
    from stowage import predict
    return predict.record


def reason_of(e):
    """One line: the exception's type and message, where it was raised (the innermost frame
    outside bench/zoo) and, when that is not in the model's library, the innermost frame of the
    model's library (torchvision, timm, transformers, diffusers)."""
    msg = " ".join(str(e).replace(ROOT + os.sep, "").split())
    if len(msg) > 300:
        msg = msg[:297] + "..."
    frames = traceback.extract_tb(e.__traceback__)

    def name(fr):
        f = fr.filename
        f = f.split("site-packages/")[-1] if "site-packages/" in f else os.path.relpath(f, ROOT)
        return f"{f}:{fr.lineno} {fr.name}"

    outside = [fr for fr in frames if not fr.filename.startswith(HERE)]
    library = [fr for fr in frames if any(f"site-packages/{lib}/" in fr.filename for lib in (
        "torchvision", "timm", "transformers", "diffusers"))]
    where = ""
    if outside:
        where = f" (at {name(outside[-1])}"
        if library and library[-1] is not outside[-1]:
            where += f"; in {name(library[-1])}"
        where += ")"
    return f"{type(e).__name__}: {msg}{where}"


def worker(name, out_dir, skip=0):
    """Records the workloads of one model, the first `skip` left out; prints one JSON line per
    workload."""
    m = zoo.by_name(name)
    record = recorder()
    for _, mode, batch in list(zoo.workloads([m]))[skip:]:
        rel = zoo.trace_name(m, mode, batch)
        row = {"model": m.name, "library": m.library, "mode": mode, "batch": batch}
        t0 = time.time()
        try:
            with tempfile.TemporaryDirectory() as tmp:
                plain = os.path.join(tmp, "t.rep")
                with record(gpu=GPU) as rec:
                    run_workload(m, mode, batch, DEVICE)
                rec.save(plain)
                with open(plain) as f:
                    events, peak = trace_figures(f)
                dest = os.path.join(out_dir, rel)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                with open(plain, "rb") as fi, gzip.GzipFile(dest, "wb", 9, mtime=0) as fo:
                    shutil.copyfileobj(fi, fo)
                if os.path.exists(plain + ".tags"):
                    # the tags name the lines of bench/zoo relative to the repository
                    with open(plain + ".tags") as f:
                        tags = f.read().replace(ROOT + os.sep, "")
                    with gzip.GzipFile(dest[:-3] + ".tags.gz", "wb", 9, mtime=0) as fo:
                        fo.write(tags.encode())
            row.update(events=events, peak_live_bytes=peak, trace=rel)
        except Exception as e:  # noqa: BLE001 - every failure is listed with its reason
            row["reason"] = reason_of(e)
        row["seconds"] = round(time.time() - t0, 1)
        print(json.dumps(row), flush=True)


# ---- the driver ------------------------------------------------------------------------------

def read_csv(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_csv(path, fields, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, lineterminator="\n", extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def exit_reason(status, err):
    """Why a worker that exited with `status` reported no more workloads: its signal and the
    innermost Python frame of the crash (faulthandler), or its last line of error output."""
    import re
    import signal
    if status == 0:
        return None
    if status < 0:
        try:
            why = f"the worker died of {signal.Signals(-status).name}"
        except ValueError:
            why = f"the worker died of signal {-status}"
        frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)',
                            err.split("Current thread", 1)[-1])
        if frames:
            f, line, name = frames[0]
            f = f.split("site-packages/")[-1] if "site-packages/" in f else os.path.relpath(f, ROOT)
            why += f" in {f}:{line} {name}"
        return why
    last = err.strip().splitlines()[-1] if err.strip() else ""
    return f"the worker exited with status {status}" + (
        ": " + " ".join(last.split())[:300] if last else "")


def record_model(m, python, timeout, log):
    """Runs the worker of model m; returns its rows. A worker that dies leaves a failure row for
    the workload it was recording, and a new worker goes on with the next one; a timeout (for
    all the model's workloads together) fails every workload not yet reported."""
    todo = list(zoo.workloads([m]))
    rows, t0 = [], time.time()
    while len(rows) < len(todo):
        cmd = [python, "-X", "faulthandler", os.path.abspath(__file__), "--worker", m.name,
               "--skip", str(len(rows))]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=ROOT)
        left = timeout - (time.time() - t0)
        try:
            out, err = p.communicate(timeout=max(left, 1))
            why = exit_reason(p.returncode, err)
            timed_out = False
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            why = f"timeout: the model's workloads took more than {timeout} s"
            timed_out = True
        rows += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        for _, mode, batch in todo[len(rows):len(todo) if timed_out else len(rows) + 1]:
            rows.append({"model": m.name, "library": m.library, "mode": mode, "batch": batch,
                         "reason": why or "the worker reported nothing"})
    for r in rows:
        print(f"{r['model']:32} {r['mode']:12} b{r['batch']:<4} "
              + (f"{r['events']:>8} events {r['peak_live_bytes'] / 2**30:8.2f} GiB"
                 if "trace" in r else "FAILED " + r["reason"][:120])
              + f"  {r.get('seconds', '')}", file=log, flush=True)
    print(f"# {m.name}: {time.time() - t0:.0f} s", file=log, flush=True)
    return rows


def remove_traces(m):
    for _, mode, batch in zoo.workloads([m]):
        p = os.path.join(TRACES, zoo.trace_name(m, mode, batch))
        for path in (p, p[:-3] + ".tags.gz"):
            if os.path.exists(path):
                os.remove(path)


def merge(rows, redo):
    """Writes the index and the failures with `rows` in place of the rows of the models in
    `redo`, the rows of models absent from the table left out, in table order. Under a lock:
    several builds may write at once."""
    import fcntl
    names = {m.name for m in zoo.MODELS}
    order = {(m.name, mode, b): i for i, (m, mode, b) in enumerate(zoo.workloads())}
    key = lambda r: order.get((r["model"], r["mode"], int(r["batch"])), len(order))  # noqa: E731
    with open(INDEX, "a") as lock:  # the same file (inode) is rewritten below
        fcntl.flock(lock, fcntl.LOCK_EX)
        keep = lambda r: r["model"] not in redo and r["model"] in names  # noqa: E731
        index = [r for r in read_csv(INDEX) if keep(r)]
        failures = [r for r in read_csv(FAILURES) if keep(r)]
        for r in rows:
            (index if "trace" in r else failures).append(r)
        write_csv(INDEX, INDEX_FIELDS, sorted(index, key=key))
        write_csv(FAILURES, FAILURE_FIELDS, sorted(failures, key=key))
    return index, failures


def build(names, python, jobs, timeout):
    """Records the models (all, or those named) and merges each model's rows into the index and
    the failures as soon as it is done."""
    from concurrent.futures import ThreadPoolExecutor
    chosen = [zoo.by_name(n) for n in names] if names else zoo.MODELS

    def one(m):
        remove_traces(m)
        rows = record_model(m, python, timeout, sys.stdout)
        return merge(rows, {m.name})

    t0 = time.time()
    with ThreadPoolExecutor(jobs) as ex:
        list(ex.map(one, chosen))
    index, failures = merge([], set())
    archs = len({r["model"] for r in index})
    size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(TRACES) for f in fs)
    print(f"# {len(index)} workloads of {archs} models recorded, {len(failures)} failed; "
          f"traces {size / 2**20:.1f} MiB; {time.time() - t0:.0f} s")


def training_runs(names=None):
    """The committed paths of the indexed training runs whose step repeats (modes train and
    train-ckpt, both batch sizes; train-varlen changes shapes every step), in index order: the
    long runs of docs/benchmarks.md (bench/vmm_long_run.sh SET=zoo, bench/doc_tables.py)."""
    return [os.path.join(TRACES, r["trace"]) for r in read_csv(INDEX)
            if r["mode"] in ("train", "train-ckpt") and (not names or r["model"] in names)]


def unpack(dest, names):
    os.makedirs(dest, exist_ok=True)
    n = 0
    for r in read_csv(INDEX):
        if names and r["model"] not in names:
            continue
        src = os.path.join(TRACES, r["trace"])
        base = os.path.join(dest, os.path.basename(r["trace"])[:-3])
        for s, d in ((src, base), (src[:-3] + ".tags.gz", base + ".tags")):
            if os.path.exists(s):
                with gzip.open(s, "rb") as fi, open(d, "wb") as fo:
                    shutil.copyfileobj(fi, fo)
        n += 1
    print(f"{n} traces in {dest}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", help="comma-separated model names (default: all)")
    ap.add_argument("--jobs", type=int, default=1, help="models recorded at once")
    ap.add_argument("--timeout", type=int, default=900, help="seconds for one model's workloads")
    ap.add_argument("--python", default=sys.executable, help="the recorder's interpreter")
    ap.add_argument("--unpack", metavar="DIR", help="write the indexed traces as plain .rep")
    ap.add_argument("--list", action="store_true", help="print the workloads and exit")
    ap.add_argument("--training", action="store_true",
                    help="print the paths of the indexed training runs (train, train-ckpt)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--skip", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    names = a.models.split(",") if a.models else None
    if a.worker:
        worker(a.worker, TRACES, a.skip)
    elif a.unpack:
        unpack(a.unpack, names)
    elif a.training:
        for path in training_runs(names):
            print(path)
    elif a.list:
        for m, mode, b in zoo.workloads([zoo.by_name(n) for n in names] if names else None):
            print(m.library, m.name, mode, b)
    else:
        build(names, a.python, a.jobs, a.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
