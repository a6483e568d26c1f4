"""A few training steps of one model under one allocator (one process per run).

    python3 bench/gpu/train.py --model gpt2|resnet50
        --mode native|expandable|stowage|stowage_classic|stowage_vmm|stowage_planned
               |stowage_vmm_planned

Prints and writes: loss per step, every step's time (step_ms) and their median after the
first --warmup steps, peak allocated and peak reserved (from torch.cuda for native modes, from
stowage for Stowage modes), and the device reserve and release calls (cudaMalloc, cudaFree:
num_device_alloc, num_device_free) made after the warm-up steps.
stowage is Stowage's default (policy auto: the page-mapped pool on a GPU whose driver maps
pages); stowage_classic the classic pool (policy:classic); stowage_vmm the page-mapped pool
(policy:vmm), with the layout it learns from the loop's step (docs/design.md). Stowage modes
also write the pool's map and unmap calls in the second half of the steps (a settled loop
makes none) and the learned step's plans and planned allocations.
stowage_planned (classic) and stowage_vmm_planned add planned_steps:true and call
stowage.torch.step("train") at the top of each step (docs/planned.md): they
write the planned hits, misses, plans, arena bytes and the backend calls of the
second half.
Random init, no network: GPT-2 small from a transformers config; ResNet-50 from
torchvision (or timm).
"""

import argparse
import os
import statistics
import sys
import time

import common

ap = argparse.ArgumentParser()
ap.add_argument("--model", choices=["gpt2", "resnet50"], required=True)
ap.add_argument("--mode", choices=["native", "expandable", "stowage", "stowage_classic",
                                   "stowage_vmm", "stowage_planned", "stowage_vmm_planned"],
                required=True)
ap.add_argument("--steps", type=int, default=6)
ap.add_argument("--warmup", type=int, default=None,
                help="first steps left out of the median and of the calls counted after them "
                     "(default 2, none with 3 steps or fewer)")
ap.add_argument("--out")
args = ap.parse_args()
if args.steps < 1:
    ap.error("--steps: at least 1")
if args.warmup is None:
    args.warmup = 2 if args.steps > 3 else 0
if not 0 <= args.warmup < args.steps:
    ap.error("--warmup: from 0 to --steps - 1")

result = {"model": args.model, "mode": args.mode}
if args.mode == "expandable":
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
if args.mode.startswith("stowage"):
    import ctypes
    import stowage
    import stowage.torch
    conf = {"stowage_classic": "policy:classic",
            "stowage_vmm": "policy:vmm",
            "stowage_planned": "policy:classic,planned_steps:true",
            "stowage_vmm_planned": "policy:vmm,planned_steps:true"}.get(args.mode)
    if conf:
        # A pool given a STOWAGE_CONF it refuses takes the defaults: check it here instead.
        stowage.validate_conf(conf)
        os.environ["STOWAGE_CONF"] = conf
    # Create the pool now (before torch initialises CUDA) to fail early, e.g. a policy
    # this library does not implement yet.
    why = ctypes.create_string_buffer(512)
    st = stowage._lib.load().stow_torch_pool_init(0, why, len(why))
    if st != 0:
        result["skipped"] = "pool creation failed: %s: %s" % (stowage._lib.strerror(st),
                                                             why.value.decode())
        common.write_json(args.out, result)
        sys.exit(0)
    stowage.torch.enable()

import torch  # noqa: E402

dev = torch.device("cuda", 0)
torch.manual_seed(0)
if args.model == "gpt2":
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config()).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch, seq = 8, 1024

    def step():
        ids = torch.randint(0, 50257, (batch, seq), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss
else:
    try:
        import torchvision
        model = torchvision.models.resnet50()
    except Exception:
        import timm
        model = timm.create_model("resnet50", pretrained=False)
    model = model.to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    lossf = torch.nn.CrossEntropyLoss()
    batch = 128

    def step():
        x = torch.randn(batch, 3, 224, 224, device=dev).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = lossf(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

def remaps(stats):
    return stats.get("num_map_calls", 0) + stats.get("num_unmap_calls", 0)


def all_stats():
    return stowage.memory_stats() if args.mode.startswith("stowage") else torch.cuda.memory_stats()


def device_calls(stats):
    """cudaMalloc + cudaFree so far (None where the allocator does not count them)."""
    if "num_device_alloc" not in stats or "num_device_free" not in stats:
        return None
    return stats["num_device_alloc"] + stats["num_device_free"]


losses, times = [], []
remaps_at_half = calls_at_half = None
calls_at_warmup = None
planned = args.mode.endswith("_planned")
for i in range(args.steps):
    if i == args.steps // 2 and args.mode.startswith("stowage"):
        remaps_at_half = remaps(stowage.memory_stats())
        calls_at_half = stowage.memory_stats().get("num_backend_calls", 0)
    if i == args.warmup:
        calls_at_warmup = device_calls(all_stats())
    torch.cuda.synchronize()
    t = time.perf_counter()
    if planned:
        stowage.torch.step("train")
    loss = step()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t)
    losses.append(float(loss.item()))
    print("step %d loss %.4f time %.1f ms" % (i, losses[-1], times[-1] * 1e3), flush=True)

if args.mode.startswith("stowage"):
    s = stowage.memory_stats()
    peak_alloc, peak_res = s["allocated_bytes.all.peak"], s["reserved_bytes.all.peak"]
    # Page-mapped pools: remaps, the synchronizes they still made and the
    # events they waited on instead (docs/design.md, remaps without a
    # synchronize).
    for key in ("num_alloc_retries", "num_device_alloc", "num_map_calls", "num_unmap_calls",
                "num_sync_all_streams", "num_event_records", "num_event_waits",
                "num_vmm_allowance_raises", "num_vmm_step_plans", "num_vmm_planned_allocations"):
        result[key] = s.get(key)
    result["map_unmap_calls_second_half"] = remaps(s) - remaps_at_half
    result["backend_calls_second_half"] = s.get("num_backend_calls", 0) - calls_at_half
    for key in ("num_planned_hits", "num_planned_misses", "num_planned_fallbacks", "num_plans",
                "arena_bytes"):
        result[key] = s.get(key)
else:
    peak_alloc, peak_res = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
calls_now = device_calls(all_stats())
result.update({
    "losses": losses,
    "warmup": args.warmup,
    "step_ms": [1e3 * t for t in times],
    "step_ms_median": 1e3 * statistics.median(times[args.warmup:]),
    "device_calls_after_warmup": (None if calls_now is None or calls_at_warmup is None
                                  else calls_now - calls_at_warmup),
    "first_step_ms": 1e3 * times[0],
    "peak_allocated_bytes": int(peak_alloc),
    "peak_reserved_bytes": int(peak_res),
})
common.write_json(args.out, result)
