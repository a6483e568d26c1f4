#!/usr/bin/env python3
"""bench/heldout_table.py: one Markdown row per trace from `stowage replay --json` lines.

    python3 bench/heldout_table.py REPLAY.jsonl

REPLAY.jsonl holds `build/stowage replay --policy classic --policy vmm --policy pytorch
--policy pytorch-expandable --min-capacity --json` lines. Each row gives, per policy, peak
reserved / peak live and minimum capacity / peak live; then a summary of issue 3's and issue 4's
held-out goals: the traces where classic's minimum capacity is above the pytorch model's, and
those where vmm is above 1.01 x live on either figure. Used by bench/mixed_heldout.sh and
bench/snapshot_heldout.sh.
"""
import json
import os
import sys

POLICIES = ["classic", "vmm", "pytorch", "pytorch-expandable"]


def main(path):
    rows = {}
    with open(path) as f:
        for line in f:
            j = json.loads(line)
            name = os.path.basename(j["trace"])[:-4]
            live = j["peak_live_bytes"]
            rows.setdefault(name, {})[j["policy"]] = (j["peak_reserved_bytes"] / live,
                                                      j["min_capacity_bytes"] / live)
    print("| trace | " + " | ".join(f"{p} reserved / min" for p in POLICIES) + " |")
    print("|---|" + "---:|" * len(POLICIES))
    above_model, vmm_over = [], []
    for name, r in rows.items():
        print(f"| {name} | " + " | ".join(f"{r[p][0]:.4f} / {r[p][1]:.4f}" for p in POLICIES)
              + " |")
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
