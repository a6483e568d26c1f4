#!/usr/bin/env python3
"""bench/snapshot_tags.py: what the tags of imported snapshots say about their peak.

    python3 bench/snapshot_tags.py SNAPSHOT.pickle|DIR... [--stowage build/stowage] [--top 3]
                                   [--frames] [--keep DIR] [--importer PATH]

Each snapshot goes through the importer (python/stowage/snapshot_import.py, as a user runs it)
and then `stowage report`. From the importer's trace and tags the script finds the live-bytes
peak (the first event that reaches it, as the report does) and sums the bytes alive there by
tag (--importer runs another checkout's importer, to compare rules; its tags that this rule
does not make show the tier '?'); from the report's HTML it reads the "Sources of the peak" table (its largest rows) and
checks that its peak is the same. Each tag's tier (stowage/stack_tags.py: user, package,
python, backward, native, unknown) comes from the snapshot's own frames.

Prints one Markdown row per snapshot: allocations, peak live bytes, the top tags at the peak with
their share and tier, the bytes without a tag (entries recorded without frames), the tier of the
report's largest row and how many of the report's rows name the user's code; '!' marks a
tag that holds more than half of the peak. --frames prints, for each such tag, its allocations
at the peak and the Python frames of the largest one, to judge whether one line really
allocated them.

Exit status: 1 when a tag that is not the user's code holds more than half of a peak, or when the
report's rows of a snapshot whose peak allocations carry frames name no user code; 2 on bad
usage, a failed import or report, or a report whose peak differs; 0 otherwise.
"""
import argparse
import collections
import html
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
IMPORTER = os.path.join(ROOT, "python", "stowage", "snapshot_import.py")
sys.path.insert(0, os.path.join(ROOT, "python"))

from stowage import snapshot_import  # noqa: E402
from stowage.stack_tags import format_frame, python_kind, stack_tag  # noqa: E402

_ROW = re.compile(r"<tr data-id=(\d+)><td>\d+</td><td>\d+</td><td>[^<]*</td><td>(\d+)</td>"
                  r".*?<td class=l>(.*?)</td></tr>")


class Failed(Exception):
    """The snapshot could not be imported or reported; the message says why."""


def read_rep(path):
    """[(kind, id, size)] of a .rep trace written by the importer."""
    events = []
    with open(path) as f:
        f.readline()
        for line in f:
            p = line.split()
            events.append(("a", int(p[1]), int(p[2])) if p[0] == "a" else ("f", int(p[1]), 0))
    return events


def read_tags(path):
    tags = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                i, _, text = line.rstrip("\n").partition(" ")
                tags[int(i)] = text
    return tags


def peak_alive(events):
    """(peak live bytes, event index, {id: size} alive there): the first event reaching it."""
    cur, peak, at, size_of = 0, 0, 0, {}
    for i, (kind, ident, size) in enumerate(events):
        if kind == "a":
            size_of[ident] = size
        cur += size if kind == "a" else -size_of[ident]
        if cur > peak:
            peak, at = cur, i
    alive = {}
    for kind, ident, size in events[:at + 1] if peak else []:
        if kind == "a":
            alive[ident] = size
        else:
            del alive[ident]
    return peak, at, alive


def tiers_and_frames(snap):
    """{tag: tier} and {tag: frames of one allocation} over every alloc entry of the snapshot."""
    tiers, frames = {}, {}
    for trace in snap.get("device_traces") or []:
        for e in trace or []:
            if isinstance(e, dict) and e.get("action") == "alloc":
                tag, tier = stack_tag(e.get("frames"))
                if tag is not None and tag not in tiers:
                    tiers[tag], frames[tag] = tier, e.get("frames")
    return tiers, frames


def report_rows(stowage, rep, out_html):
    """(peak live bytes, [(bytes, tag)]) of the report's "Sources of the peak" table."""
    p = subprocess.run([stowage, "report", rep, "-o", out_html], capture_output=True, text=True)
    if p.returncode != 0:
        raise Failed("stowage report exited %d: %s" % (p.returncode, p.stderr.strip()))
    with open(out_html) as f:
        page = f.read()
    m = re.search(r'"peak_live":(\d+)', page)
    table = page.split("<table id=peak>", 1)[-1].split("</table>", 1)[0]
    rows = [(int(b), html.unescape(t)) for _, b, t in _ROW.findall(table)]
    return int(m.group(1)) if m else 0, rows


def check(path, args, tmp):
    name = os.path.basename(path)
    rep = os.path.join(tmp, name + ".rep")
    p = subprocess.run([sys.executable, args.importer, path, "-o", rep], capture_output=True,
                       text=True)
    if p.returncode != 0:
        raise Failed("importer exited %d: %s" % (p.returncode, p.stderr.strip()))
    with open(path, "rb") as f:
        tiers, frames = tiers_and_frames(snapshot_import.load_snapshot(f.read()))
    events, tags = read_rep(rep), read_tags(rep + ".tags")
    peak, at, alive = peak_alive(events)
    by_tag = collections.Counter()
    count = collections.Counter()
    for ident, size in alive.items():
        by_tag[tags.get(ident)] += size
        count[tags.get(ident)] += 1
    untagged = by_tag.pop(None, 0)
    rows = []
    if events:
        report_peak, rows = report_rows(args.stowage, rep, os.path.join(tmp, name + ".html"))
        if report_peak != peak:
            raise Failed("the report's peak live %d is not the trace's %d" % (report_peak, peak))
    return {"name": name, "allocs": sum(1 for e in events if e[0] == "a"), "peak": peak,
            "at": at, "top": by_tag.most_common(args.top), "count": count,
            "untagged": untagged, "tiers": tiers, "frames": frames, "rows": rows,
            "alive": alive, "tags": tags}


def share(part, whole):
    return "%.3f" % (part / whole) if whole else "-"


def short(tag, width=110):
    """The tag with each path cut to its file name and C++ arguments to '(...)', for the table
    (--frames prints it whole)."""
    tag = re.sub(r"\((std|c10|at)::[^()]*\)", "(...)", re.sub(r"\S*[/\\]", "", tag))
    return tag if len(tag) <= width else tag[:width - 3] + "..."


def print_frames(r):
    for tag, b in r["top"]:
        if b * 2 <= r["peak"]:
            continue
        sizes = sorted((s for i, s in r["alive"].items() if r["tags"].get(i) == tag), reverse=True)
        print("\n%s: '%s' (%s) holds %s of the peak: %d allocations, largest %s bytes"
              % (r["name"], tag, r["tiers"].get(tag, "?"), share(b, r["peak"]), len(sizes),
                 ", ".join(str(s) for s in sizes[:4])))
        python = 0
        for fr in r["frames"].get(tag) or []:
            fn = str(fr.get("filename", "")).replace("\\", "/") if isinstance(fr, dict) else ""
            if fn.endswith(".py") or fn.startswith("<"):
                print("    %-7s %s" % (python_kind(fn), format_frame(fr)))
                python += 1
        if not python:
            print("    (no Python frame in its %d frames)" % len(r["frames"].get(tag) or []))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--stowage", default=os.path.join(ROOT, "build", "stowage"))
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--frames", action="store_true")
    ap.add_argument("--keep", help="write the traces, tags and reports here")
    ap.add_argument("--importer", default=IMPORTER, help="snapshot_import.py to run")
    args = ap.parse_args(argv)
    if not os.access(args.stowage, os.X_OK):
        print("snapshot_tags: %s not found (make build)" % args.stowage, file=sys.stderr)
        return 2
    paths = []
    for p in args.paths:
        paths += sorted(os.path.join(p, n) for n in os.listdir(p)) if os.path.isdir(p) else [p]
    status, results = 0, []
    print("| snapshot | allocations | peak live | top tags at the peak (share, tier; file names "
          "without their directories) | untagged | report row 1 | report rows naming user code |")
    print("|---|---:|---:|---|---:|---|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        out = args.keep or tmp
        if args.keep:
            os.makedirs(args.keep, exist_ok=True)
        for path in paths:
            try:
                r = check(path, args, out)
            except (Failed, OSError, ValueError) as exc:
                print("%s: %s" % (path, exc), file=sys.stderr)
                status = 2
                continue
            results.append(r)
            peak, tiers = r["peak"], r["tiers"]
            tops = []
            for tag, b in r["top"]:
                flag = "! " if b * 2 > peak else ""
                tops.append("%s%s %s (%s)" % (flag, share(b, peak), short(tag), tiers.get(tag, "?")))
                if b * 2 > peak and tiers.get(tag) != "user":
                    status = max(status, 1)
            rows = r["rows"]
            row1 = (tiers.get(rows[0][1], "?") if rows[0][1] else "untagged") if rows else "-"
            user_rows = sum(1 for _, t in rows if tiers.get(t) == "user")
            if any(t for _, t in rows) and not user_rows:
                status = max(status, 1)
            print("| %s | %d | %d | %s | %s | %s | %s |"
                  % (r["name"], r["allocs"], peak, "<br>".join(tops) or "-",
                     share(r["untagged"], peak), row1,
                     "%d of %d" % (user_rows, len(rows)) if rows else "-"))
    if args.frames:
        for r in results:
            print_frames(r)
    return status


if __name__ == "__main__":
    sys.exit(main())
