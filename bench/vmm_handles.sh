#!/usr/bin/env bash
# bench/vmm_handles.sh: the page-mapped pool's physical handle size against its driver calls
# and its memory (docs/decisions.md, handle sizes), on single replays from a cold pool.
#
# The traces: the shared ones, their scaled variants (bench/scaled_traces.py, FACTORS, as
# bench/vmm_heldout.sh makes them) and, given SNAPSHOT_DIR, the distinct workloads of its
# public PyTorch snapshots (bench/snapshot_check.py --workloads, as bench/snapshot_heldout.sh
# extracts them). For each size of HANDLES (vmm_handle_mb), bench/vmm_calls.py prints a row:
# vmm's map + unmap calls and modelled driver time against the pytorch-expandable model's,
# reserved / live, and the traces that miss each goal (calls or time above 2 x the model's,
# reserved above 1.01 x live where ideal-remap is at most 1.005). TABLE=1 prints instead
# vmm_calls.py's table of every trace at the default handle size (the goals' check).
# The handle size is one of the pool's measured constants (stowage/tuning.h), given to
# `stowage replay --tuning`. Extra arguments go to the replays: settings (--conf
# KEY:VALUE,...) and more constants (--tuning KEY:VALUE,..., joined with each row's
# vmm_handle_mb).
# Usage: bench/vmm_handles.sh [SNAPSHOT_DIR] [--conf ...] [--tuning ...]   (from the
# repository root, after building; STOWAGE=build/stowage, HANDLES="2 8 16 20 24 32 48 64 128",
# FACTORS=0.6,0.7,0.8,0.9,1.05,1.1,1.25,1.5; about 15 s a row for the 85 traces of the
# shared, scaled and 40 snapshot workloads)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/bench/shared_traces.sh"
factors=${FACTORS:-0.6,0.7,0.8,0.9,1.05,1.1,1.25,1.5}
handles=${HANDLES:-2 8 16 20 24 32 48 64 128}
stowage=${STOWAGE:-$root/build/stowage}
snapshots=
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then
    snapshots=$1
    shift
fi
# The constants of --tuning join each row's handle size; the other arguments go as they are.
tuning=
extra=()
while [ $# -gt 0 ]; do
    if [ "$1" = --tuning ]; then
        [ $# -ge 2 ] || { echo "vmm_handles: --tuning needs KEY:VALUE,..." >&2; exit 2; }
        tuning="${tuning:+$tuning,}$2"
        shift 2
    else
        extra+=("$1")
        shift
    fi
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

python3 "$root/bench/scaled_traces.py" "$out/scaled" --src "$traces_dir" --factors "$factors" \
    >/dev/null
all=("${trace_paths[@]}" "$out"/scaled/*.rep)
if [ -n "$snapshots" ]; then
    python3 "$root/bench/snapshot_check.py" --stowage "$stowage" \
        --workloads "$out/wl" "$snapshots"/* >/dev/null || true
    # The same requests recorded twice (a file committed under two names) count once.
    declare -A seen=()
    for t in "$out"/wl/*.rep; do
        [ -f "$t" ] || continue
        sum=$(md5sum <"$t" | cut -d' ' -f1)
        [ -n "${seen[$sum]:-}" ] && continue
        seen[$sum]=1
        all+=("$t")
    done
fi
echo "${#all[@]} traces" >&2
calls=(python3 "$root/bench/vmm_calls.py" --stowage "$stowage" --jobs 2)
if [ "${TABLE:-0}" = 1 ]; then
    "${calls[@]}" "${all[@]}" -- ${tuning:+--tuning "$tuning"} ${extra[@]+"${extra[@]}"}
    exit 0
fi
python3 -c "import sys; sys.path.insert(0, '$root/bench'); import vmm_calls; print(vmm_calls.ROW_HEADER)"
for mb in $handles; do
    "${calls[@]}" --row "$mb" "${all[@]}" -- --tuning "vmm_handle_mb:$mb${tuning:+,$tuning}" \
        ${extra[@]+"${extra[@]}"}
done
