#!/usr/bin/env bash
# bench/replay_all.sh: the side-by-side benchmark of docs/benchmarks.md.
#
# Runs `build/stowage replay --policy all --policy jemalloc-decay --policy
# jemalloc-tcache --min-capacity --json --repeats R` on every shared trace RUNS
# times (each run is one process; the policies of a trace are timed in rounds,
# an untimed and a timed pass of each in turn: stowage replay's timing), then
# prints, as Markdown:
#   1. one row per (trace, policy): peak reserved, ratio to peak live, minimum
#      capacity, backend calls, ns/event (median over runs of each run's median
#      of R warm repeats), OOMs;
#   2. classic ns/event / jemalloc ns/event per trace, per run (same process,
#      same trace) and their median (the goal's reference), the median of
#      classic / jemalloc-decay (jemalloc with its default decay) and classic /
#      jemalloc-tcache (jemalloc with a thread cache), for context,
#      and the median of vmm / classic (the page-mapped pool's host-cost goal);
#   3. the PyTorch models against the real figures of ../shared/traces/README.md;
#   4. the goals, met or not.
# Usage: bench/replay_all.sh [RUNS=3] [REPEATS=7]   (from the repository root,
# after building: cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build)
set -euo pipefail

runs=${1:-3}
repeats=${2:-7}
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/bench/shared_traces.sh"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

for r in $(seq 1 "$runs"); do
    echo "run $r/$runs: build/stowage replay --policy all --policy jemalloc-decay" \
        "--policy jemalloc-tcache --min-capacity --json --repeats $repeats ..." >&2
    "$root/build/stowage" replay --policy all --policy jemalloc-decay --policy jemalloc-tcache \
        --min-capacity --json --repeats "$repeats" "${trace_paths[@]}" >"$out/run$r.jsonl"
done

python3 - "$out" "$runs" "$traces_dir/README.md" "${traces[@]}" <<'EOF'
import json, os, re, statistics, sys

out, runs, readme, traces = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
rows = {}  # (trace, policy) -> [result per run]
order = []
for r in range(1, runs + 1):
    for line in open(os.path.join(out, f"run{r}.jsonl")):
        j = json.loads(line)
        key = (os.path.basename(j["trace"])[:-4], j["policy"])
        if key not in rows:
            rows[key] = []
            order.append(key)
        rows[key].append(j)

def fmt(v):
    return "-" if v is None else str(v)

print("| trace | policy | peak reserved bytes | reserved / live | min capacity bytes | min / live "
      "| backend calls | ns/event | OOMs |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
for key in order:
    js = rows[key]
    j = js[0]
    ns = statistics.median(x["ns_per_event"] for x in js)
    mc = j["min_capacity_bytes"]
    mc_ratio = "-" if mc is None else f"{mc / j['peak_live_bytes']:.4f}"
    print(f"| {key[0]} | {key[1]} | {j['peak_reserved_bytes']} | {j['reserved_over_live']:.4f} | "
          f"{fmt(mc)} | {mc_ratio} | "
          f"{fmt(j['backend_calls'])} | {ns:.1f} | {j['ooms']} |")

print()
print("| trace | classic / jemalloc ns/event, per run | median | classic / jemalloc-decay, median "
      "| classic / jemalloc-tcache, median | vmm / classic, median |")
print("|---|---|---:|---:|---:|---:|")
ratios_ok = vmm_ok = tcache_ok = True
for t in traces:
    c, je, jd = rows[(t, "classic")], rows[(t, "jemalloc")], rows[(t, "jemalloc-decay")]
    rs = [a["ns_per_event"] / b["ns_per_event"] for a, b in zip(c, je)]
    med = statistics.median(rs)
    ratios_ok &= med <= 0.25
    med_decay = statistics.median(a["ns_per_event"] / b["ns_per_event"] for a, b in zip(c, jd))
    med_tcache = statistics.median(a["ns_per_event"] / b["ns_per_event"]
                                   for a, b in zip(c, rows[(t, "jemalloc-tcache")]))
    tcache_ok &= med_tcache <= 0.25
    med_vmm = statistics.median(a["ns_per_event"] / b["ns_per_event"]
                                for a, b in zip(rows[(t, "vmm")], c))
    vmm_ok &= med_vmm <= 1.5
    print(f"| {t} | {', '.join(f'{x:.3f}' for x in rs)} | {med:.3f} | {med_decay:.3f} "
          f"| {med_tcache:.3f} | {med_vmm:.2f} |")

real = {}
for line in open(readme):
    m = re.match(r"\|\s*(\w+)\s*\|\s*(\d+)\s*\|\s*(\d+) \([\d.]+\)\s*\|\s*(\d+) \(", line)
    if m:
        real[m.group(1)] = (int(m.group(3)), int(m.group(4)))
print()
print("| trace | mode | model peak reserved | PyTorch 2.11 | relative error |")
print("|---|---|---:|---:|---:|")
model_ok = True
for t in traces:
    for mode, pol, idx in (("native", "pytorch", 0), ("expandable", "pytorch-expandable", 1)):
        got, want = rows[(t, pol)][0]["peak_reserved_bytes"], real[t][idx]
        err = (got - want) / want
        model_ok &= abs(err) <= 0.01
        print(f"| {t} | {mode} | {got} | {want} | {100 * err:+.3f}% |")

print()
mc_ok = True
for t in traces:
    a = rows[(t, "classic")][0]["min_capacity_bytes"]
    b = rows[(t, "pytorch")][0]["min_capacity_bytes"]
    mc_ok &= a <= b
    print(f"- {t}: classic min capacity {a} vs pytorch {b}: "
          f"{'<=' if a <= b else '>'} ({(a - b) / 2**20:+.0f} MiB, {100 * (a - b) / b:+.2f}%)")
print()
print(f"- goal: PyTorch models within 1% of the real figures on every trace: "
      f"{'met' if model_ok else 'MISSED'}")
print(f"- goal: classic min capacity <= pytorch min capacity on every trace: "
      f"{'met' if mc_ok else 'MISSED'}")
print(f"- goal: classic ns/event <= 0.25 x jemalloc ns/event (median ratio) on every trace: "
      f"{'met' if ratios_ok else 'MISSED'}")
print(f"  (context) the same against jemalloc-tcache, jemalloc with a thread cache: "
      f"{'met' if tcache_ok else 'MISSED'}")
print(f"- goal: vmm ns/event <= 1.5 x classic ns/event (median ratio, same runs) on "
      f"every trace: {'met' if vmm_ok else 'MISSED'}")
EOF
