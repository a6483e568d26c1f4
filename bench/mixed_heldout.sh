#!/usr/bin/env bash
# bench/mixed_heldout.sh: every policy on two workloads sharing one pool
# (docs/benchmarks.md, goals: held-out traces).
#
# bench/mixed_traces.py writes each pair of shared traces as one trace, the two
# interleaved event by event (CHUNKS=1) or in turns of about 1000 events
# (CHUNKS=1000), both on stream 0 or on two streams (STREAMS=same,separate).
# Each is replayed with --min-capacity under classic, vmm, pytorch and
# pytorch-expandable, and the script prints one Markdown row per trace (peak
# reserved / peak live and minimum capacity / peak live for each policy), then
# a summary: the traces where classic's minimum capacity is above the pytorch
# model's, and those where vmm is above 1.01 x live on either figure.
# Extra arguments go to the replays as settings (--conf ...).
# Usage: bench/mixed_heldout.sh [--conf KEY:VALUE,...]   (from the repository
# root, after building; PAIRS=A+B,... restricts the pairs; the default 40
# traces took 24 s on 2 cores in the fourteenth session; about 20 minutes were
# noted on the VM of the thirteenth)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/bench/shared_traces.sh"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

python3 "$root/bench/mixed_traces.py" "$out/mixed" --src "$traces_dir" \
    --chunks "${CHUNKS:-1,1000}" --streams "${STREAMS:-same,separate}" \
    ${PAIRS:+--pairs "$PAIRS"} >"$out/list.txt"
n=$(wc -l <"$out/list.txt")
echo "replay --min-capacity, 4 policies, on $n mixed traces ..." >&2
while read -r t; do
    "$root/build/stowage" replay --policy classic --policy vmm --policy pytorch \
        --policy pytorch-expandable --min-capacity --repeats 1 --json "$@" "$t"
done <"$out/list.txt" >"$out/replay.jsonl"

python3 - "$out/replay.jsonl" <<'EOF'
import json, os, sys

rows = {}
for line in open(sys.argv[1]):
    j = json.loads(line)
    name = os.path.basename(j["trace"])[:-4]
    live = j["peak_live_bytes"]
    rows.setdefault(name, {})[j["policy"]] = (j["peak_reserved_bytes"] / live,
                                              j["min_capacity_bytes"] / live)
policies = ["classic", "vmm", "pytorch", "pytorch-expandable"]
print("| trace | " + " | ".join(f"{p} reserved / min" for p in policies) + " |")
print("|---|" + "---:|" * len(policies))
above_model, vmm_over = [], []
for name, r in rows.items():
    print(f"| {name} | " + " | ".join(f"{r[p][0]:.4f} / {r[p][1]:.4f}" for p in policies) + " |")
    ratio = r["classic"][1] / r["pytorch"][1]
    if ratio > 1:
        above_model.append(f"{name} {100 * (ratio - 1):+.1f}%")
    if max(r["vmm"]) > 1.01:
        vmm_over.append(f"{name} {max(r['vmm']):.4f}")
print()
print(f"traces: {len(rows)}")
print(f"classic minimum capacity above the pytorch model's: {len(above_model)}: "
      + ", ".join(above_model))
print(f"vmm above 1.01 x live (reserved or minimum): {len(vmm_over)}: " + ", ".join(vmm_over))
EOF
