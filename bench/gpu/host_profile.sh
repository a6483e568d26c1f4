#!/usr/bin/env bash
# bench/gpu/host_profile.sh DIR: where the page-mapped pool's host time goes on this machine's
# CPU, against the classic pool's, with no GPU involved (the simulated device).
#
# Why: host time is the machine's as much as the code's (docs/benchmarks.md, GPU runs), and the
# GPU machine has no perf.
# It runs the CLI that bench/gpu/prepare.sh built on the CPU machine with -g
# (.gpu-carry/prof/stowage, with the libraries it loads), so that both machines run the same
# instructions:
#   1. ratios.txt: `stowage replay --policy classic --policy vmm --repeats 9` on the shared
#      traces and the long runs, ROUNDS (3) times: host ns/event of both, same process.
#   2. prof_{classic,vmm}_TRACE.txt: each policy alone under bench/gpu/sampler.c (4 kHz: at 20 kHz
#      the signals cost more than the replay on the CPU machine), for the long runs of
#      gpt2_train and resnet50_train. Resolve them where the binary is, with
#      `python3 bench/gpu/profile_report.py .gpu-carry/prof/stowage A B`.
# The CPU machine runs the same script for the other side of the comparison.
set -u
cd "$(dirname "$0")/../.."
dir="${1:?usage: host_profile.sh DIR}"
mkdir -p "$dir"
prof="$PWD/.gpu-carry/prof"
bin="$prof/stowage"
[ -x "$bin" ] || { echo "host_profile: $bin missing (bench/gpu/prepare.sh builds it)"; exit 1; }
export LD_LIBRARY_PATH="$prof/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
gcc -O2 -fPIC -shared bench/gpu/sampler.c -o "$dir/sampler.so" -lrt || exit 1
traces="$PWD/.gpu-carry/traces"
long="$PWD/.gpu-carry/long"
{
    grep -m1 "model name" /proc/cpuinfo; echo "cpus $(nproc)"
    grep -m1 "cache size" /proc/cpuinfo
    echo "thp: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>&1)"
    echo "perf: $(command -v perf || echo none)"
    lscpu 2>/dev/null | grep -i -E "cache|mhz|hypervisor|virtual" || true
} > "$dir/cpu.txt" 2>&1
cat "$dir/cpu.txt"
set -- "$traces/gpt2_train.rep" "$traces/resnet50_train.rep" "$traces/vit_train.rep" \
    "$traces/gpt2_generate.rep" "$long/gpt2_train_long.rep" "$long/resnet50_train_long.rep" \
    "$long/vit_train_long.rep"
: > "$dir/ratios.txt"
for round in $(seq "${ROUNDS:-3}"); do
    "$bin" replay --policy classic --policy vmm --repeats 9 --json "$@" >> "$dir/ratios.txt" ||
        echo "round $round failed" >&2
done
python3 - "$dir/ratios.txt" > "$dir/table.txt" <<'EOF'
import collections, json, os, statistics, sys
ns = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    r = json.loads(line)
    ns[os.path.basename(r["trace"])][r["policy"]].append(r["ns_per_event"])
print(f"{'trace':28s} {'classic ns':>10s} {'vmm ns':>8s}  vmm/classic by round")
for t, by in ns.items():
    ratios = [v / c for c, v in zip(by["classic"], by["vmm"])]
    print(f"{t:28s} {statistics.median(by['classic']):10.1f} {statistics.median(by['vmm']):8.1f}  "
          + " ".join(f"{x:.2f}" for x in ratios))
EOF
for t in gpt2_train_long resnet50_train_long; do
    for p in classic vmm; do
        STOW_SAMPLER_OUT="$dir/prof_${p}_$t.txt" STOW_SAMPLER_HZ=4000 LD_PRELOAD="$dir/sampler.so" \
            "$bin" replay --policy "$p" --repeats 150 "$long/$t.rep" | grep "host ns"
    done
done
rm -f "$dir/sampler.so"
cat "$dir/table.txt"
