#!/usr/bin/env python3
"""bench/doc_tables.py: the replay tables of README.md and docs/benchmarks.md, from the code.

    python3 bench/doc_tables.py --print                 # every table, as Markdown
    python3 bench/doc_tables.py --check README.md docs/benchmarks.md
    python3 bench/doc_tables.py --write README.md docs/benchmarks.md

A table in a document follows a marker line `<!-- doc_tables:NAME -->`; a document without one
is an error (exit 2), as is --check or --write without a document. --check regenerates
each marked table and fails (exit 1, with both versions) when the document differs; --write
replaces it. The tables hold only figures a replay reproduces exactly (bytes, ratios, calls):
host time moves with the machine and is left to bench/replay_all.sh.

The replays: `STOWAGE replay --policy all --policy ideal-remap --min-capacity --json --repeats 1`
on the five shared traces (TRACES, default ../shared/traces beside the repository), about 10 s on
2 cores. PyTorch's own figures come from TRACES/README.md (measured on an H200).
With --heldout SNAPSHOTS it also makes the held-out tables, the calls by group, the long-run
and loop tables from bench/scaled_traces.py, bench/mixed_heldout.sh, bench/snapshot_heldout.sh,
bench/zoo/heldout.sh, bench/vmm_calls.py, bench/vmm_long_run.sh (the shared traces, and
SET=zoo), bench/random_loops.py, bench/long_run.py on the corpus's training runs and
build/vmm_churn (about 15 minutes on 2 cores, the corpus's rows 5.5 of them; each script's wall
time goes to standard error); without it those tables are left as they are.
Exit status: 0 ok, 1 a table differs, 2 bad usage or input, 77 the traces are missing.
"""
import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
TRACES = ["gpt2_train", "resnet50_train", "resnet_multiscale_train", "vit_train", "gpt2_generate"]
MARKER = re.compile(r"<!-- doc_tables:([a-z_]+) -->")
HELDOUT_TABLES = ("heldout", "vmm_groups", "long", "loops")  # made only with --heldout


def replay(stowage, traces_dir):
    paths = [os.path.join(traces_dir, t + ".rep") for t in TRACES]
    cmd = [stowage, "replay", "--policy", "all", "--policy", "ideal-remap", "--min-capacity",
           "--json", "--repeats", "1"] + paths
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"doc_tables: {' '.join(cmd)} failed:\n{out.stderr}")
    rows = {}
    for line in out.stdout.splitlines():
        j = json.loads(line)
        rows.setdefault(os.path.basename(j["trace"])[:-4], {})[j["policy"]] = j
    return rows


def pytorch_figures(traces_dir):
    """PyTorch's max reserved bytes per trace: {trace: (native, expandable)}."""
    figures = {}
    with open(os.path.join(traces_dir, "README.md")) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 4 and cells[0] in TRACES:
                figures[cells[0]] = tuple(int(c.split()[0]) for c in cells[2:4])
    missing = [t for t in TRACES if t not in figures]
    if missing:
        sys.exit(f"doc_tables: {traces_dir}/README.md: no figures for {', '.join(missing)}")
    return figures


def ratio(j, key="peak_reserved_bytes"):
    return j[key] / j["peak_live_bytes"]


def table_readme(rows, real):
    out = ["| trace | peak live | Stowage classic | Stowage vmm | PyTorch native | "
           "PyTorch expandable |", "|---|---:|---:|---:|---:|---:|"]
    for t in TRACES:
        r = rows[t]
        live = r["classic"]["peak_live_bytes"]
        out.append(f"| {t} | {live / 2**30:.2f} GiB | {ratio(r['classic']):.3f} | "
                   f"{ratio(r['vmm']):.4f} | {real[t][0] / live:.3f} | {real[t][1] / live:.3f} |")
    return out


POLICIES = ["classic", "vmm", "pytorch", "pytorch-expandable", "naive", "jemalloc", "ideal-remap"]


def table_memory(rows, real):
    out = ["| trace | " + " | ".join(POLICIES) + " |", "|---|" + "---:|" * len(POLICIES)]
    for t in TRACES:
        cells = []
        for p in POLICIES:
            j = rows[t][p]
            cell = f"{ratio(j):.4f}"
            if j.get("min_capacity_bytes") and p != "ideal-remap":
                cell += f" ({ratio(j, 'min_capacity_bytes'):.4f})"
            cells.append(cell)
        out.append(f"| {t} | " + " | ".join(cells) + " |")
    return out


def table_calls(rows, real):
    pols = ["classic", "vmm", "pytorch", "pytorch-expandable", "naive", "ideal-remap"]
    out = ["| trace | events | " + " | ".join(pols) + " |", "|---|---:|" + "---:|" * len(pols)]
    for t in TRACES:
        cells = []
        for p in pols:
            j = rows[t][p]
            maps = (j.get("map_calls") or 0) + (j.get("unmap_calls") or 0)
            both = maps and maps != j["backend_calls"]
            cells.append(f"{j['backend_calls']}" + (f" ({maps})" if both else ""))
        out.append(f"| {t} | {rows[t]['classic']['events']} | " + " | ".join(cells) + " |")
    return out


def table_vmm(rows, real):
    out = ["| trace | map | unmap | events recorded | events waited on | synchronizes |",
           "|---|---:|---:|---:|---:|---:|"]
    for t in TRACES:
        j = rows[t]["vmm"]
        out.append(f"| {t} | {j['map_calls']} | {j['unmap_calls']} | {j['event_records']} | "
                   f"{j['event_waits']} | {j['sync_calls']} |")
    return out


def table_models(rows, real):
    out = ["| trace | mode | model peak reserved | PyTorch 2.11 | error |", "|---|---|---:|---:|---:|"]
    for t in TRACES:
        for mode, policy, ref in (("native", "pytorch", real[t][0]),
                                  ("expandable", "pytorch-expandable", real[t][1])):
            got = rows[t][policy]["peak_reserved_bytes"]
            out.append(f"| {t} | {mode} | {got} | {ref} | {100.0 * (got - ref) / ref:+.3f} % |")
    return out


TABLES = {"readme": table_readme, "memory": table_memory, "calls": table_calls,
          "vmm": table_vmm, "models": table_models}


def run_script(args, env=None):
    """The script's standard output; its wall time goes to standard error."""
    import time
    start = time.monotonic()
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, **(env or {})))
    if out.returncode != 0:
        sys.exit(f"doc_tables: {' '.join(args)} failed:\n{out.stderr[-2000:]}")
    settings = " ".join(f"{k}={v}" for k, v in (env or {}).items())
    shown = " ".join(a if len(a) < 60 else "..." for a in args[:6])
    print(f"doc_tables: {settings + ' ' if settings else ''}{shown}{' ...' if len(args) > 6 else ''}"
          f": {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    return out.stdout


def summary_count(text, prefix):
    """(count, the list after it) of a summary line 'PREFIX: N: a 1.01, b 1.02'."""
    for line in text.splitlines():
        if line.startswith(prefix):
            rest = line[len(prefix):].lstrip(": ")
            count, _, items = rest.partition(":")
            return int(count), items.strip()
    sys.exit(f"doc_tables: no '{prefix}' line in the script's output")


def worst(items, pattern=r"(?<![\w.])(\d+\.\d+)"):
    """The largest figure of a summary's list; a figure inside a trace's name (x1.5) is not one."""
    values = [float(v) for v in re.findall(pattern, items)]
    return f"{max(values):.4f}" if values else "-"


def heldout_row(name, command, text, classic):
    traces = int(re.search(r"^traces: (\d+)", text, re.M).group(1))
    vmm_n, vmm_items = summary_count(text, "vmm above 1.01 x live (reserved or minimum)")
    ideal_n, _ = summary_count(text, "ideal-remap above 1.01 x live")
    apart_n, _ = summary_count(text, "vmm above 1.01 where ideal-remap is not")
    if classic:
        cl_n, cl_items = summary_count(text, "classic minimum capacity above the pytorch model's")
        cl_worst = worst(cl_items, r"[+](\d+\.\d+)%")
        cl = f"{cl_n} (worst +{float(cl_worst):.1f} %)" if cl_n else "0"
    else:
        cl = "-"
    return (f"| {name} | `{command}` | {traces} | {vmm_n} | {worst(vmm_items)} | {ideal_n} | "
            f"{apart_n} | {cl} |")


def scaled_heldout(traces_dir):
    """bench/heldout_table.py's summary on the shared traces and their scaled variants (the
    factors of bench/vmm_heldout.sh)."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        run_script([sys.executable, "bench/scaled_traces.py", d, "--src", traces_dir, "--factors",
                    "0.6,0.7,0.8,0.9,1.05,1.1,1.25,1.5"])
        paths = [os.path.join(traces_dir, t + ".rep") for t in TRACES]
        paths += sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".rep"))
        jsonl = os.path.join(d, "replay.jsonl")
        with open(jsonl, "w") as f:
            f.write(run_script([os.path.join(ROOT, "build", "stowage"), "replay", "--policy",
                                "classic", "--policy", "vmm", "--policy", "pytorch", "--policy",
                                "pytorch-expandable", "--policy", "ideal-remap", "--min-capacity",
                                "--repeats", "1", "--json"] + paths))
        return run_script([sys.executable, "bench/heldout_table.py", jsonl])


def table_heldout(traces_dir, snapshots):
    out = ["| set | command | traces | vmm above 1.01 x live | vmm worst | ideal-remap above "
           "1.01 | vmm above, ideal-remap not | classic minimum capacity above the pytorch "
           "model's |", "|---|---|---:|---:|---:|---:|---:|---|"]
    out.append(heldout_row("shared and scaled", "bench/scaled_traces.py",
                           scaled_heldout(traces_dir), True))
    out.append(heldout_row("two workloads in one pool", "bench/mixed_heldout.sh",
                           run_script(["bash", "bench/mixed_heldout.sh"]), True))
    out.append(heldout_row("public snapshot workloads", "bench/snapshot_heldout.sh DIR",
                           run_script(["bash", "bench/snapshot_heldout.sh", snapshots]), True))
    out.append(heldout_row("model workloads (bench/zoo)", "bench/zoo/heldout.sh",
                           run_script(["bash", "bench/zoo/heldout.sh"]), True))
    return out


def table_vmm_groups(traces_dir, snapshots):
    """bench/vmm_calls.py --row on each group of traces of bench/vmm_handles.sh (the shared
    traces, their scaled variants, the distinct public snapshot workloads) and on the corpus of
    model workloads, at the default handle size: calls and modelled time against the
    pytorch-expandable model's (median, max, traces above 2 x), reserved / live (median, max),
    and the traces above 1.01 x live where ideal-remap is at most 1.005."""
    import glob
    import hashlib
    import tempfile
    out = ["| traces | calls / expandable: median, max, above 2 x | modelled time: median, max, "
           "above 2 x | reserved / live: median, max | above 1.01 where ideal-remap <= 1.005 |",
           "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as d:
        run_script([sys.executable, "bench/scaled_traces.py", os.path.join(d, "scaled"), "--src",
                    traces_dir, "--factors", "0.6,0.7,0.8,0.9,1.05,1.1,1.25,1.5"])
        subprocess.run([sys.executable, "bench/snapshot_check.py", "--stowage",
                        os.path.join(ROOT, "build", "stowage"), "--workloads",
                        os.path.join(d, "wl")] + sorted(glob.glob(os.path.join(snapshots, "*"))),
                       cwd=ROOT, capture_output=True, text=True)
        seen, workloads = set(), []
        for path in sorted(glob.glob(os.path.join(d, "wl", "*.rep"))):
            with open(path, "rb") as f:  # a workload committed under two names counts once
                digest = hashlib.md5(f.read()).hexdigest()
            if digest not in seen:
                seen.add(digest)
                workloads.append(path)
        zoo = os.path.join(ROOT, "bench", "zoo")
        with open(os.path.join(zoo, "index.csv")) as f:
            corpus = [os.path.join(zoo, "traces", line.rstrip("\n").split(",")[-1])
                      for line in f.readlines()[1:]]
        groups = [("shared", [os.path.join(traces_dir, t + ".rep") for t in TRACES]),
                  ("scaled variants", sorted(glob.glob(os.path.join(d, "scaled", "*.rep")))),
                  ("snapshot workloads", workloads),
                  ("model workloads of bench/zoo", corpus)]
        for label, paths in groups:
            row = run_script([sys.executable, "bench/vmm_calls.py", "--stowage",
                              os.path.join(ROOT, "build", "stowage"), "--jobs", "2", "--row",
                              label] + paths)
            c = [x.strip() for x in row.strip().strip("|").split("|")]
            out.append(f"| {label} ({len(paths)}) | {c[1]}, {c[2]}, {c[3]} | {c[4]}, {c[5]}, "
                       f"{c[6]} | {c[7]}, {c[8]} | {c[9]} |")
    return out


def table_long():
    """bench/vmm_long_run.sh's summary lines, one row per model of the shared traces, then one
    per mode of the corpus's training runs (SET=zoo; REPLAYS=3, the least: the table takes only
    the first replay)."""
    out = ["| model | long runs | maps+unmaps per 1000 events over the last 10 steps: max | "
           "settled from step |", "|---|---:|---:|---|"]
    for env in ({}, {"SET": "zoo", "REPLAYS": "3"}):
        text = run_script(["bash", "bench/vmm_long_run.sh"], env)
        for m in re.finditer(r"^(\S+(?: [\w-]+)?): (\d+) long runs; maps\+unmaps per 1000 "
                             r"events, last 10 steps: median \S+, mean \S+, max (\S+), above 20: "
                             r"\d+; settled from step (\S+);", text, re.M):
            out.append(f"| {m.group(1)} | {m.group(2)} | {m.group(3)} | {m.group(4)} |")
    return out


def loops_summary(text):
    last, classic_last, reserved = {}, {}, {}
    for line in text.splitlines():
        m = re.match(r"(\S+)\s+first replay, map\+unmap by 1/8 of its events: (.*)", line)
        if m:
            last[m.group(1)] = int(m.group(2).split()[-1])
        m = re.match(r"(\S+)\s+first replay, classic backend calls by 1/8 of its events: (.*)",
                     line)
        if m:
            classic_last[m.group(1)] = int(m.group(2).split()[-1])
        m = re.match(r"(\S+)\s+vmm reserved/live (\S+)", line)
        if m:
            reserved[m.group(1)] = float(m.group(2))
    if not reserved:
        sys.exit("doc_tables: no loop in build/vmm_churn's output")
    values = list(reserved.values())
    return (len(values), sum(1 for v in last.values() if v), sum(last.values()),
            sum(1 for v in values if v > 1.01), sum(values) / len(values), max(values),
            sum(1 for v in classic_last.values() if v))


def table_loops(snapshots):
    """Loops of many steps, first replay in 8 parts (build/vmm_churn --replays 1 --parts 8)."""
    import glob
    import tempfile
    out = ["| loops | constants | loops | vmm remapping in the last eighth | their map+unmap calls "
           "there | vmm above 1.01 x live | vmm reserved / live: mean, max | classic calling "
           "the backend in the last eighth |", "|---|---|---:|---:|---:|---:|---|---:|"]
    with tempfile.TemporaryDirectory() as d:
        run_script([sys.executable, "bench/random_loops.py", os.path.join(d, "random"),
                    "--steps", "3000"])
        run_script([sys.executable, "bench/snapshot_check.py"] +
                   sorted(glob.glob(os.path.join(snapshots, "*"))) +
                   ["--workloads", os.path.join(d, "snap"), "--iterations", "64"])
        zoo = run_script([sys.executable, "bench/zoo/build.py", "--training"]).split()
        run_script([sys.executable, "bench/long_run.py", os.path.join(d, "zoo")] + zoo +
                   ["--steps", "40"])
        for name, sub in (("random, 3,000 steps", "random"), ("snapshot workloads, 64 steps",
                                                               "snap"),
                          ("model training runs (bench/zoo), 40 more steps", "zoo")):
            traces = sorted(glob.glob(os.path.join(d, sub, "*.rep")))
            for conf in (None, "vmm_learn_step:false"):
                args = [os.path.join(ROOT, "build", "vmm_churn"), "--replays", "1", "--parts", "8"]
                args += ["--conf", conf] if conf else []
                n, remap, calls, above, mean, mx, cl = loops_summary(run_script(args + traces))
                out.append(f"| {name} | {conf or 'default'} | {n} | {remap} | {calls} | {above} | "
                           f"{mean:.4f}, {mx:.4f} | {cl} |")
    return out


def bad_input(message):
    print(f"doc_tables: {message}", file=sys.stderr)
    sys.exit(2)


def documents(paths):
    """[(path, lines, [(marker index, name, table start, table end)])]: every document read and
    its markers checked before any replay runs."""
    docs = []
    for path in paths:
        try:
            with open(path) as f:
                lines = f.read().split("\n")
        except OSError as e:
            bad_input(f"{path}: {e.strerror}")
        found = []
        for i, line in enumerate(lines):
            m = MARKER.search(line)
            if not m:
                continue
            if m.group(1) not in TABLES and m.group(1) not in HELDOUT_TABLES:
                bad_input(f"{path}:{i + 1}: unknown table '{m.group(1)}'")
            end = i + 1
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            found.append((i, m.group(1), i + 1, end))
        if not found:
            bad_input(f"{path}: no table marker (<!-- doc_tables:NAME -->)")
        docs.append((path, lines, found))
    return docs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--print", action="store_true", help="print every table")
    mode.add_argument("--check", action="store_true", help="fail when a document differs")
    mode.add_argument("--write", action="store_true", help="rewrite the tables in place")
    ap.add_argument("--stowage", default=os.path.join(ROOT, "build", "stowage"))
    ap.add_argument("--traces", default=os.environ.get("STOW_TRACES_DIR",
                                                       os.path.join(ROOT, "..", "shared", "traces")))
    ap.add_argument("--heldout", metavar="SNAPSHOTS",
                    help="also the held-out, long-run and loop tables, SNAPSHOTS holding the "
                         "snapshots of bench/snapshots.txt (about 15 minutes on 2 cores)")
    ap.add_argument("files", nargs="*")
    a = ap.parse_args()
    if not a.print and not a.files:
        ap.error("--check and --write need the documents to check or write")
    docs = documents(a.files)
    if not all(os.path.exists(os.path.join(a.traces, t + ".rep")) for t in TRACES):
        print(f"doc_tables: the shared traces are not in {a.traces}: nothing checked")
        return 77
    rows, real = replay(a.stowage, a.traces), pytorch_figures(a.traces)
    tables = {name: fn(rows, real) for name, fn in TABLES.items()}
    if a.heldout:
        tables["heldout"] = table_heldout(a.traces, a.heldout)
        tables["vmm_groups"] = table_vmm_groups(a.traces, a.heldout)
        tables["long"] = table_long()
        tables["loops"] = table_loops(a.heldout)
    if a.print:
        for name, table in tables.items():
            print(f"<!-- doc_tables:{name} -->\n" + "\n".join(table) + "\n")
        return 0
    status = 0
    for path, lines, found in docs:
        for i, name, start, end in reversed(found):
            if name not in tables:
                continue  # the held-out tables, checked only with --heldout
            if lines[start:end] == tables[name]:
                continue
            if a.check:
                status = 1
                print(f"{path}:{i + 1}: table '{name}' differs from the code's figures.\n"
                      "in the document:\n" + "\n".join(lines[start:end]) +
                      "\nfrom the replays:\n" + "\n".join(tables[name]) + "\n")
            else:
                lines[start:end] = tables[name]
        if a.write:
            with open(path, "w") as f:
                f.write("\n".join(lines))
    if a.check and status == 0:
        print(f"doc_tables: every marked table of {', '.join(a.files)} matches the replays")
    return status


if __name__ == "__main__":
    sys.exit(main())
