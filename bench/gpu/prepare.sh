#!/usr/bin/env bash
# bench/gpu/prepare.sh: run on the CPU machine before a GPU session. Copies the
# traces bench/gpu/run.sh replays into .gpu-carry/ (git-ignored), which the
# device call must name in `carry`:
#     bench/gpu/prepare.sh && run(command="bash bench/gpu/run.sh", carry=[".gpu-carry"])
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
src="${STOWAGE_TRACES:-$root/../shared/traces}"
dst="$root/.gpu-carry/traces"
mkdir -p "$dst"
n=0
. "$root/bench/shared_traces.sh"
for f in "${traces[@]}"; do
    if [ -f "$src/$f.rep" ]; then
        cp -f "$src/$f.rep" "$dst/"
        n=$((n + 1))
    else
        echo "prepare: $src/$f.rep missing; skipped" >&2
    fi
done
du -sh "$root/.gpu-carry" | awk -v n="$n" '{print "prepare: " n " traces, " $1 " in .gpu-carry (carry limit 64 MiB)"}'
