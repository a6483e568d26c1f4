"""ResNet-50 inference calls under one allocator (one process per run; docs/planned.md).

    python3 bench/gpu/infer_planned.py --mode native|stowage_planned|stowage_vmm_planned
        [--calls 40] [--batch 64] [--out FILE]

Each call runs the model (eval, bf16 autocast, no grad) on the same seeded inputs; the
Stowage modes set planned_steps:true and wrap each call in
`with stowage.torch.planned("resnet50-bs64")`. Writes: the median call time (from the
third call), the sum and a hash of the outputs (equal across modes when the memory
served is right), peak reserved, and for Stowage the planned hits and the allocations
the pool served from the second call on (0: every call from the arena).
"""
import argparse
import hashlib
import os
import statistics
import sys
import time

import common

ap = argparse.ArgumentParser()
ap.add_argument("--mode", choices=["native", "stowage_planned", "stowage_vmm_planned"],
                required=True)
ap.add_argument("--calls", type=int, default=40)
ap.add_argument("--batch", type=int, default=64)
ap.add_argument("--out")
args = ap.parse_args()
result = {"model": "resnet50", "mode": args.mode, "batch": args.batch}
stowage_mode = args.mode != "native"
if stowage_mode:
    import stowage
    import stowage.torch
    os.environ["STOWAGE_CONF"] = {"stowage_planned": "policy:classic,planned_steps:true",
                                  "stowage_vmm_planned": "policy:vmm,planned_steps:true"}[args.mode]
    stowage.torch.enable()

import torch  # noqa: E402

try:
    import torchvision
    model = torchvision.models.resnet50()
except Exception:
    import timm
    model = timm.create_model("resnet50", pretrained=False)
dev = torch.device("cuda", 0)
torch.manual_seed(0)
model = model.to(dev).eval().to(memory_format=torch.channels_last)
gen = torch.Generator(device=dev).manual_seed(1)
x = torch.randn(args.batch, 3, 224, 224, device=dev, generator=gen)
x = x.to(memory_format=torch.channels_last)

times, digest, total = [], hashlib.sha256(), 0.0
pool_after_first = None
for i in range(args.calls):
    if i == 1 and stowage_mode:
        s = stowage.memory_stats()
        pool_after_first = s["allocation.all.allocated"] - s.get("num_planned_hits", 0)
    torch.cuda.synchronize()
    t = time.perf_counter()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        if stowage_mode:
            with stowage.torch.planned("resnet50-bs%d" % args.batch):
                out = model(x)
        else:
            out = model(x)
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t)
    host = out.float().cpu()
    total += float(host.sum())
    digest.update(host.numpy().tobytes())

result.update({
    "call_ms_median": 1e3 * statistics.median(times[2:] if len(times) > 3 else times),
    "outputs_sum": total,
    "outputs_sha256": digest.hexdigest(),
})
if stowage_mode:
    s = stowage.memory_stats()
    result["peak_reserved_bytes"] = s["reserved_bytes.all.peak"]
    result["planned_hits"] = s.get("num_planned_hits")
    result["plans"] = s.get("num_plans")
    result["arena_bytes"] = s.get("arena_bytes")
    result["pool_allocations_after_first_call"] = (
        s["allocation.all.allocated"] - s.get("num_planned_hits", 0) - pool_after_first)
else:
    result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
common.write_json(args.out, result)
sys.exit(0)
