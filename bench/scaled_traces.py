#!/usr/bin/env python3
"""bench/scaled_traces.py: held-out variants of the shared traces.

Writes every .rep trace of SRC (default ../shared/traces) again into OUT with
each allocation size multiplied by a factor (default 0.8, 1.1 and 1.25,
rounded down, at least 1 byte): the same workloads with other sizes and so
other alignments against 2 MiB granules and size classes. Policies tuned on
the shared traces are checked on these (docs/design.md, page-mapped segments).

    python3 bench/scaled_traces.py OUT [--src DIR] [--factors 0.8,1.1,1.25]
"""
import argparse
import os
import sys


def scale(src_path, dst_path, factor):
    with open(src_path) as src, open(dst_path, "w") as dst:
        dst.write(src.readline())  # header: ids and events, unchanged
        for number, line in enumerate(src, start=2):
            fields = line.split()
            if fields and fields[0] == "a":
                if len(fields) != 4 or not fields[2].isdigit():
                    sys.exit(f"{src_path}:{number}: expected 'a ID SIZE STREAM'")
                size = max(1, int(int(fields[2]) * factor))
                dst.write(f"a {fields[1]} {size} {fields[3]}\n")
            else:
                dst.write(line)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--src", default=os.path.join(here, "..", "..", "shared", "traces"))
    ap.add_argument("--factors", default="0.8,1.1,1.25")
    args = ap.parse_args()
    try:
        factors = [float(f) for f in args.factors.split(",")]
    except ValueError:
        sys.exit(f"scaled_traces: --factors: '{args.factors}' is not a list of numbers")
    if not all(f > 0 for f in factors):
        sys.exit("scaled_traces: --factors must be positive")
    names = sorted(n for n in os.listdir(args.src) if n.endswith(".rep"))
    if not names:
        sys.exit(f"scaled_traces: no .rep file in {args.src}")
    os.makedirs(args.out, exist_ok=True)
    for name in names:
        for f in factors:
            dst = os.path.join(args.out, f"{name[:-4]}_x{f:g}.rep")
            scale(os.path.join(args.src, name), dst, f)
            print(dst)


if __name__ == "__main__":
    main()
