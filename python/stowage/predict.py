"""Predict a PyTorch program's GPU memory on a machine without a GPU.

    python -m stowage predict [--gpu H100] [--json] [-o TRACE.rep] [--capacity 80GiB]
                              [--alpha 0.2] [--sweep NAME=v1,v2,...] SCRIPT [ARGS...]

The script runs unmodified in a child process under the recorder (recorder.py): fake CUDA
tensors on an emulated card (fake_gpu.py), every allocation and free of the caching allocator
written down in program order. The trace is then replayed under PyTorch's allocator models and
Stowage's policies (`stowage replay --min-capacity`), which give each one's peak reserved bytes
and the smallest device that runs the program. docs/predict.md has the method, the policy for
data-dependent calls and the accuracy against real GPU runs.

In a notebook, before torch is imported:

    import stowage.predict
    with stowage.predict.record(gpu="H100") as rec:
        ...                        # model code, on device="cuda"
    rec.summary()                  # the figures of --json, as a dict
    rec.save("step.rep")           # the trace (and step.rep.tags), for stowage replay/report

A program is one card: the first record() of a process fixes it.
"""

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from . import fake_gpu

POLICIES = ("pytorch", "pytorch-expandable", "classic", "vmm")
# Stowage's default pool (policy auto) on every card of fake_gpu.CARDS: their drivers map
# pages (CUDA's virtual memory management), so auto is the page-mapped pool.
DEFAULT_POLICY = "vmm"
EXIT_SCRIPT, EXIT_RECORDER, EXIT_USAGE, EXIT_NO_FIT = 1, 3, 2, 4

_HERE = os.path.dirname(os.path.abspath(__file__))


class PredictFailed(RuntimeError):
    """The run gave no figures: the script failed or could not be recorded."""


# ---- sizes ----

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 10 ** 3, "KIB": 1 << 10, "M": 1 << 20,
          "MB": 10 ** 6, "MIB": 1 << 20, "G": 1 << 30, "GB": 10 ** 9, "GIB": 1 << 30,
          "T": 1 << 40, "TB": 10 ** 12, "TIB": 1 << 40}


def parse_bytes(text):
    """'80GiB', '80G' (binary), '80GB' (decimal), '1.5TiB', '123' -> bytes."""
    s = str(text).strip().replace("_", "")
    i = len(s)
    while i > 0 and s[i - 1].isalpha():
        i -= 1
    number, unit = s[:i].strip(), s[i:].upper()
    if unit not in _UNITS or not number:
        raise ValueError("not a size: %r (e.g. 80GiB, 40G, 1500MB)" % text)
    value = float(number) * _UNITS[unit]
    if value <= 0:
        raise ValueError("not a positive size: %r" % text)
    return int(value)


def fmt_bytes(n):
    if n is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return "%.2f %s" % (n / size, unit)
    return "%d B" % n


# ---- replay through the stowage tool ----

def _tool():
    from .__main__ import cli_path
    return cli_path()


def replay(trace_path, policies=POLICIES):
    """{policy: {'peak_reserved_bytes', 'min_capacity_bytes'}} from `stowage replay
    --min-capacity --json` on the trace; {} without the stowage tool."""
    tool = _tool()
    if tool is None:
        return {}
    cmd = [tool, "replay", "--min-capacity", "--json", "--repeats", "0"]
    for p in policies:
        cmd += ["--policy", p]
    r = subprocess.run(cmd + [trace_path], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if r.returncode != 0:
        raise PredictFailed("stowage replay failed on %s: %s" % (
            trace_path, r.stderr.decode(errors="replace").strip()))
    out = {}
    for line in r.stdout.decode().splitlines():
        line = line.strip()
        if line.startswith("{"):
            d = json.loads(line)
            out[d["policy"]] = {"peak_reserved_bytes": d["peak_reserved_bytes"],
                                "min_capacity_bytes": d.get("min_capacity_bytes")}
    return out


def top_sources(trace_path, limit=8):
    """The tags holding the most bytes at the first peak of live bytes: [(tag, bytes, count)]."""
    tags = {}
    try:
        with open(trace_path + ".tags") as f:
            for line in f:
                i, _, tag = line.rstrip("\n").partition(" ")
                tags[int(i)] = tag
    except OSError:
        return []
    live, sizes = {}, {}
    cur = peak = 0
    best = {}
    with open(trace_path) as f:
        f.readline()
        for line in f:
            p = line.split()
            if not p:
                continue
            if p[0] == "a":
                i, s = int(p[1]), int(p[2])
                sizes[i] = s
                live[i] = True
                cur += s
                if cur > peak:
                    peak = cur
                    best = dict.fromkeys(live)
            elif p[0] == "f":
                i = int(p[1])
                live.pop(i, None)
                cur -= sizes[i]
    agg = {}
    for i in best:
        t = tags.get(i, "<untagged>")
        b, c = agg.get(t, (0, 0))
        agg[t] = (b + sizes[i], c + 1)
    rows = sorted(((t, b, c) for t, (b, c) in agg.items()), key=lambda r: -r[1])
    return rows[:limit]


# ---- the result ----

class Recording:
    """A recorded run: the trace, its figures and the policy answers."""

    def __init__(self, card, books=None, policy=None, notes=None, trace_path=None, meta=None):
        self.card = card
        self._books = books
        self._policy = policy
        self.notes = list(notes or [])
        self._trace_path = trace_path
        self._meta = meta or {}
        self._replayed = None
        self._tmp = None

    # figures known without a replay
    @property
    def peak_allocated_bytes(self):
        if self._books is not None:
            return self._books.peak_allocated_bytes
        return self._meta["peak_allocated_bytes"]

    @property
    def peak_live_bytes(self):
        return self._books.peak_live_bytes if self._books else self._meta["peak_live_bytes"]

    @property
    def events(self):
        return len(self._books.events) if self._books else self._meta["events"]

    @property
    def data_policy(self):
        if self._books is not None:
            return {"count": self._policy.count, "sites": self._policy.summary()}
        return self._meta.get("data_policy", {"count": 0, "sites": []})

    def trace_path(self):
        """A .rep file of the trace (written to a temporary folder on first use)."""
        if self._trace_path is None:
            self._tmp = tempfile.mkdtemp(prefix="stowage-predict-")
            self._trace_path = os.path.join(self._tmp, "trace.rep")
            self._books.write(self._trace_path)
        return self._trace_path

    def save(self, path, tags=True):
        """Writes the trace as a .rep file (and PATH.tags), for `stowage replay`, `report`,
        `plan` and `diff`."""
        if self._books is not None:
            self._books.write(path, tags=tags)
        else:
            shutil.copyfile(self.trace_path(), path)
            if tags and os.path.exists(self.trace_path() + ".tags"):
                shutil.copyfile(self.trace_path() + ".tags", path + ".tags")

    def policies(self):
        if self._replayed is None:
            self._replayed = replay(self.trace_path())
        return self._replayed

    def summary(self):
        """The figures of `predict --json`, as a dict."""
        out = {"peak_allocated_bytes": self.peak_allocated_bytes, "events": self.events,
               "gpu": self.card.key, "policies": self.policies(),
               "default_policy": DEFAULT_POLICY}
        out["peak_live_bytes"] = self.peak_live_bytes
        out["context_bytes"] = self.card.context_bytes
        out["data_dependent"] = self.data_policy
        if self.notes:
            out["notes"] = self.notes
        return out

    def fits(self, capacity_bytes, alpha=0.0):
        """{policy: (fits, need_bytes)}: need = peak reserved x (1 + alpha) + the context."""
        res = {}
        for p, d in self.policies().items():
            need = int(d["peak_reserved_bytes"] * (1 + alpha)) + self.card.context_bytes
            res[p] = (need <= capacity_bytes, need)
        return res

    def __del__(self):
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)


_card_in_process = None


@contextlib.contextmanager
def record(gpu=None, tags=True):
    """Records the block's CUDA allocations on the card `gpu` (H100, H200, A100-80GB, A100-40GB).
    Must run before torch is imported in the process (the emulated device loads first)."""
    global _card_in_process
    target = fake_gpu.card(gpu)
    if _card_in_process is not None and _card_in_process is not target:
        raise fake_gpu.FakeCudaError("this process already emulates %s; one card per process"
                                     % _card_in_process.key)
    fake_gpu.load(target)
    _card_in_process = target
    from . import recorder  # imports torch, after the emulated device
    rec = recorder.Recorder(target, tags=tags)
    result = Recording(target, rec.books, rec.policy, rec.notes)
    rec.install()
    try:
        yield result
    finally:
        rec.uninstall()
        rec.books.closed = True


# ---- the child process: runs the script under the recorder ----

def _child(argv):
    """--child OUTDIR GPU TAGS -- SCRIPT ARGS...: records the script, writes OUTDIR/trace.rep,
    trace.rep.tags and result.json. Exit 0, EXIT_SCRIPT (the script raised: its traceback is
    printed) or EXIT_RECORDER (a PredictError: the message is printed)."""
    outdir, gpu, tags = argv[0], argv[1], argv[2] == "1"
    script, script_args = argv[4], argv[5:]
    target = fake_gpu.card(gpu)
    fake_gpu.load(target)
    import runpy
    t0 = time.time()
    from . import recorder
    rec = recorder.Recorder(target, tags=tags)
    sys.argv = [script] + list(script_args)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    status, message = 0, None
    keep = None
    try:
        rec.install()
        keep = runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        if code not in (None, 0):
            status = EXIT_SCRIPT
            message = "the script exited with status %s" % code
    except recorder.PredictError as exc:
        status, message = EXIT_RECORDER, str(exc)
    except BaseException as exc:  # the user's error: its own traceback
        status = EXIT_SCRIPT
        sys.stdout.flush()
        _print_user_traceback(exc)
        message = "%s: %s" % (type(exc).__name__, exc)
        for note in getattr(exc, "__notes__", ()):
            if note.startswith("stowage predict: "):
                message += " (%s)" % note[len("stowage predict: "):]
    finally:
        rec.uninstall()
        rec.books.closed = True
    del keep
    refused = fake_gpu.refused_calls()
    if status == 0 and refused:
        status, message = EXIT_RECORDER, (
            "%d call(s) tried to allocate or copy real device memory (tensors made outside the "
            "recorder); the trace would be incomplete" % refused)
    result = {"status": status, "message": message, "seconds": time.time() - t0}
    if status == 0:
        path = os.path.join(outdir, "trace.rep")
        rec.books.write(path, tags=tags)
        result.update({"peak_allocated_bytes": rec.books.peak_allocated_bytes,
                       "peak_live_bytes": rec.books.peak_live_bytes,
                       "events": len(rec.books.events),
                       "streams": len(rec.books.streams),
                       "data_policy": {"count": rec.policy.count,
                                       "sites": rec.policy.summary()},
                       "notes": rec.notes})
    with open(os.path.join(outdir, "result.json"), "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # no interpreter teardown: fake tensors' finalisers are not the script's


def _print_user_traceback(exc):
    """The exception's traceback without the recorder's frames (runpy's, this package's)."""
    import runpy
    import traceback
    hidden = (_HERE + os.sep, os.path.dirname(runpy.__file__) + os.sep + "runpy")
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(hidden) and f.filename != "<frozen runpy>"]
    lines = ["Traceback (most recent call last):\n"] + traceback.format_list(frames)
    lines += traceback.format_exception_only(type(exc), exc)
    sys.stderr.write("".join(lines))


def recorder_python():
    """The interpreter that runs the recorder: this one where it imports torch, else the
    environment `make deps` makes (STOWAGE_VENV, else ~/.cache/stowage/venv). Raises
    PredictFailed, naming what to do, where neither has torch."""
    if importlib.util.find_spec("torch") is not None:
        return sys.executable
    venv = os.environ.get("STOWAGE_VENV") or os.path.expanduser("~/.cache/stowage/venv")
    py = os.path.join(venv, "bin", "python")
    if os.access(py, os.X_OK) and subprocess.run([py, "-c", "import torch"],
                                                 capture_output=True).returncode == 0:
        return py
    err = PredictFailed("%s cannot import torch, and %s has no environment with it: predict "
                        "needs PyTorch 2.11 built for CUDA 13 (python/requirements.txt; `make "
                        "deps` makes that environment)" % (sys.executable, venv))
    err.status = EXIT_RECORDER
    raise err


def run_script(script, args=(), gpu=None, tags=True, env=None, quiet=False):
    """Runs SCRIPT with ARGS under the recorder in a child process; returns a Recording whose
    trace lives in a temporary folder. Raises PredictFailed (no figures) if the script raised
    or could not be recorded; its output (and traceback) went to this process's streams, or
    nowhere with quiet."""
    target = fake_gpu.card(gpu)
    if not os.path.isfile(script):
        raise PredictFailed("%s: no such file" % script)
    python = recorder_python()
    lib = fake_gpu.library_path()
    tmp = tempfile.mkdtemp(prefix="stowage-predict-")
    child_env = dict(os.environ if env is None else env)
    child_env["LD_PRELOAD"] = lib + (":" + child_env["LD_PRELOAD"]
                                     if child_env.get("LD_PRELOAD") else "")
    pkg_parent = os.path.dirname(_HERE)
    child_env["PYTHONPATH"] = pkg_parent + (os.pathsep + child_env["PYTHONPATH"]
                                            if child_env.get("PYTHONPATH") else "")
    cmd = [python, "-m", "stowage.predict", "--child", tmp, target.key,
           "1" if tags else "0", "--", script] + list(args)
    out = subprocess.DEVNULL if quiet else None
    r = subprocess.run(cmd, env=child_env, stdout=out, stderr=out)
    try:
        with open(os.path.join(tmp, "result.json")) as f:
            result = json.load(f)
    except (OSError, ValueError):
        shutil.rmtree(tmp, ignore_errors=True)
        raise PredictFailed("the recorder's process ended with status %d and no result (killed? "
                            "out of host memory?)" % r.returncode)
    if result["status"] != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        err = PredictFailed(result.get("message") or "the script failed")
        err.status = result["status"]
        raise err
    rec = Recording(target, trace_path=os.path.join(tmp, "trace.rep"), meta=result,
                    notes=result.get("notes"))
    rec._tmp = tmp
    rec.seconds = result.get("seconds")
    return rec


# ---- the command ----

USAGE = """usage: python -m stowage predict [options] SCRIPT [ARGS...]

Runs SCRIPT (unmodified, device="cuda") on fake tensors on an emulated GPU, records every
allocation and free of PyTorch's caching allocator, and prints the peak allocated bytes, each
policy's peak reserved bytes and smallest device, and the lines holding the most memory at the
peak. Nothing runs on a GPU.

options (before SCRIPT):
  --gpu NAME          the card: %s (default %s)
  --json              one JSON object, the last line of stdout
  -o, --output TRACE  keep the trace (TRACE and TRACE.tags) for stowage replay/report/diff
  --capacity SIZE     fit test on a device of SIZE (80GiB, 40G, ...): exit 4 if no policy fits
  --alpha A           headroom of the fit test: need = peak reserved x (1 + A) + CUDA context
  --sweep NAME=V,...  rerun with environment variable NAME set to each value; a table, a
                      plot (--plot FILE, default predict_sweep.html) and the largest that fits
  --plot FILE         where --sweep writes its plot (.html, or .png with matplotlib)
  --no-tags           skip the user's line per allocation (faster)
Exit status: 0, 1 the script failed, 2 bad usage, 3 the recorder could not trace it, 4 no fit.
"""


def _parser():
    p = argparse.ArgumentParser(prog="python -m stowage predict", add_help=False,
                                usage=argparse.SUPPRESS)
    p.add_argument("--gpu", default=fake_gpu.DEFAULT_CARD)
    p.add_argument("--json", action="store_true")
    p.add_argument("-o", "--output")
    p.add_argument("--capacity")
    p.add_argument("--alpha", type=float, default=0.0)
    p.add_argument("--sweep")
    p.add_argument("--plot")
    p.add_argument("--no-tags", action="store_true")
    p.add_argument("-h", "--help", action="store_true")
    p.add_argument("script", nargs="?")
    p.add_argument("args", nargs=argparse.REMAINDER)
    return p


def _usage_error(msg):
    sys.stderr.write("stowage predict: %s\n" % msg)
    sys.stderr.write(USAGE % (", ".join(fake_gpu.CARDS), fake_gpu.DEFAULT_CARD))
    return EXIT_USAGE


def _print_report(rec, capacity, alpha, out=sys.stdout):
    w = out.write
    card = rec.card
    w("stowage predict: %s on %s\n" % (rec._meta.get("script", ""), card.describe()))
    w("  events %d, peak allocated %s (%d B), peak live %s\n" % (
        rec.events, fmt_bytes(rec.peak_allocated_bytes), rec.peak_allocated_bytes,
        fmt_bytes(rec.peak_live_bytes)))
    pols = rec.policies()
    if pols:
        w("  %-20s %16s %16s\n" % ("policy", "peak reserved", "min device"))
        for p in POLICIES:
            if p in pols:
                d = pols[p]
                w("  %-20s %16s %16s%s\n" % (p, fmt_bytes(d["peak_reserved_bytes"]),
                                            fmt_bytes(d["min_capacity_bytes"]),
                                            "  (Stowage's default)" if p == DEFAULT_POLICY
                                            else ""))
    else:
        w("  (no stowage tool found: policies not replayed; build it with `make build`)\n")
    if capacity is not None and pols:
        w("  fit on %s, need = peak reserved x %.2f + CUDA context %s:\n" % (
            fmt_bytes(capacity), 1 + alpha, fmt_bytes(card.context_bytes)))
        for p, (ok, need) in rec.fits(capacity, alpha).items():
            w("    %-18s %-6s need %s\n" % (p, "fits" if ok else "NO", fmt_bytes(need)))
    dp = rec.data_policy
    if dp["count"]:
        w("  data-dependent values taken as zeros (no data on fake tensors): %d, at\n"
          % dp["count"])
        for s in dp["sites"]:
            w("    %s %s (%d)\n" % (s["op"], s["line"], s["count"]))
    for n in rec.notes:
        if n == "torch.compile":
            w("  note: torch.compile'd code was recorded eagerly (no Inductor fusion)\n")
    src = top_sources(rec.trace_path())
    if src:
        w("  at the peak of live bytes, by line:\n")
        for tag, b, c in src:
            w("    %10s  %5d  %s\n" % (fmt_bytes(b), c, tag))


def _sweep(opts, capacity):
    name, _, values = opts.sweep.partition("=")
    values = [v for v in values.split(",") if v != ""]
    if not name or not values:
        return _usage_error("--sweep NAME=v1,v2,... (an environment variable and its values)")
    rows = []
    for v in values:
        env = dict(os.environ)
        env[name] = v
        try:
            rec = run_script(opts.script, opts.args, gpu=opts.gpu, tags=False, env=env,
                             quiet=opts.json)
            rows.append((v, rec, rec.summary()))
        except PredictFailed as exc:
            rows.append((v, None, {"error": str(exc)}))
        if not opts.json:
            s = rows[-1][2]
            sys.stderr.write("  %s=%s: %s\n" % (name, v, fmt_bytes(s.get("peak_allocated_bytes"))
                                                if "error" not in s else s["error"]))
    largest = None
    if capacity is not None:
        for v, rec, s in rows:
            if rec is not None and rec.fits(capacity, opts.alpha).get("pytorch", (False,))[0]:
                largest = v
    plot = opts.plot or "predict_sweep.html"
    _write_plot(plot, name, rows)
    if opts.json:
        print(json.dumps({"sweep": name, "gpu": fake_gpu.card(opts.gpu).key,
                          "values": [dict(s, value=v) for v, _, s in rows],
                          "largest_fit": largest, "plot": plot}))
    else:
        print("%-12s %16s %18s %18s" % (name, "peak allocated", "pytorch reserved",
                                         "expandable"))
        for v, rec, s in rows:
            if rec is None:
                print("%-12s %s" % (v, s["error"]))
                continue
            pol = s["policies"]
            print("%-12s %16s %18s %18s" % (
                v, fmt_bytes(s["peak_allocated_bytes"]),
                fmt_bytes(pol.get("pytorch", {}).get("peak_reserved_bytes")),
                fmt_bytes(pol.get("pytorch-expandable", {}).get("peak_reserved_bytes"))))
        if capacity is not None:
            print("largest %s that fits %s (pytorch, alpha %.2f): %s" % (
                name, fmt_bytes(capacity), opts.alpha, largest if largest is not None else "none"))
        print("plot: %s" % plot)
    return 0 if any(rec is not None for _, rec, _ in rows) else EXIT_SCRIPT


def _write_plot(path, name, rows):
    """The sweep's peaks by value: a PNG with matplotlib, else a self-contained HTML page."""
    series = [("peak allocated", [s.get("peak_allocated_bytes") for _, _, s in rows])]
    for p in ("pytorch", "pytorch-expandable"):
        series.append((p + " reserved", [s.get("policies", {}).get(p, {}).get(
            "peak_reserved_bytes") for _, _, s in rows]))
    labels = [v for v, _, _ in rows]
    if path.endswith(".png"):
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            path = path[:-4] + ".html"
        else:
            fig, ax = plt.subplots(figsize=(6, 4))
            for label, ys in series:
                ax.plot(labels, [y / (1 << 30) if y else None for y in ys], marker="o",
                        label=label)
            ax.set_xlabel(name)
            ax.set_ylabel("GiB")
            ax.legend()
            fig.savefig(path, dpi=100)
            return path
    width, height, pad = 640, 360, 50
    ymax = max([y for _, ys in series for y in ys if y] or [1])
    n = max(len(labels) - 1, 1)
    colors = ("#1f77b4", "#d62728", "#2ca02c")
    svg = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d">' % (width, height)]
    for k, (label, ys) in enumerate(series):
        pts = ["%.1f,%.1f" % (pad + i * (width - 2 * pad) / n,
                              height - pad - (y / ymax) * (height - 2 * pad))
               for i, y in enumerate(ys) if y]
        svg.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>'
                   % (colors[k], " ".join(pts)))
        svg.append('<text x="%d" y="%d" fill="%s">%s</text>' % (pad, 16 + 16 * k, colors[k],
                                                                label))
    for i, v in enumerate(labels):
        svg.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>'
                   % (pad + i * (width - 2 * pad) / n, height - pad + 20, v))
    svg.append('<text x="%d" y="%d">%s (max %.2f GiB)</text>' % (width - 220, 16, name,
                                                                ymax / (1 << 30)))
    svg.append("</svg>")
    table = "".join("<tr><td>%s</td>%s</tr>" % (v, "".join(
        "<td>%s</td>" % fmt_bytes(ys[i]) for _, ys in series)) for i, v in enumerate(labels))
    with open(path, "w") as f:
        f.write("<!doctype html><meta charset=utf-8><title>stowage predict --sweep %s</title>"
                "<h1>%s</h1>%s<table border=1><tr><th>%s</th>%s</tr>%s</table>"
                % (name, name, "".join(svg), name,
                   "".join("<th>%s</th>" % s for s, _ in series), table))
    return path


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        return _child(argv[1:])
    try:
        opts = _parser().parse_args(argv)
    except SystemExit:
        return _usage_error("bad arguments")
    if opts.help:
        sys.stdout.write(USAGE % (", ".join(fake_gpu.CARDS), fake_gpu.DEFAULT_CARD))
        return 0
    if not opts.script:
        return _usage_error("no SCRIPT given")
    try:
        fake_gpu.card(opts.gpu)
    except ValueError as exc:
        return _usage_error(str(exc))
    capacity = None
    if opts.capacity:
        try:
            capacity = parse_bytes(opts.capacity)
        except ValueError as exc:
            return _usage_error(str(exc))
    if opts.alpha < 0:
        return _usage_error("--alpha must be >= 0")
    try:
        if opts.sweep:
            return _sweep(opts, capacity)
        rec = run_script(opts.script, opts.args, gpu=opts.gpu, tags=not opts.no_tags)
        rec._meta["script"] = opts.script
        if opts.output:
            rec.save(opts.output, tags=not opts.no_tags)
        sys.stdout.flush()
        if opts.json:
            s = rec.summary()
            s["seconds"] = rec.seconds
            if capacity is not None:
                s["capacity_bytes"] = capacity
                s["alpha"] = opts.alpha
                s["fits"] = {p: ok for p, (ok, _) in rec.fits(capacity, opts.alpha).items()}
            print(json.dumps(s))
        else:
            _print_report(rec, capacity, opts.alpha)
    except PredictFailed as exc:
        sys.stdout.flush()
        sys.stderr.write("stowage predict: %s\nstowage predict: no figures: the run was not "
                         "recorded whole\n" % exc)
        return getattr(exc, "status", EXIT_SCRIPT)
    except fake_gpu.FakeCudaError as exc:
        sys.stderr.write("stowage predict: %s\n" % exc)
        return EXIT_RECORDER
    if capacity is not None and not any(ok for ok, _ in rec.fits(capacity, opts.alpha).values()):
        return EXIT_NO_FIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
