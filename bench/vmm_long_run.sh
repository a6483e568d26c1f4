#!/usr/bin/env bash
# bench/vmm_long_run.sh: does the page-mapped pool (policy vmm) stop remapping
# in a long training run? (docs/design.md, page-mapped segments)
#
# bench/vmm_churn replays a whole trace again and again on one pool, freeing
# and allocating the weights anew each time, which a training run never does.
# This runs the run on instead: bench/long_run.py writes each trace with its
# last training step repeated STEPS more times (the weights stay live), for the
# shared traces and their scaled variants (bench/scaled_traces.py, FACTORS);
# traces without a repeating step (shapes that change every step) are skipped.
# Each long run is replayed on a fresh vmm pool (build/vmm_churn --parts N: the
# first replay in N slices of about one step each; at most 64, so with STEPS
# above 60 a slice spans more than one step), and the script prints per trace
# the map + unmap calls per 1000 events and per step over the last 10 slices
# (the run's steady state), the step from which it is settled (no later slice
# above twice the median of the last 10, plus 10 calls), and the host time of
# vmm against classic (vmm_churn --replays 5 replays the long run four more
# times on the same warm pools, interleaving the two policies: the median of
# the per-replay ratios of replays 3 to 5), then a summary by model.
# Time on a shared VM scatters: REPLAYS (5 by default, 3 to 64) sets vmm_churn's
# --replays, so that the median is over REPLAYS - 2 ratios. INSTRUCTIONS=1 adds
# a column that does not scatter: vmm's instructions per event against
# classic's over four warm passes of the long run (bench/warm_instructions.sh,
# under callgrind: about 20 s a long run of 126,549 events).
# SET=zoo takes instead the training runs of the corpus of model workloads
# (bench/zoo/build.py --training: modes train and train-ckpt, as committed,
# gzip-compressed) and summarizes them by mode.
# --conf gives vmm_churn (and warm_instructions) settings (STOWAGE_CONF's keys), --tuning
# the pool's measured constants (stowage/tuning.h): to vmm_churn in its --conf beside the
# settings, to warm_instructions as --tuning.
# Usage: bench/vmm_long_run.sh [--conf KEY:VALUE,...] [--tuning KEY:VALUE,...]   (from the
# repository root, after building; SET=shared, STEPS=40, FACTORS=0.6,0.7,0.8,0.9,1.05,1.1,
# 1.25,1.5, REPLAYS=5 and INSTRUCTIONS=0 by default)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/bench/shared_traces.sh"
factors=${FACTORS:-0.6,0.7,0.8,0.9,1.05,1.1,1.25,1.5}
steps=${STEPS:-40}
replays=${REPLAYS:-5}
instructions=${INSTRUCTIONS:-0}
if ! [[ "$replays" =~ ^[0-9]+$ ]] || [ "$replays" -lt 3 ] || [ "$replays" -gt 64 ]; then
    echo "vmm_long_run: REPLAYS=$replays: a count from 3 to 64" >&2
    exit 2
fi
if [ "$instructions" != 0 ] && [ "$instructions" != 1 ]; then
    echo "vmm_long_run: INSTRUCTIONS=$instructions: 0 or 1" >&2
    exit 2
fi
. "$root/bench/settings_args.sh"
settings_args vmm_long_run "$@"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

set_name=${SET:-shared}
case "$set_name" in
shared)
    python3 "$root/bench/scaled_traces.py" "$out/scaled" --src "$traces_dir" \
        --factors "$factors" >/dev/null
    sources=("${trace_paths[@]}" "$out"/scaled/*.rep) ;;
zoo)
    mapfile -t sources < <(python3 "$root/bench/zoo/build.py" --training) ;;
*)
    echo "vmm_long_run: SET=$set_name: shared or zoo" >&2
    exit 2 ;;
esac
python3 "$root/bench/long_run.py" "$out/long" "${sources[@]}" --steps "$steps" >"$out/long.txt"
runs=$(grep -c "repeated from" "$out/long.txt" || true)
echo "$runs long runs (traces without a repeating step skipped)" >&2
if [ "$runs" -eq 0 ]; then
    echo "vmm_long_run: no trace has a repeating step" >&2
    exit 1
fi
for t in "$out"/long/*.rep; do
    name=$(basename "$t" _long.rep)
    # "NAME.rep: step of P events, repeated from ..." (NAME.rep.gz for the corpus).
    period=$(awk -v n="$name" '($1 == n ".rep:" || $1 == n ".rep.gz:") && $6 == "repeated" {
        print $4 }' "$out/long.txt")
    events=$(head -1 "$t" | cut -d' ' -f2)
    parts=$(( (events + period / 2) / period ))
    [ "$parts" -gt 64 ] && parts=64
    churn=$("$root/build/vmm_churn" --replays "$replays" --parts "$parts" \
        ${churn_args[@]+"${churn_args[@]}"} "$t")
    host=$(sed -n 's/.*vmm\/classic host time \([0-9.]*\).*/\1/p' <<<"$churn")
    instr=-
    if [ "$instructions" = 1 ]; then
        # The last cell of warm_instructions' row: vmm / classic.
        instr=$(POLICIES="classic vmm" bash "$root/bench/warm_instructions.sh" \
            ${replay_args[@]+"${replay_args[@]}"} "$t" |
            tail -1 | awk -F'|' '{gsub(/ /, "", $(NF-1)); print $(NF-1)}')
    fi
    echo "$name $period $events $parts $host $instr $(grep "first replay, map+unmap" <<<"$churn" | cut -d: -f2)"
done >"$out/parts.txt"

SET=$set_name python3 - "$out/parts.txt" <<'EOF'
import os, re, statistics, sys

rows = []
for line in open(sys.argv[1]):
    f = line.split()
    name, period, events, parts, host = f[0], int(f[1]), int(f[2]), int(f[3]), float(f[4])
    instr = None if f[5] == "-" else float(f[5])
    calls = [int(x) for x in f[6:]]
    last = calls[-10:]
    slice_events = events / parts
    # Settled from: the first slice after which no slice makes more than twice
    # the median of the last 10, plus 10 calls.
    bound = 2 * statistics.median(last) + 10
    settled = len(calls)
    while settled > 0 and calls[settled - 1] <= bound:
        settled -= 1
    rows.append((name, period, 1000 * sum(last) / (len(last) * slice_events),
                 sum(last) / len(last) * period / slice_events, settled + 1, host, instr))
counted = all(r[6] is not None for r in rows)
print("| long run | events per step | maps+unmaps / 1000 events, last 10 steps | per step | settled from step | host time vs classic |"
      + (" instructions vs classic |" if counted else ""))
print("|---|---:|---:|---:|---:|---:|" + ("---:|" if counted else ""))
for name, period, per_k, per_step, settled, host, instr in rows:
    print(f"| {name} | {period} | {per_k:.1f} | {per_step:.0f} | {settled} | {host:.2f} |"
          + (f" {instr:.3f} |" if counted else ""))
print()
families = {}
for name, _, per_k, _, settled, host, instr in rows:
    if os.environ["SET"] == "zoo":  # by mode: MODEL.MODE.bBATCH
        fam = "bench/zoo " + re.search(r"\.([a-z-]+)\.b\d+$", name).group(1)
    else:
        fam = name.split("_x")[0]
    families.setdefault(fam, []).append((per_k, settled, host, instr))
for fam, v in families.items():
    churn = [c for c, _, _, _ in v]
    hosts = [h for _, _, h, _ in v]
    line = (f"{fam}: {len(v)} long runs; maps+unmaps per 1000 events, last 10 steps: "
            f"median {statistics.median(churn):.1f}, mean {statistics.mean(churn):.1f}, "
            f"max {max(churn):.1f}, above 20: {sum(1 for x in churn if x > 20)}; "
            f"settled from step {min(s for _, s, _, _ in v)}-{max(s for _, s, _, _ in v)}; "
            f"host time vs classic: median {statistics.median(hosts):.2f}, max {max(hosts):.2f}")
    if counted:
        ins = [i for _, _, _, i in v]
        line += (f"; instructions vs classic: median {statistics.median(ins):.3f}, "
                 f"max {max(ins):.3f}")
    print(line)
EOF
