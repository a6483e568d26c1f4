#!/usr/bin/env bash
# bench/gpu/run.sh: everything Stowage checks on a GPU machine, in ONE call
# (budget: well under 10 minutes). Run from the repository root:
#     bash bench/gpu/run.sh            # results under $OUT (default ./out-gpu)
# Parts, each in its own process with a timeout; a failure is reported, never fatal:
#   1 build      libstowage.so (CMake, STOW_WITH_TOOLS=OFF without jemalloc; gcc fallback)
#   2 ctest      tests/unit/test_cuda and test_torch_entry (the Criterion GPU tests): built
#                there when Criterion exists, else the ones prepare.sh built and carried
#   3 gputests   bench/gpu/gpu_tests.py: PyTorch on Stowage (write/read, streams +
#                record_stream, OOM under a memory fraction, empty_cache, stats), on classic
#                pools (STOWAGE_CONF=policy:classic) and on page-mapped ones (policy:vmm)
#   4 replay     bench/gpu/replay_cuda (C, pool on the CUDA backend; classic, then vmm
#                with and without its learned step on the traces and their long runs) and
#                bench/gpu/replay_torch.py (Stowage vs PyTorch's allocator, same process, from
#                Python) and bench/gpu/replay_native.py (the same from C++, an extension;
#                again with policy:vmm against expandable_segments:True, cold passes apart);
#                bench/gpu/remap_wait (C: what a page-mapped remap waits for, events or the
#                whole device, with another stream's queue behind it)
#   5 train      bench/gpu/train.py: GPT-2 small and ResNet-50, TRAIN_STEPS (30) steps each with
#                PyTorch native, native expandable_segments, Stowage's default, classic and vmm,
#                and classic and vmm with planned_steps and stowage.torch.step()
#                (TRAIN_MODELS, TRAIN_MODES, TRAIN_ROUNDS: below); infer_planned.py: ResNet-50
#                inference under stowage.torch.planned against native (outputs, step time)
#   6 unseen     bench/gpu/record_unseen.py: workloads the PyTorch models were never tuned on
#                (UNSEEN, default below), each recorded with PyTorch's default allocator (its
#                trace and max reserved) and again with expandable_segments (max reserved), into
#                $OUT/unseen; compared on the CPU machine with
#                `python3 bench/model_check.py DIR/unseen` (the models within 1%) and,
#                cudaMalloc by cudaMalloc, `python3 bench/snapshot_check.py DIR/unseen/*.pickle.gz`
#   7 hostprof   bench/gpu/host_profile.sh: vmm against classic on this machine's CPU alone (the
#                simulated device; the CLI built with -g by prepare.sh) and sampled profiles of
#                both, resolved on the CPU machine with bench/gpu/profile_report.py
#   8 routes     bench/gpu/torch_routes.py: the MemPool route (a region under
#                stowage.torch.mem_pool(), a CUDA graph captured into it and replayed,
#                torch.compile(mode="reduce-overhead") outside and inside it, Stowage's snapshot
#                beside PyTorch's and drawn by torch.cuda._memory_viz, out of memory) and the
#                global swap (training steps, its snapshot drawn, what CUDA graphs,
#                reduce-overhead and torch.cuda.memory._snapshot do, out of memory); the pages
#                and pickles in results/routes; the table (routes_report.py) printed last
#   9 steptime   bench/gpu/step_time.py: ResNet-50 and GPT-2 training step time under Stowage
#                classic against PyTorch native, STEP_ROUNDS (3) interleaved rounds of
#                STEP_STEPS (60) timed steps after 5 warm-up steps, each run its own process:
#                median and 10th-90th percentile per allocator, the same-round ratio to native,
#                and cudaMalloc + cudaFree per timed step (about 6 minutes on an H200; alone:
#                PARTS="1 9")
#  10 predict    bench/gpu/predict_vs_measured.py: each bench/predict/*.py predicted by
#                `python3 -m stowage predict --json --gpu CARD` (this card: H100 or H200; the
#                reserved peaks from .gpu-carry/prof/stowage, put on PATH) and run for real twice
#                under bench/gpu/measure_script.py, native and expandable_segments:True; peak
#                allocated, native and expandable reserved, predicted against measured, into
#                $OUT/predict_vs_measured.json and a table printed last (about 5 minutes; alone:
#                PARTS="10", after bash bench/gpu/prepare.sh, carry .gpu-carry)
# The table printed last summarises results/*.json. Everything is packed at the end into
# $OUT/gpu_results.tar.gz (logs/, results/, unseen/): the device tool brings back at most 8
# files from $OUT; status.txt stays beside it.
set -u
cd "$(dirname "$0")/../.."
ROOT="$PWD"
OUT="${OUT:-$ROOT/out-gpu}"
mkdir -p "$OUT/logs" "$OUT/results"
BUILD="$ROOT/build-gpu"
TRACES="$ROOT/.gpu-carry/traces"
[ -d "$TRACES" ] || TRACES="$ROOT/../shared/traces"
PY="${PYTHON:-python3}"
T0=$(date +%s)
STATUS="$OUT/status.txt"
: > "$STATUS"

# The whole run must end inside one device call (600 s at most) with time left to pack the
# results: a part gets at most what is left of BUDGET_S, and none starts with under 20 s left.
BUDGET_S="${BUDGET_S:-540}"
# PARTS: which of the ten parts run (say "6" alone for the unseen workloads in a second call).
# Parts 9 and 10 need a call of their own (PARTS="1 9", PARTS="10"): the others use up the budget.
PARTS="${PARTS:-1 2 3 4 5 6 7 8}"
SECTION=0
part() { # part NAME TIMEOUT_S CMD...
    local name="$1" t="$2"; shift 2
    case " $PARTS " in *" $SECTION "*) ;; *) return 0 ;; esac
    local left=$(( BUDGET_S - ($(date +%s) - T0) ))
    if [ "$left" -lt 20 ]; then
        printf '%-28s %-14s %4ss\n' "$name" "SKIP(budget)" 0 | tee -a "$STATUS"
        return 0
    fi
    [ "$t" -gt "$left" ] && t=$left
    local s=$(date +%s)
    timeout --kill-after=10 "$t" "$@" > "$OUT/logs/$name.log" 2>&1
    local rc=$?
    local verdict=ok
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && verdict="TIMEOUT(${t}s)"
    [ $rc -ne 0 ] && [ "$verdict" = ok ] && verdict="FAIL(rc=$rc)"
    printf '%-28s %-14s %4ss\n' "$name" "$verdict" "$(( $(date +%s) - s ))" | tee -a "$STATUS"
    [ $rc -ne 0 ] && tail -n 15 "$OUT/logs/$name.log" | sed 's/^/    | /'
    return 0
}

{
    echo "== machine"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | head -3
    "$PY" -c 'import torch,sys; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' 2>&1
    for m in transformers timm torchvision; do "$PY" -c "import $m; print('$m', $m.__version__)" 2>&1 | tail -1; done
    gcc --version | head -1; cmake --version | head -1
    # The host: its ns/event are compared with the CPU machine's (docs/benchmarks.md, GPU runs).
    grep -m1 "model name" /proc/cpuinfo; echo "cpus $(nproc)"
    echo "transparent hugepages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>&1)"
    pkg-config --modversion criterion jemalloc 2>&1 | tr '\n' ' '; echo
} > "$OUT/logs/env.log" 2>&1
cat "$OUT/logs/env.log"

# ---- 1 build ----
SECTION=1
build_lib() {
    local tests=OFF tools=OFF
    pkg-config --exists jemalloc && tools=ON
    [ $tools = ON ] && pkg-config --exists criterion && tests=ON
    # STOW_WITH_TOOLS=OFF: the library alone, no jemalloc or Criterion needed.
    cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DSTOW_WITH_TOOLS=$tools \
          -DSTOW_BUILD_TESTS=$tests >/dev/null &&
    cmake --build "$BUILD" -j"$(nproc)" --target stowage &&
    { [ $tests = OFF ] || cmake --build "$BUILD" -j"$(nproc)" --target test_cuda test_torch_entry; } &&
    return 0
    echo "cmake build failed; falling back to gcc"
    mkdir -p "$BUILD"
    local cuinc=""
    [ -f /usr/local/cuda/include/cuda.h ] && cuinc="-DSTOW_HAVE_CUDA_HEADERS=1 -isystem /usr/local/cuda/include"
    gcc -std=c11 -O2 -fPIC -shared -fvisibility=hidden -D_GNU_SOURCE -DSTOW_DEBUG=1 $cuinc -Iinclude -I. \
        allocator/*.c allocator/backend/*.c accounting/*.c trace/*.c planner/*.c python/csrc/*.c \
        -o "$BUILD/libstowage.so" -lpthread -ldl -lm
}
export BUILD
export -f build_lib
part build 240 bash -c build_lib
LIB="$BUILD/libstowage.so"
export STOWAGE_LIB="$LIB"
part check_no_cuda_link 20 bash tests/check_no_cuda_link.sh "$LIB"
part replay_cuda_build 60 gcc -std=c11 -O2 -D_GNU_SOURCE -Iinclude bench/gpu/replay_cuda.c \
    -o "$BUILD/replay_cuda" -L"$BUILD" -Wl,-rpath,"$BUILD" -lstowage -lpthread
part remap_wait_build 60 gcc -std=c11 -O2 -D_GNU_SOURCE -Iinclude bench/gpu/remap_wait.c \
    -o "$BUILD/remap_wait" -L"$BUILD" -Wl,-rpath,"$BUILD" -lstowage -lpthread

# ---- 2 Criterion GPU tests ----
SECTION=2
if [ -x "$BUILD/test_cuda" ]; then
    part ctest_cuda 150 "$BUILD/test_cuda" --verbose --jobs 1
    part ctest_torch_entry 60 "$BUILD/test_torch_entry"
elif [ -x "$ROOT/.gpu-carry/bin/test_cuda" ]; then
    # Built by bench/gpu/prepare.sh on the CPU machine, with the libraries they load (for
    # them alone: the Python parts keep the machine's own).
    carried_libs="$ROOT/.gpu-carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    part ctest_cuda 150 env LD_LIBRARY_PATH="$carried_libs" \
        "$ROOT/.gpu-carry/bin/test_cuda" --verbose --jobs 1
    part ctest_torch_entry 60 env LD_LIBRARY_PATH="$carried_libs" \
        "$ROOT/.gpu-carry/bin/test_torch_entry"
else
    case " $PARTS " in *" 2 "*) echo "ctest_cuda                   SKIP (no Criterion)" | tee -a "$STATUS" ;; esac
fi

# ---- 3 PyTorch on Stowage: functional GPU checks ----
SECTION=3
part gputests 150 env STOWAGE_CONF=policy:classic "$PY" bench/gpu/gpu_tests.py \
    --out "$OUT/results/gputests.json"
# The same checks on page-mapped pools (STOWAGE_CONF is read at each pool's creation).
part gputests_vmm 150 env STOWAGE_CONF=policy:vmm "$PY" bench/gpu/gpu_tests.py \
    --out "$OUT/results/gputests_vmm.json"

# ---- 4 replay: ns/event ----
SECTION=4
if [ -x "$BUILD/replay_cuda" ]; then
    # Classic, then the page-mapped pool on the real driver (cuMemCreate / cuMemMap at the
    # device's own granularity) with its learned step (the default) and without, on the same
    # traces and their long runs: host ns/event of the three side by side.
    LONG="$ROOT/.gpu-carry/long"
    replay_traces=("$TRACES/gpt2_train.rep" "$TRACES/resnet50_train.rep" "$TRACES/vit_train.rep"
                   "$TRACES/gpt2_generate.rep")
    for t in gpt2_train resnet50_train vit_train; do
        [ -f "$LONG/${t}_long.rep" ] && replay_traces+=("$LONG/${t}_long.rep")
    done
    part replay_cuda 120 "$BUILD/replay_cuda" "$OUT/results/replay_cuda.json" \
        --conf policy:classic "${replay_traces[@]}"
    part replay_cuda_vmm 120 "$BUILD/replay_cuda" "$OUT/results/replay_cuda_vmm.json" \
        --conf policy:vmm "${replay_traces[@]}"
    part replay_cuda_vmm_nolearn 120 "$BUILD/replay_cuda" \
        "$OUT/results/replay_cuda_vmm_nolearn.json" \
        --conf policy:vmm,vmm_learn_step:false "${replay_traces[@]}"
fi
if [ -x "$BUILD/remap_wait" ]; then
    # 20 rounds of each variant; 64 MiB blocks; s2 queues 600 memsets of 64 MiB (about 13 ms
    # on an H200: 40 of them took 0.7 ms there, too short to tell the two waits apart).
    part remap_wait 60 "$BUILD/remap_wait" "$OUT/results/remap_wait.json" 20 64 600
fi
part replay_torch 180 "$PY" bench/gpu/replay_torch.py --out "$OUT/results/replay_torch.json" \
    "$TRACES/gpt2_train.rep" "$TRACES/resnet50_train.rep" "$TRACES/vit_train.rep"
# Both allocators called from C++ (an extension built here), the loop's own cost apart:
# host ns/event of the allocators alone.
part replay_native 200 "$PY" bench/gpu/replay_native.py --out "$OUT/results/replay_native.json" \
    "$TRACES/gpt2_train.rep" "$TRACES/resnet50_train.rep" "$TRACES/vit_train.rep" \
    "$TRACES/gpt2_generate.rep"
# The page-mapped pool against PyTorch's expandable segments, both from C++ in one process:
# the cold pass (each trace from emptied caches: every page mapped anew, the driver's calls
# and all) and the warm ones, in the table report.py prints last.
part replay_native_vmm 150 env STOWAGE_CONF=policy:vmm \
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "$PY" bench/gpu/replay_native.py \
    --rounds 2 --passes 2 --out "$OUT/results/replay_native_vmm.json" \
    "$TRACES/gpt2_train.rep" "$TRACES/resnet50_train.rep" "$TRACES/vit_train.rep" \
    "$TRACES/gpt2_generate.rep"

# ---- 5 training runs (each its own process) ----
SECTION=5
# TRAIN_MODELS, TRAIN_MODES: which; TRAIN_ROUNDS above 1 runs them all that many times, in
# turn (results train_MODEL_MODE_rK.json), so that a step-time difference can be told from
# the machine's drift.
rounds="${TRAIN_ROUNDS:-1}"
for k in $(seq "$rounds"); do
    suffix=""
    [ "$rounds" -gt 1 ] && suffix="_r$k"
    for model in ${TRAIN_MODELS:-gpt2 resnet50}; do
        for mode in ${TRAIN_MODES:-native expandable stowage stowage_classic stowage_vmm \
                     stowage_planned stowage_vmm_planned}; do
            part "train_${model}_${mode}$suffix" 110 "$PY" bench/gpu/train.py --model "$model" \
                --mode "$mode" --steps "${TRAIN_STEPS:-30}" \
                --out "$OUT/results/train_${model}_${mode}$suffix.json"
        done
    done
done

# ResNet-50 inference: native, then Stowage with planned_steps and stowage.torch.planned
# (docs/planned.md); the same inputs, outputs compared.
for mode in native stowage_planned stowage_vmm_planned; do
    part "infer_resnet50_$mode" 110 "$PY" bench/gpu/infer_planned.py --mode "$mode" \
        --out "$OUT/results/infer_resnet50_$mode.json"
done

# ---- 6 workloads the PyTorch models were not tuned on (compared on the CPU machine) ----
SECTION=6
UNSEEN="${UNSEEN:-gpt2_medium_train bert_train convnext_train gpt2_generate_batches}"
mkdir -p "$OUT/unseen"
for w in $UNSEEN; do
    for mode in native expandable; do
        part "unseen_${w}_${mode}" 120 "$PY" bench/gpu/record_unseen.py "$w" "$mode" "$OUT/unseen"
    done
done

# ---- 7 host time of the page-mapped pool on this CPU, and where it goes ----
SECTION=7
part host_profile 120 bash bench/gpu/host_profile.sh "$OUT/results/host_profile"

# ---- 8 the PyTorch routes: MemPool (with CUDA graphs, reduce-overhead) and the global swap ----
SECTION=8
part routes_mempool 200 "$PY" bench/gpu/torch_routes.py --route mempool --out "$OUT/results/routes"
part routes_global 150 "$PY" bench/gpu/torch_routes.py --route global --out "$OUT/results/routes"

# ---- 9 training step time, interleaved rounds: Stowage classic against PyTorch native ----
SECTION=9
part steptime 420 "$PY" bench/gpu/step_time.py --out "$OUT/results/steptime" \
    --models "${STEP_MODELS:-resnet50,gpt2}" --modes "${STEP_MODES:-native,stowage}" \
    --rounds "${STEP_ROUNDS:-3}" --steps "${STEP_STEPS:-60}" --warmup 5
[ -f "$OUT/logs/steptime.log" ] && grep "^|" "$OUT/logs/steptime.log"

# ---- 10 stowage predict against the same scripts measured on this card ----
SECTION=10
prof="$ROOT/.gpu-carry/prof"
part predict_vs_measured 330 env PATH="$prof:$PATH" \
    LD_LIBRARY_PATH="$prof/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$PY" bench/gpu/predict_vs_measured.py --timeout 100 --out "$OUT/predict_vs_measured.json"

echo
echo "== summary ($(( $(date +%s) - T0 ))s total; logs in $OUT/logs)"
cat "$STATUS"
"$PY" bench/gpu/report.py "$OUT/results" 2>&1 || echo "(report failed)"
echo "unseen workloads: bring $OUT/gpu_results.tar.gz back, unpack it and run"
echo "    python3 bench/model_check.py unseen"
echo "    python3 bench/snapshot_check.py unseen/*.pickle.gz"
tail -n 8 "$OUT/logs/host_profile.log" 2>/dev/null
case " $PARTS " in *" 8 "*) "$PY" bench/gpu/routes_report.py "$OUT/results/routes" ;; esac
[ -f "$OUT/predict_vs_measured.json" ] &&
    "$PY" bench/gpu/predict_vs_measured.py --table "$OUT/predict_vs_measured.json"
tar -C "$OUT" -czf "$OUT/gpu_results.tar.gz" logs results unseen &&
    rm -rf "$OUT/logs" "$OUT/results" "$OUT/unseen"
ls -la "$OUT"
