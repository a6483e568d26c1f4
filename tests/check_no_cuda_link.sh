#!/usr/bin/env bash
# tests/check_no_cuda_link.sh: libstowage.so must not depend on libcuda,
# libcudart or jemalloc at link time (the driver is dlopen'ed; the library is
# loaded into Python processes that bring their own malloc), must export
# the PyTorch entry points, and must export nothing but the stow_ API (hidden
# visibility: no stow__ internal, nothing without the prefix).
# Usage: tests/check_no_cuda_link.sh [path/to/libstowage.so]   (default build/libstowage.so)
set -u
lib="${1:-$(dirname "$0")/../build/libstowage.so}"
if [ ! -f "$lib" ]; then
    echo "check_no_cuda_link: $lib not found" >&2
    exit 2
fi
fail=0
needed=$(readelf -d "$lib" 2>/dev/null | awk '/\(NEEDED\)/ {gsub(/[\[\]]/, "", $NF); print $NF}')
if [ -z "$needed" ] && ! readelf -d "$lib" >/dev/null 2>&1; then
    echo "check_no_cuda_link: readelf cannot read $lib" >&2
    exit 2
fi
for n in $needed; do
    case "$n" in
    libcuda.so*|libcudart.so*|libjemalloc.so*|libnvidia*|libtorch*|libc10*)
        echo "FAIL: $lib has NEEDED $n" >&2
        fail=1 ;;
    esac
done
syms=$(nm -D --defined-only "$lib" | awk '{print $NF}')
for s in stow_torch_malloc stow_torch_free stow_torch_empty_cache stow_torch_record_stream \
         stow_torch_memory_fraction stow_torch_pool stow_torch_stats_json stow_cuda_probe \
         stow_cuda_backend_create; do
    if ! grep -qx "$s" <<<"$syms"; then
        echo "FAIL: $lib does not export $s" >&2
        fail=1
    fi
done
# Only the public API: exactly the STOW_API declarations of the headers (no
# stow__ internal, nothing without the prefix).
api=$(grep -rhoE '^STOW_API [^(]*\bstow_[a-z0-9_]+\(' "$(dirname "$0")/../include" |
      grep -oE 'stow_[a-z0-9_]+\($' | tr -d '(' | sort -u)
missing=$(comm -23 <(echo "$api") <(sort -u <<<"$syms"))
unlisted=$(comm -13 <(echo "$api") <(sort -u <<<"$syms"))
if [ -z "$api" ] || [ -n "$missing" ] || [ -n "$unlisted" ]; then
    echo "FAIL: exports differ from the STOW_API declarations; missing: $missing; not declared:" \
         $unlisted >&2
    fail=1
fi
# No undefined cu*/cuda* symbol either (that would be a link-time dependency in disguise).
if nm -D --undefined-only "$lib" | awk '{print $NF}' | grep -E '^(cu|cuda)[A-Z]' >&2; then
    echo "FAIL: $lib references CUDA symbols directly" >&2
    fail=1
fi
if [ "$fail" = 0 ]; then
    echo "ok: $lib needs only: $(echo $needed | tr '\n' ' '); exports $(wc -l <<<"$syms") stow_ API symbols"
fi
exit "$fail"
