#!/usr/bin/env bash
# bench/gpu/prepare.sh: run on the CPU machine before a GPU session. Copies the
# traces bench/gpu/run.sh replays into .gpu-carry/ (git-ignored), which the
# device call must name in `carry`:
#     bench/gpu/prepare.sh && run(command="bash bench/gpu/run.sh", carry=[".gpu-carry"])
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
# STOWAGE_TRACES, this script's older name for STOW_TRACES_DIR, still works.
STOW_TRACES_DIR=${STOW_TRACES_DIR:-${STOWAGE_TRACES:-}}
. "$root/bench/shared_traces.sh"
dst="$root/.gpu-carry/traces"
mkdir -p "$dst"
n=0
for path in "${trace_paths[@]}"; do
    if [ -f "$path" ]; then
        cp -f "$path" "$dst/"
        n=$((n + 1))
    else
        echo "prepare: $path missing; skipped" >&2
    fi
done
# The long runs of the training traces (40 more steps each, bench/long_run.py): what a
# page-mapped pool does once its loop repeats, replayed on the CUDA backend.
long=()
for name in gpt2_train resnet50_train vit_train; do
    [ -f "$dst/$name.rep" ] && long+=("$dst/$name.rep")
done
if [ ${#long[@]} -gt 0 ]; then
    rm -rf "$root/.gpu-carry/long"
    python3 "$root/bench/long_run.py" "$root/.gpu-carry/long" "${long[@]}" --steps 40 >/dev/null
fi
du -sh "$root/.gpu-carry" | awk -v n="$n" '{print "prepare: " n " traces, " $1 " in .gpu-carry (carry limit 64 MiB)"}'
