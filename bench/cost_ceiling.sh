#!/usr/bin/env bash
# bench/cost_ceiling.sh: how fast could the classic pool's placement be with
# its statistics and its lock gone, and what does each of them cost? The
# ceiling experiment of docs/benchmarks.md, comparing builds.
#
# Builds copies of the committed tree (HEAD) in a scratch directory:
#   base     as committed;
#   ceiling  the same with the pool lock and the per-event accounting compiled
#            out: stow__lock/stow__unlock, stow__acct_alloc, stow__acct_free,
#            stow__acct_inactive_split and stow__acct_note_fragmentation return
#            at once, and stow_pool_alloc skips computing the largest free
#            block;
# and with --breakdown also one build per part of the ceiling:
#   nolock   the lock only;            noacct   stow__acct_alloc and _free only;
#   nosplit  the inactive-split figures only;
#   nofrag   the fragmentation peak and the largest-free lookup of allocations.
# Everything that places blocks (rounding, free index, split, coalesce, live
# map, block records) is untouched, so every build places every block at the
# same address (checked below); the patched builds' statistics are wrong and
# they are not thread-safe. They exist only here.
#
# Then, ROUNDS times, runs `stowage replay --policy all --repeats REPEATS
# --json` on every shared trace once per build, the builds in a rotating
# order, each from a fresh copy of its binary: on the shared VMs the same
# binary ran 10-20% slower from one file than from a copy of it, which a
# build-to-build comparison must not mistake for the code. Prints per trace
# and build the median classic ns/event, jemalloc ns/event and classic /
# jemalloc (same process), then each build's classic ns/event relative to
# base's in the same round (median over rounds).
#
# Usage: bench/cost_ceiling.sh [ROUNDS=5] [REPEATS=7] [--breakdown]
#        (from the repository root)
set -euo pipefail

breakdown=0
args=()
for a in "$@"; do
    if [ "$a" = --breakdown ]; then breakdown=1; else args+=("$a"); fi
done
rounds=${args[0]:-5}
repeats=${args[1]:-7}
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/bench/shared_traces.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

builds=(base ceiling)
[ "$breakdown" = 1 ] && builds+=(nolock noacct nosplit nofrag)

# The patch fails loudly if the code it expects has moved.
patch_build() { # BUILD_DIR PART...
    python3 - "$@" <<'EOF'
import sys
src, parts = sys.argv[1], set(sys.argv[2:])

def patch(rel, old, new):
    p = f"{src}/{rel}"
    s = open(p).read()
    if s.count(old) != 1:
        sys.exit(f"cost_ceiling.sh: {rel}: expected exactly one {old!r}")
    open(p, "w").write(s.replace(old, new))

def return_at_once(fn):
    p = f"{src}/accounting/accounting.h"
    s = open(p).read()
    i = s.find(f"static inline void {fn}(")
    if i < 0:
        sys.exit(f"cost_ceiling.sh: accounting.h: {fn} not found")
    j = s.index("{", i) + 1
    open(p, "w").write(s[:j] + "\n    return;\n" + s[j:])

if "lock" in parts:
    for fn in ("stow__lock", "stow__unlock"):
        patch("allocator/lock.h", f"static inline void {fn}(stow_lock_t *lock)\n{{\n",
              f"static inline void {fn}(stow_lock_t *lock)\n{{\n    (void)lock;\n    return;\n")
if "acct" in parts:
    for fn in ("stow__acct_alloc", "stow__acct_free"):
        return_at_once(fn)
if "split" in parts:
    return_at_once("stow__acct_inactive_split")
if "frag" in parts:
    return_at_once("stow__acct_note_fragmentation")
    patch("allocator/pool.c",
          "    uint64_t largest = stow__pool_largest_free(pool);\n",
          "    uint64_t largest = 0;\n")
EOF
}

for v in "${builds[@]}"; do
    mkdir -p "$work/$v"
    git -C "$root" archive HEAD | tar -x -C "$work/$v"
    case $v in
    ceiling) patch_build "$work/$v" lock acct split frag ;;
    nolock) patch_build "$work/$v" lock ;;
    noacct) patch_build "$work/$v" acct ;;
    nosplit) patch_build "$work/$v" split ;;
    nofrag) patch_build "$work/$v" frag ;;
    esac
    echo "building $v ..." >&2
    cmake -S "$work/$v" -B "$work/$v/build" -DSTOW_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCMAKE_C_FLAGS="-Wno-unused-parameter -Wno-unused-variable -Wno-unreachable-code" >/dev/null
    cmake --build "$work/$v/build" -j"$(nproc)" --target stowage_cli >/dev/null
done

n=${#builds[@]}
for r in $(seq 1 "$rounds"); do
    for k in $(seq 0 $((n - 1))); do
        v=${builds[$(((k + r) % n))]}
        echo "round $r/$rounds: $v" >&2
        cp "$work/$v/build/stowage" "$work/run_bin"
        "$work/run_bin" replay --policy all --repeats "$repeats" --json "${trace_paths[@]}" \
            >"$work/$v.$r.jsonl"
    done
done

python3 - "$work" "$rounds" "${builds[@]}" <<'EOF'
import json, os, statistics, sys
work, rounds, builds = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print("| trace | build | classic ns/event | jemalloc ns/event | classic / jemalloc |")
print("|---|---|---:|---:|---:|")
per = {}     # (trace, build) -> [(classic ns, jemalloc ns)] per round
peaks = {}   # trace -> build -> classic peak reserved bytes
for v in builds:
    for r in range(1, rounds + 1):
        got = {}
        for line in open(os.path.join(work, f"{v}.{r}.jsonl")):
            j = json.loads(line)
            key = (os.path.basename(j["trace"])[:-4], j["policy"])
            got[key] = j["ns_per_event"]
            if j["policy"] == "classic":
                peaks.setdefault(key[0], {})[v] = j["peak_reserved_bytes"]
        for (t, pol), ns in got.items():
            if pol == "classic":
                per.setdefault((t, v), []).append((ns, got[(t, "jemalloc")]))
traces = sorted({k[0] for k in per})
for t in traces:
    for v in builds:
        xs = per[(t, v)]
        print(f"| {t} | {v} | {statistics.median(a for a, _ in xs):.1f} | "
              f"{statistics.median(b for _, b in xs):.1f} | "
              f"{statistics.median(a / b for a, b in xs):.3f} |")
print()
print("classic ns/event relative to base in the same round (median of " + str(rounds) + " rounds):")
print()
print("| build | " + " | ".join(traces) + " |")
print("|---|" + "---:|" * len(traces))
for v in builds:
    cells = [statistics.median(per[(t, v)][r][0] / per[(t, "base")][r][0] for r in range(rounds))
             for t in traces]
    print(f"| {v} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
# Same placement in every build, or the comparison means nothing.
for t, p in sorted(peaks.items()):
    if len(set(p.values())) != 1:
        sys.exit(f"cost_ceiling.sh: {t}: classic peak reserved differs between builds ({p}): "
                 "they do not place alike")
print()
print("classic peak reserved identical in every build on every trace (same placement)")
EOF
