#!/usr/bin/env bash
# bench/gpu/torch_adapter.sh: the C++ adapter's GPU checks (bench/gpu/torch_adapter.py) in one
# device call of at most 600 s:
#     run(command="bash bench/gpu/torch_adapter.sh", carry=[".gpu-carry"])
# Builds libstowage.so (build-gpu/), then the adapter against the machine's torch
# (python/backend/stowage_backend.py torch-adapter), then runs every check under PyTorch's
# allocator and under Stowage's. PyTorch's test/test_cuda.py is not in the wheel and the GPU
# machine has no network: put the file of this torch's release tag at .gpu-carry/test_cuda.py
# (or name it in TEST_CUDA_PY) for the test_cuda check, which is skipped, saying so, without it.
# CHECKS=stats,oom,... runs some only. Results: $OUT/torch_adapter.json (default ./out-gpu),
# the build's and the checks' logs beside it; the table is printed last.
set -u
cd "$(dirname "$0")/../.."
ROOT="$PWD"
OUT="${OUT:-$ROOT/out-gpu}"
BUILD="$ROOT/build-gpu"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
T0=$(date +%s)
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
torch.cuda.get_device_name(0))' 2>&1 | tee "$OUT/env.log"
{
    cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DSTOW_WITH_TOOLS=OFF \
          -DSTOW_BUILD_TESTS=OFF >/dev/null &&
    cmake --build "$BUILD" -j"$(nproc)" --target stowage &&
    "$PY" python/backend/stowage_backend.py torch-adapter "$BUILD" "$BUILD/libstowage.so"
} > "$OUT/build.log" 2>&1 || { tail -n 30 "$OUT/build.log"; echo "build failed"; exit 1; }
echo "built in $(( $(date +%s) - T0 ))s"
export STOWAGE_LIB="$BUILD/libstowage.so" STOWAGE_TORCH_ADAPTER="$BUILD/libstowage_torch.so"
export TEST_CUDA_PY="${TEST_CUDA_PY:-$ROOT/.gpu-carry/test_cuda.py}"
left=$(( 580 - ($(date +%s) - T0) ))
timeout --kill-after=10 "$left" "$PY" bench/gpu/torch_adapter.py --out "$OUT" \
    ${CHECKS:+--checks "$CHECKS"} 2>&1 | tee "$OUT/checks.log"
echo "total $(( $(date +%s) - T0 ))s"
