#!/usr/bin/env bash
# bench/warm_instructions.sh: the host cost of each policy per event, counted in instructions,
# which unlike time does not move with the machine (docs/benchmarks.md, host cost).
#
# For each TRACE and each policy of POLICIES, runs `stowage replay --policy P --json --repeats N`
# under callgrind for N = 1 and N = 3. Each repeat replays the trace twice on the same warm pool
# (an untimed pass, then the timed one: replay/replay_engine.c, time_rounds), and everything else
# (parsing the trace, the first pass, the report) is the same in both runs, so their difference
# is four warm passes. Prints one Markdown row per trace: the events, each policy's instructions
# per event per warm pass, and each later policy against the first (vmm / classic by default).
# Deterministic but for the timed figure's median sort and printing (a few tens of instructions a
# run: a count on a rounding boundary may move by one unit of its last digit): one run is enough,
# and two builds compare to that (STOWAGE=build_a/stowage, then STOWAGE=build_b/stowage), where
# timing needs medians over many rounds (bench/ab_builds.sh).
# Instructions are not time: cache misses and branch mispredictions are not in them.
# --conf gives the replays settings (STOWAGE_CONF's keys), --tuning the pool's measured
# constants (stowage/tuning.h, `stowage replay --tuning`).
# Usage: [POLICIES="classic vmm"] [STOWAGE=build/stowage] bench/warm_instructions.sh
#            [--conf KEY:VALUE,...] [--tuning KEY:VALUE,...] TRACE...      (from the repository
#        root, after building; needs valgrind; gpt2_train's long run, 126,549 events, takes
#        about 5 s a policy)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
stowage=${STOWAGE:-$root/build/stowage}
read -r -a policies <<<"${POLICIES:-classic vmm}"
conf=()
while [ "${1:-}" = "--conf" ] || [ "${1:-}" = "--tuning" ]; do
    [ $# -ge 2 ] || { echo "warm_instructions: $1 needs KEY:VALUE,..." >&2; exit 2; }
    conf+=("$1" "$2")
    shift 2
done
if [ $# -eq 0 ] || [ ${#policies[@]} -eq 0 ]; then
    echo "usage: [POLICIES=\"classic vmm\"] [STOWAGE=build/stowage] $0" \
        "[--conf KEY:VALUE,...] [--tuning KEY:VALUE,...] TRACE..." >&2
    exit 2
fi
if ! command -v valgrind >/dev/null; then
    echo "warm_instructions: valgrind is not installed" >&2
    exit 2
fi
[ -x "$stowage" ] || { echo "warm_instructions: $stowage is not built (make build)" >&2; exit 2; }
for t in "$@"; do
    [ -r "$t" ] || { echo "warm_instructions: $t: cannot read it" >&2; exit 2; }
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# callgrind on `stowage replay ... --repeats $3` of policy $2 on trace $1: the replay's JSON goes
# to $4.json, valgrind's log to $4.log, its exit status to $4.rc.
run_counted() {
    local rc=0
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$stowage" replay --policy "$2" \
        --json --repeats "$3" ${conf[@]+"${conf[@]}"} "$1" >"$4.json" 2>"$4.log" || rc=$?
    echo "$rc" >"$4.rc"
}

# The instructions counted by run $1 (run_counted's $4); on a failed replay, says why and exits
# with its status.
counted() {
    local rc
    rc=$(cat "$1.rc")
    if [ "$rc" != 0 ]; then
        echo "warm_instructions: stowage replay failed:" >&2
        grep -v '^==' "$1.log" | head -5 >&2 || true
        exit "$rc"
    fi
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$1.log"
}

header="| trace | events |"
rule="|---|---:|"
for p in "${policies[@]}"; do
    header+=" $p |"
    rule+="---:|"
done
for p in "${policies[@]:1}"; do
    header+=" $p / ${policies[0]} |"
    rule+="---:|"
done
echo "$header"
echo "$rule"
for t in "$@"; do
    row="| $(basename "$t" .rep) |"
    per_event=()
    events=
    for p in "${policies[@]}"; do
        # The two runs side by side: each is single-threaded, and the counts do not depend on it.
        run_counted "$t" "$p" 1 "$out/one" &
        run_counted "$t" "$p" 3 "$out/three"
        wait
        one=$(counted "$out/one")
        three=$(counted "$out/three")
        events=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["events"])' \
            "$out/one.json")
        n=$(awk -v a="$one" -v b="$three" -v e="$events" \
            'BEGIN { if (e > 0) printf "%.1f\n", (b - a) / 4 / e; else print "-" }')
        per_event+=("$n")
    done
    row+=" $events |"
    for n in "${per_event[@]}"; do
        row+=" $n |"
    done
    for n in "${per_event[@]:1}"; do
        row+=" $(awk -v n="$n" -v base="${per_event[0]}" \
            'BEGIN { if (n != "-" && base + 0 > 0) printf "%.3f\n", n / base; else print "-" }') |"
    done
    echo "$row"
done
