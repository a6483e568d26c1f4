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
# Extra arguments go to the replays (--conf KEY:VALUE,...).
# Usage: bench/vmm_handles.sh [SNAPSHOT_DIR] [--conf ...]   (from the repository root, after
# building; HANDLES="2 8 16 20 24 32 48 64 128", FACTORS=0.6,0.7,0.8,0.9,1.05,1.1,1.25,1.5;
# about 15 s a row for the 85 traces of the shared, scaled and 40 snapshot workloads)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/bench/shared_traces.sh"
factors=${FACTORS:-0.6,0.7,0.8,0.9,1.05,1.1,1.25,1.5}
handles=${HANDLES:-2 8 16 20 24 32 48 64 128}
snapshots=
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then
    snapshots=$1
    shift
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

python3 "$root/bench/scaled_traces.py" "$out/scaled" --src "$traces_dir" --factors "$factors" \
    >/dev/null
all=("${trace_paths[@]}" "$out"/scaled/*.rep)
if [ -n "$snapshots" ]; then
    python3 "$root/bench/snapshot_check.py" --stowage "$root/build/stowage" \
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
calls=(python3 "$root/bench/vmm_calls.py" --stowage "$root/build/stowage" --jobs 2)
if [ "${TABLE:-0}" = 1 ]; then
    "${calls[@]}" "${all[@]}" -- "$@"
    exit 0
fi
python3 -c "import sys; sys.path.insert(0, '$root/bench'); import vmm_calls; print(vmm_calls.ROW_HEADER)"
for mb in $handles; do
    conf="vmm_handle_mb:$mb"
    extra=()
    # A --conf given on the command line joins the handle size.
    if [ $# -ge 2 ] && [ "$1" = --conf ]; then
        conf="$conf,$2"
        extra=("${@:3}")
    else
        extra=("$@")
    fi
    "${calls[@]}" --row "$mb" "${all[@]}" -- --conf "$conf" "${extra[@]}"
done
