#!/usr/bin/env bash
# bench/vmm_heldout.sh: the page-mapped pool (policy vmm) on the shared traces
# and on held-out variants of them (docs/design.md, page-mapped segments).
#
# Writes every shared trace again with each allocation size times each of
# FACTORS (bench/scaled_traces.py: other alignments against 2 MiB granules),
# then for the shared and the scaled traces:
#   - build/stowage replay --policy vmm --policy ideal-remap --min-capacity
#     --json: peak reserved / peak live and minimum capacity / peak live, and
#     the peak of the ideal-remap yardstick (replay/ideal_remap.c: best-fit
#     addresses, 2 MiB pages only under live data) / peak live;
#   - build/vmm_churn: map + unmap calls per 1000 events once the pool has
#     settled (16 replays on one pool), host time against the classic pool, and
#     the footprint of one more replay (granules some live block overlapped);
# and prints one Markdown row per trace, then a summary: how many traces are
# above 1.01 on either ratio, the worst, which of those ideal-remap keeps
# within 1.01, vmm's minimum capacity against ideal-remap's peak, and the
# settled churn's median, mean and maximum. --conf gives both programs settings
# (STOWAGE_CONF's keys), --tuning the pool's measured constants (stowage/tuning.h):
# to the replay as `--tuning`, to vmm_churn in its --conf beside the settings.
# Usage: bench/vmm_heldout.sh [--conf KEY:VALUE,...] [--tuning KEY:VALUE,...]   (from the
# repository root, after building; FACTORS=0.6,0.7,0.8,0.9,1.05,1.1,1.25,1.5 by default)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/bench/shared_traces.sh"
factors=${FACTORS:-0.6,0.7,0.8,0.9,1.05,1.1,1.25,1.5}
. "$root/bench/settings_args.sh"
settings_args vmm_heldout "$@"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

python3 "$root/bench/scaled_traces.py" "$out/scaled" --src "$traces_dir" --factors "$factors" \
    >/dev/null
all=("${trace_paths[@]}" "$out"/scaled/*.rep)
echo "replay --policy vmm --policy ideal-remap --min-capacity on ${#all[@]} traces ..." >&2
"$root/build/stowage" replay --policy vmm --policy ideal-remap --min-capacity --repeats 1 --json \
    ${replay_args[@]+"${replay_args[@]}"} "${all[@]}" >"$out/replay.jsonl"
echo "vmm_churn on ${#all[@]} traces ..." >&2
"$root/build/vmm_churn" ${churn_args[@]+"${churn_args[@]}"} "${all[@]}" >"$out/churn.txt"

python3 - "$out/replay.jsonl" "$out/churn.txt" "$root/bench" <<'EOF'
import json, os, re, statistics, sys
sys.path.insert(0, sys.argv[3])
from heldout_table import ideal_summary

replay, ideal = {}, {}
for line in open(sys.argv[1]):
    j = json.loads(line)
    name = os.path.basename(j["trace"])
    if j["policy"] == "ideal-remap":
        ideal[name] = j["peak_reserved_bytes"] / j["peak_live_bytes"]
    else:
        replay[name] = j
churn, footprint = {}, {}
for line in open(sys.argv[2]):
    m = re.match(r"(\S+)\s+vmm reserved/live \S+\s+steady churn (\S+)\s+(.*?)\s+vmm/classic host time (\S+)", line)
    if m:
        churn[m.group(1)] = (float(m.group(2)), m.group(3), float(m.group(4)))
    m = re.match(r"(\S+)\s+footprint of one more replay: \d+ granules = (\S+) x peak live", line)
    if m:
        footprint[m.group(1)] = float(m.group(2))

print("| trace | reserved / live | min / live | ideal-remap / live | settled maps+unmaps / 1000 events | | footprint / live | host time vs classic |")
print("|---|---:|---:|---:|---:|---|---:|---:|")
over, worst, settled, against_ideal = [], (0.0, ""), [], []
for name, j in replay.items():
    res = j["reserved_over_live"]
    mn = j["min_capacity_bytes"] / j["peak_live_bytes"]
    c = churn.get(name, (float("nan"), "?", float("nan")))
    fp = footprint.get(name, float("nan"))
    ir = ideal[name]
    print(f"| {name[:-4]} | {res:.4f} | {mn:.4f} | {ir:.4f} | {c[0]:.1f} | {c[1]} | {fp:.4f} | {c[2]:.2f} |")
    if max(res, mn) > 1.01:
        over.append(name[:-4])
    against_ideal.append((name[:-4], res, mn, ir))
    worst = max(worst, (max(res, mn), name[:-4]))
    settled.append(c[0])
print()
print(f"traces: {len(replay)}; above 1.01 (reserved or minimum capacity): {len(over)} {over}")
print(f"worst: {worst[0]:.4f} ({worst[1]})")
print("\n".join(ideal_summary(against_ideal)))
print(f"settled churn per 1000 events: median {statistics.median(settled):.1f}, "
      f"mean {statistics.mean(settled):.1f}, max {max(settled):.1f}, "
      f"above 20: {sum(1 for s in settled if s > 20)}")
EOF
