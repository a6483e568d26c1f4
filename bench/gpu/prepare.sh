#!/usr/bin/env bash
# bench/gpu/prepare.sh: run on the CPU machine before a GPU run. Copies the
# traces bench/gpu/run.sh replays into .gpu-carry/ (git-ignored), which the
# device call must name in `carry`:
#     bench/gpu/prepare.sh && run(command="bash bench/gpu/run.sh", carry=[".gpu-carry"])
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
# STOWAGE_TRACES is taken as another name for STOW_TRACES_DIR.
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
# copy_libs BINARY DIR: the shared libraries BINARY loads into DIR, but the C and C++
# runtimes, which the GPU machine has in newer versions.
copy_libs() {
    ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r lib; do
        case "$(basename "$lib")" in
            libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|\
            ld-linux*|libstdc++.so.*|libgcc_s.so.*) ;;
            *) cp -L "$lib" "$2/" ;;
        esac
    done
}
# The Criterion GPU tests (tests/unit/test_cuda.c, test_torch_entry.c), built here: the GPU
# machine has neither Criterion nor jemalloc. Built to find the repository's files from the
# directory they run in (STOW_TEST_SOURCE_DIR "."), with every shared library they load but
# the C and C++ runtimes beside them in .gpu-carry/lib; run.sh runs them from its root when
# it cannot build them there. Skipped where Criterion is missing here too.
if pkg-config --exists criterion jemalloc; then
    tb="$root/build-gpu-tests"
    cmake -S "$root" -B "$tb" -DCMAKE_BUILD_TYPE=Release -DSTOW_DEBUG=1 \
          -DSTOW_TEST_SOURCE_DIR=. >/dev/null
    cmake --build "$tb" -j2 --target test_cuda test_torch_entry >/dev/null
    rm -rf "$root/.gpu-carry/bin" "$root/.gpu-carry/lib"
    mkdir -p "$root/.gpu-carry/bin" "$root/.gpu-carry/lib"
    for t in test_cuda test_torch_entry; do
        cp "$tb/$t" "$root/.gpu-carry/bin/"
        copy_libs "$tb/$t" "$root/.gpu-carry/lib"
    done
    echo "prepare: test_cuda and test_torch_entry with $(ls "$root/.gpu-carry/lib" | wc -l) libraries"
fi
# The CLI with debug information, and the libraries it loads, for run.sh part 7
# (bench/gpu/host_profile.sh: the host time of vmm against classic on that machine's CPU, and
# where it goes): built here so that both machines run the same instructions.
if pkg-config --exists jemalloc; then
    pb="$root/build-gpu-prof"
    cmake -S "$root" -B "$pb" -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS=-g -DSTOW_DEBUG=1 \
          -DSTOW_BUILD_TESTS=OFF >/dev/null
    cmake --build "$pb" -j2 --target stowage_cli >/dev/null
    rm -rf "$root/.gpu-carry/prof"
    mkdir -p "$root/.gpu-carry/prof/lib"
    cp "$pb/stowage" "$root/.gpu-carry/prof/"
    copy_libs "$pb/stowage" "$root/.gpu-carry/prof/lib"
    echo "prepare: the CLI with -g and $(ls "$root/.gpu-carry/prof/lib" | wc -l) libraries"
fi
du -sh "$root/.gpu-carry" | awk -v n="$n" '{print "prepare: " n " traces, " $1 " in .gpu-carry (carry limit 64 MiB)"}'
