"""Host time per event of PyTorch's caching allocator and of Stowage, each called
from C++ in the same loop, in the same process (bench/gpu/run.sh, part 4).

replay_torch.py calls both allocators from Python, so about 1.5 us of each event
there is the call from Python. Here a C++ extension (built on the machine with
torch.utils.cpp_extension.load_inline) replays the trace's events in a loop of
its own: PyTorch's allocator through
c10::cuda::CUDACachingAllocator::raw_alloc_with_stream / raw_delete, Stowage
through the exported stow_torch_malloc / stow_torch_free (the entry points
PyTorch's CUDAPluggableAllocator calls, its per-device pool configured by
STOWAGE_CONF), and a no-op allocator for the loop's own cost. Each allocator
replays the trace PASSES times, in rounds that alternate the allocators; the
first pass of each fills its cache and is reported apart, as the cold pass
(each trace starts from emptied caches: the pass that maps or allocates what
the trace needs); the median of the rest is reported, and the ratio Stowage /
PyTorch of the medians (the loop's own cost subtracted from both). The
allocators' settings come from the environment (PYTORCH_CUDA_ALLOC_CONF,
STOWAGE_CONF) and are written with the results; run.sh runs it once with the
defaults and once with expandable_segments:True against policy:vmm.

    python3 bench/gpu/replay_native.py --out OUT.json TRACE.rep...
"""

import argparse
import ctypes
import os
import statistics
import tempfile

import common

ap = argparse.ArgumentParser()
ap.add_argument("traces", nargs="+")
ap.add_argument("--out")
ap.add_argument("--rounds", type=int, default=4)
ap.add_argument("--passes", type=int, default=4, help="passes per allocator and round")
args = ap.parse_args()

import stowage  # noqa: E402  (not enabled: PyTorch keeps its own allocator)
import torch  # noqa: E402
from torch.utils.cpp_extension import load_inline  # noqa: E402

SOURCE = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <chrono>
#include <stdexcept>
#include <vector>

typedef void *(*stow_malloc_fn)(ssize_t, int, cudaStream_t);
typedef void (*stow_free_fn)(void *, ssize_t, int, cudaStream_t);

static double now_ns() {
    return std::chrono::duration<double, std::nano>(
               std::chrono::steady_clock::now().time_since_epoch()).count();
}

// which: 0 a no-op allocator (the loop's own cost), 1 PyTorch's caching
// allocator, 2 Stowage through the function addresses given.
std::vector<double> replay(torch::Tensor kinds, torch::Tensor ids, torch::Tensor sizes,
                           int64_t nids, int64_t which, int64_t malloc_addr, int64_t free_addr,
                           int64_t passes) {
    const int64_t n = kinds.numel();
    const int64_t *k = kinds.data_ptr<int64_t>();
    const int64_t *id = ids.data_ptr<int64_t>();
    const int64_t *sz = sizes.data_ptr<int64_t>();
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    stow_malloc_fn sm = reinterpret_cast<stow_malloc_fn>(malloc_addr);
    stow_free_fn sf = reinterpret_cast<stow_free_fn>(free_addr);
    std::vector<void *> ptrs(nids, nullptr);
    std::vector<int64_t> held(nids, 0);
    std::vector<double> out;
    for (int64_t p = 0; p < passes; p++) {
        double t0 = now_ns();
        for (int64_t i = 0; i < n; i++) {
            const int64_t j = id[i];
            if (k[i] == 0) {
                void *q;
                if (which == 1)
                    q = c10::cuda::CUDACachingAllocator::raw_alloc_with_stream((size_t)sz[i], stream);
                else if (which == 2)
                    q = sm((ssize_t)sz[i], 0, stream);
                else
                    q = reinterpret_cast<void *>((j + 1) * 512);
                if (!q)
                    throw std::runtime_error("allocation failed");
                ptrs[j] = q;
                held[j] = sz[i];
            } else if (ptrs[j]) {
                if (which == 1)
                    c10::cuda::CUDACachingAllocator::raw_delete(ptrs[j]);
                else if (which == 2)
                    sf(ptrs[j], (ssize_t)held[j], 0, stream);
                ptrs[j] = nullptr;
            }
        }
        out.push_back((now_ns() - t0) / (double)n);
        for (int64_t j = 0; j < nids; j++) {
            if (!ptrs[j])
                continue;
            if (which == 1)
                c10::cuda::CUDACachingAllocator::raw_delete(ptrs[j]);
            else if (which == 2)
                sf(ptrs[j], (ssize_t)held[j], 0, stream);
            ptrs[j] = nullptr;
        }
    }
    return out;
}
"""

build_dir = tempfile.mkdtemp(prefix="stow_replay_native_")
ext = load_inline(name="stow_replay_native", cpp_sources=[SOURCE], functions=["replay"],
                  with_cuda=True, extra_cflags=["-O2"], build_directory=build_dir,
                  verbose=False)

lib = stowage._lib.load()
torch.cuda.init()
malloc_addr = ctypes.cast(lib.stow_torch_malloc, ctypes.c_void_p).value
free_addr = ctypes.cast(lib.stow_torch_free, ctypes.c_void_p).value


def tensors(path):
    nids, events = common.load_rep(path)
    kinds = torch.tensor([e[0] for e in events], dtype=torch.int64)
    ids = torch.tensor([e[1] for e in events], dtype=torch.int64)
    sizes = torch.tensor([e[2] for e in events], dtype=torch.int64)
    return nids, kinds, ids, sizes


out = {}
labels = {0: "loop", 1: "torch", 2: "stowage"}
for path in args.traces:
    if not os.path.exists(path):
        print("missing", path)
        continue
    nids, kinds, ids, sizes = tensors(path)
    passes = {w: [] for w in labels}
    cold = {}
    for w in labels:  # one pass each fills the caches: the cold pass, apart
        cold[w] = ext.replay(kinds, ids, sizes, nids, w, malloc_addr, free_addr, 1)[0]
    for _ in range(args.rounds):
        for w in labels:
            passes[w] += ext.replay(kinds, ids, sizes, nids, w, malloc_addr, free_addr,
                                    args.passes)
    r = {"events": int(kinds.numel()),
         "pytorch_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
         "stowage_conf": os.environ.get("STOWAGE_CONF", "")}
    for w, label in labels.items():
        r[label + "_cold_ns_per_event"] = cold[w]
        r[label + "_ns_per_event"] = statistics.median(passes[w])
        r[label + "_ns_min"] = min(passes[w])
        r[label + "_ns_max"] = max(passes[w])
    loop = r["loop_ns_per_event"]
    r["stowage_over_torch"] = (r["stowage_ns_per_event"] - loop) / (r["torch_ns_per_event"] - loop)
    r.update(common.peaks_and_reset(torch, stowage))
    name = os.path.basename(path)
    out[name] = r
    print("%-26s torch %7.1f ns/event  stowage %7.1f  loop %5.1f  stowage/torch %.3f  "
          "cold: torch %.2f us/event, stowage %.2f" % (
              name, r["torch_ns_per_event"], r["stowage_ns_per_event"], loop,
              r["stowage_over_torch"], r["torch_cold_ns_per_event"] / 1e3,
              r["stowage_cold_ns_per_event"] / 1e3), flush=True)
common.write_json(args.out, out)
