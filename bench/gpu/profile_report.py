#!/usr/bin/env python3
"""bench/gpu/profile_report.py: what bench/gpu/sampler.c's samples hit.

    python3 bench/gpu/profile_report.py BINARY PROFILE [PROFILE2] [--top N]

Resolves each sample that fell in BINARY (matched by file name in the
profile's maps; the binary given here must be the one that ran, built with
-g) to its innermost source file, line and function (addr2line -f -i: with
LTO most of the pool is inlined into stow_pool_alloc and stow_pool_free, so
the innermost frame is the one that says what the time went on), and prints
the share of samples by file, function and line. With a second profile (the
same binary on another machine or another policy) it prints both side by
side, in samples per 1000 of each profile's samples in BINARY, and the
difference: where one spends more than the other. Profiles may be gzipped.
"""
import argparse
import collections
import gzip
import os
import subprocess
import sys


class BadProfile(Exception):
    pass


def load(path, binary):
    """Offsets (ELF virtual addresses, PIE) of the samples inside binary."""
    name = os.path.basename(binary)
    maps, pcs = [], []
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        for number, line in enumerate(f, 1):
            try:
                if line.startswith("map "):
                    parts = line[4:].split()
                    if len(parts) >= 6 and os.path.basename(parts[5]) == name and "x" in parts[1]:
                        lo, hi = (int(x, 16) for x in parts[0].split("-"))
                        maps.append((lo, hi, int(parts[2], 16)))
                elif line.startswith("pc "):
                    pcs.append(int(line[3:], 16))
                else:
                    raise ValueError("neither a 'map' nor a 'pc' line")
            except ValueError as e:
                raise BadProfile("%s:%d: %s: %r" % (path, number, e, line.strip()[:80]))
    offsets, outside = [], 0
    for pc in pcs:
        for lo, hi, off in maps:
            if lo <= pc < hi:
                offsets.append(pc - lo + off)
                break
        else:
            outside += 1
    return offsets, outside


def resolve(binary, addresses):
    """address -> (function, file:line) of the innermost inlined frame."""
    uniq = sorted(set(addresses))
    if not uniq:
        return {}
    out = subprocess.run(["addr2line", "-f", "-i", "-a", "-e", binary] +
                         [hex(a) for a in uniq], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    # Per address: the address, then a function and a file:line per frame, innermost first.
    result, i = {}, 0
    while i < len(out):
        if not out[i].startswith("0x"):
            i += 1
            continue
        func = out[i + 1] if i + 1 < len(out) else "??"
        loc = out[i + 2] if i + 2 < len(out) else "??:0"
        result[int(out[i], 16)] = (func, os.path.basename(loc.split(" (")[0]))
        i += 3  # the outer frames' lines are skipped above
    return result


def tally(offsets, where):
    by_file, by_func, by_line = (collections.Counter() for _ in range(3))
    for a in offsets:
        func, loc = where.get(a, ("??", "??:0"))
        by_file[loc.rsplit(":", 1)[0]] += 1
        by_func[func] += 1
        by_line[loc] += 1
    return by_file, by_func, by_line


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binary")
    ap.add_argument("profiles", nargs="+")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    if len(a.profiles) > 2:
        ap.error("one profile, or two to compare")
    if not os.access(a.binary, os.R_OK):
        ap.error("cannot read %s" % a.binary)
    try:
        loaded = [load(p, a.binary) for p in a.profiles]
    except (OSError, BadProfile) as e:
        print("profile_report: %s" % e, file=sys.stderr)
        return 2
    where = resolve(a.binary, [x for offs, _ in loaded for x in offs])
    tallies = [tally(offs, where) for offs, _ in loaded]
    for p, (offs, outside) in zip(a.profiles, loaded):
        print(f"{p}: {len(offs)} samples in {os.path.basename(a.binary)}, {outside} elsewhere")
    for k, title in enumerate(("file", "function", "line")):
        print(f"\n== by {title} (per 1000 samples in the binary)")
        counts = [t[k] for t in tallies]
        totals = [max(1, sum(c.values())) for c in counts]
        keys = set().union(*counts)
        rows = []
        for key in keys:
            per = [1000.0 * c[key] / n for c, n in zip(counts, totals)]
            rows.append((per[-1] - per[0] if len(per) > 1 else per[0], key, per))
        # Largest first (differences by size), ties by name: the same report every run.
        rows.sort(key=lambda r: (-abs(r[0]) if len(counts) > 1 else -r[0], r[1]))
        for diff, key, per in rows[:a.top]:
            cols = " ".join(f"{x:7.1f}" for x in per)
            extra = f" {diff:+7.1f}" if len(per) > 1 else ""
            print(f"  {cols}{extra}  {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
