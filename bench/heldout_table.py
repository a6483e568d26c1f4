#!/usr/bin/env python3
"""bench/heldout_table.py: one Markdown row per trace from `stowage replay --json` lines.

    python3 bench/heldout_table.py REPLAY.jsonl

REPLAY.jsonl holds `build/stowage replay --policy classic --policy vmm --policy pytorch
--policy pytorch-expandable [--policy ideal-remap] --min-capacity --json` lines. Each row gives,
per policy, peak reserved / peak live and minimum capacity / peak live; then a summary of the
held-out goals: the traces where classic's minimum capacity is above the pytorch model's, and
those where vmm is above 1.01 x live on either figure. With ideal-remap
lines (the yardstick of ../shared/traces/README.md, replay/ideal_remap.c) a column gives its
peak / live, and the summary says which of vmm's traces above 1.01 that yardstick keeps within
1.01, and how vmm's minimum capacity compares with it. Used by bench/mixed_heldout.sh and
bench/snapshot_heldout.sh.
"""
import json
import os
import statistics
import sys

POLICIES = ["classic", "vmm", "pytorch", "pytorch-expandable"]
IDEAL = "ideal-remap"


def ideal_summary(traces):
    """The summary lines of vmm against the ideal-remap yardstick. traces: (name, vmm peak
    reserved / live, vmm minimum capacity / live, ideal-remap peak / live) per trace. Also used
    by bench/vmm_heldout.sh."""
    ideal_over, over_not_ideal, vs_ideal = [], [], []
    for name, reserved, minimum, ideal in traces:
        vs_ideal.append(minimum / ideal)
        if ideal > 1.01:
            ideal_over.append(f"{name} {ideal:.4f}")
        elif max(reserved, minimum) > 1.01:
            over_not_ideal.append(f"{name} {max(reserved, minimum):.4f} (ideal {ideal:.4f})")
    return [
        f"ideal-remap above 1.01 x live: {len(ideal_over)}: " + ", ".join(ideal_over),
        f"vmm above 1.01 where ideal-remap is not: {len(over_not_ideal)}: "
        + ", ".join(over_not_ideal),
        f"vmm minimum capacity / ideal-remap peak: median {statistics.median(vs_ideal):.4f}, "
        f"min {min(vs_ideal):.4f}, max {max(vs_ideal):.4f}; "
        f"below 1 on {sum(1 for v in vs_ideal if v < 1)}, above 1.005 on "
        f"{sum(1 for v in vs_ideal if v > 1.005)}",
    ]


def trace_name(path):
    """A trace's name: its file name without .rep or .rep.gz."""
    base = os.path.basename(path)
    for suffix in (".rep.gz", ".rep"):
        if base.endswith(suffix):
            return base[:-len(suffix)]
    return base


def main(path):
    rows = {}
    with open(path) as f:
        for line in f:
            j = json.loads(line)
            name = trace_name(j["trace"])
            live = j["peak_live_bytes"]
            rows.setdefault(name, {})[j["policy"]] = (j["peak_reserved_bytes"] / live,
                                                      j["min_capacity_bytes"] / live)
    ideal = all(IDEAL in r for r in rows.values()) and rows
    extra = " ideal-remap |" if ideal else ""
    print("| trace | " + " | ".join(f"{p} reserved / min" for p in POLICIES) + " |" + extra)
    print("|---|" + "---:|" * (len(POLICIES) + bool(ideal)))
    above_model, vmm_over = [], []
    for name, r in rows.items():
        cells = " | ".join(f"{r[p][0]:.4f} / {r[p][1]:.4f}" for p in POLICIES)
        print(f"| {name} | {cells} |" + (f" {r[IDEAL][0]:.4f} |" if ideal else ""))
        ratio = r["classic"][1] / r["pytorch"][1]
        if ratio > 1:
            above_model.append(f"{name} {100 * (ratio - 1):+.1f}%")
        if max(r["vmm"]) > 1.01:
            vmm_over.append(f"{name} {max(r['vmm']):.4f}")
    print()
    print(f"traces: {len(rows)}")
    print(f"classic minimum capacity above the pytorch model's: {len(above_model)}: "
          + ", ".join(above_model))
    print(f"vmm above 1.01 x live (reserved or minimum): {len(vmm_over)}: "
          + ", ".join(vmm_over))
    if ideal:
        print("\n".join(ideal_summary((name, *r["vmm"], r[IDEAL][0])
                                       for name, r in rows.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
