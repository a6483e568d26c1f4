#!/usr/bin/env bash
# bench/ab_builds.sh: is build B's classic pool faster than build A's on a
# trace? (docs/benchmarks.md, host cost) With POLICY=vmm (any policy of
# `stowage replay`), that pool's instead of the classic one.
#
# Runs `stowage replay --policy POLICY --policy jemalloc --repeats R --json
# TRACE` ROUNDS times for each build, A then B in every round, each run from a
# fresh copy of its binary in a new directory (a binary run again and again
# from one file can run a few per cent faster or slower than a byte-for-byte
# copy elsewhere: docs/benchmarks.md, comparing builds). Prints per round
# POLICY ns/event of A and B, B / A, and each
# run's POLICY / jemalloc; then the median and quartiles of B / A and the
# median POLICY / jemalloc of each build.
# Usage: [POLICY=classic] bench/ab_builds.sh BUILD_A BUILD_B TRACE [ROUNDS=10] [REPEATS=7]
#   BUILD_A, BUILD_B: build directories holding a `stowage` binary (for
#   instance cmake -S . -B /tmp/a -DCMAKE_BUILD_TYPE=Release && cmake --build
#   /tmp/a --target stowage_cli, once per tree).
set -euo pipefail

if [ $# -lt 3 ]; then
    echo "usage: $0 BUILD_A BUILD_B TRACE [ROUNDS=10] [REPEATS=7]" >&2
    exit 2
fi
build_a=$1
build_b=$2
trace=$3
rounds=${4:-10}
repeats=${5:-7}
policy=${POLICY:-classic}
[ "$policy" != jemalloc ] || { echo "ab_builds: POLICY is compared against jemalloc" >&2; exit 2; }
for b in "$build_a" "$build_b"; do
    [ -x "$b/stowage" ] || { echo "ab_builds: no executable $b/stowage" >&2; exit 2; }
done
[ -r "$trace" ] || { echo "ab_builds: cannot read $trace" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run_fresh() { # build -> "policy_ns jemalloc_ns"
    local dir
    dir=$(mktemp -d "$out/run.XXXXXX")
    cp "$1/stowage" "$dir/stowage"
    "$dir/stowage" replay --policy "$policy" --policy jemalloc --repeats "$repeats" --json \
        "$trace" | python3 -c '
import json, sys
ns = {}
for line in sys.stdin:
    d = json.loads(line)
    ns[d["policy"]] = d["ns_per_event"]
print(ns[sys.argv[1]], ns["jemalloc"])' "$policy"
    rm -rf "$dir"
}

for r in $(seq 1 "$rounds"); do
    echo "$r $(run_fresh "$build_a") $(run_fresh "$build_b")"
done >"$out/rounds.txt"

python3 - "$out/rounds.txt" "$trace" "$policy" <<'EOF'
import statistics, sys
p = sys.argv[3]
rows = [list(map(float, line.split())) for line in open(sys.argv[1])]
print(f"| round | A {p} ns/event | B {p} ns/event | B / A | A {p} / jemalloc | B {p} / jemalloc |")
print("|---:|---:|---:|---:|---:|---:|")
ratios, ra, rb = [], [], []
for n, ca, ja, cb, jb in rows:
    ratios.append(cb / ca)
    ra.append(ca / ja)
    rb.append(cb / jb)
    print(f"| {int(n)} | {ca:.1f} | {cb:.1f} | {cb / ca:.3f} | {ca / ja:.3f} | {cb / jb:.3f} |")
q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
print(f"\n{sys.argv[2]}: B / A {p} ns/event median {statistics.median(ratios):.3f} "
      f"(quartiles {q[0]:.3f}-{q[2]:.3f}, {len(ratios)} rounds); {p} / jemalloc median "
      f"A {statistics.median(ra):.3f}, B {statistics.median(rb):.3f}")
EOF
