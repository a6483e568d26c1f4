"""Replays .rep traces through PyTorch's caching allocator and through Stowage,
in the same process, with the same Python loop, and prints ns/event for both.

PyTorch: torch.cuda.caching_allocator_alloc / caching_allocator_delete (the
native allocator; nothing else is allocated meanwhile). Stowage: the exported
stow_torch_malloc / stow_torch_free via ctypes on the CUDA backend (its own pool,
same device). The loop overhead is measured with a no-op allocator and
reported separately (subtract it to compare allocators alone). Each trace is
replayed twice per allocator; the second (warm) pass is reported.
"""

import argparse
import ctypes
import os
import time

import common

ap = argparse.ArgumentParser()
ap.add_argument("traces", nargs="+")
ap.add_argument("--out")
args = ap.parse_args()

import stowage  # noqa: E402  (not enabled: PyTorch keeps its own allocator here)
import torch  # noqa: E402

lib = stowage._lib.load()
torch.cuda.init()
stream = torch.cuda.current_stream().cuda_stream


def replay(nids, events, alloc, free):
    ptrs = [0] * nids
    t = time.perf_counter_ns()
    for kind, i, size, _s in events:
        if kind == 0:
            ptrs[i] = alloc(size)
        else:
            free(ptrs[i])
            ptrs[i] = 0
    dt = time.perf_counter_ns() - t
    for p in ptrs:
        if p:
            free(p)
    return dt / len(events)


def torch_alloc(size):
    return torch.cuda.caching_allocator_alloc(size, 0, stream)


def stow_alloc(size, _m=lib.stow_torch_malloc):
    p = _m(size, 0, stream)
    if not p:
        raise MemoryError(stowage.last_error())
    return p


def stow_free(p, _f=lib.stow_torch_free):
    _f(p, 0, 0, stream)


out = {}
for path in args.traces:
    if not os.path.exists(path):
        print("missing", path)
        continue
    nids, events = common.load_rep(path)
    name = os.path.basename(path)
    r = {"events": len(events)}
    r["loop_overhead_ns"] = min(replay(nids, events, lambda s: 1, lambda p: None) for _ in range(2))
    for label, a, f in (("torch", torch_alloc, torch.cuda.caching_allocator_delete),
                        ("stowage", stow_alloc, stow_free)):
        try:
            replay(nids, events, a, f)
            r[label + "_ns_per_event"] = replay(nids, events, a, f)
        except Exception as e:
            r[label + "_error"] = str(e)
    r.update(common.peaks_and_reset(torch, stowage))
    out[name] = r
    print(name, r, flush=True)
common.write_json(args.out, out)
