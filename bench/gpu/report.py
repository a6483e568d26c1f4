"""Prints the short table of bench/gpu/run.sh from results/*.json."""

import glob
import json
import os
import sys

d = sys.argv[1] if len(sys.argv) > 1 else "out-gpu/results"


def load(name):
    p = os.path.join(d, name)
    try:
        with open(p) as f:
            return json.load(f)
    except Exception:
        return None


MiB = 1 << 20
for name, label in (("gputests.json", "classic"), ("gputests_vmm.json", "vmm")):
    g = load(name)
    if g:
        print("\n== GPU checks (PyTorch on Stowage, %s pools)" % label)
        for k, v in sorted(g["checks"].items()):
            print("  %-30s %s" % (k, v))

print("\n== training (median step ms, peak allocated / reserved MiB, last loss)")
print("  %-10s %-20s %10s %12s %12s %9s" % ("model", "allocator", "step ms", "peak alloc", "peak resv", "loss"))
for p in sorted(glob.glob(os.path.join(d, "train_*.json"))):
    r = json.load(open(p))
    stem = os.path.basename(p)[:-len(".json")]
    if "_r" in stem and stem.rsplit("_r", 1)[1].isdigit():  # TRAIN_ROUNDS: the round
        r["mode"] += " r" + stem.rsplit("_r", 1)[1]
    if "skipped" in r:
        print("  %-10s %-20s %s" % (r["model"], r["mode"], "skipped: " + r["skipped"][:70]))
        continue
    print("  %-10s %-20s %10.1f %12.0f %12.0f %9.4f" % (
        r["model"], r["mode"], r["step_ms_median"], r["peak_allocated_bytes"] / MiB,
        r["peak_reserved_bytes"] / MiB, r["losses"][-1]))
    if r.get("num_unmap_calls"):
        # Remaps, how many of them still waited for the whole device, and the
        # events waited on instead.
        print("  %-32s maps %s, unmaps %s, synchronizes %s, events %s, waited on %s" % (
            "", r.get("num_map_calls"), r.get("num_unmap_calls"),
            r.get("num_sync_all_streams"), r.get("num_event_records"),
            r.get("num_event_waits")))
    if "map_unmap_calls_second_half" in r:
        # Whether the loop settled (no remap in the second half of the steps) and what the
        # learned step did (vmm_learn_step).
        print("  %-32s second half: %s map+unmap; allowance raises %s, step plans %s, "
              "planned allocations %s" % (
                  "", r.get("map_unmap_calls_second_half"), r.get("num_vmm_allowance_raises"),
                  r.get("num_vmm_step_plans"), r.get("num_vmm_planned_allocations")))

rt = load("replay_torch.json")
rc = load("replay_cuda.json")
if rt or rc:
    print("\n== trace replay, ns/event (warm)")
    print("  %-26s %12s %12s %12s %14s" % ("trace", "torch(py)", "stowage(py)", "py loop", "stowage(C)"))
    for name in sorted(set((rt or {}).keys()) | set((rc or {}).keys())):
        a = (rt or {}).get(name, {})
        c = (rc or {}).get(name, {})
        f = lambda v: ("%12.0f" % v) if isinstance(v, (int, float)) else "%12s" % "-"
        print("  %-26s %s %s %s %14s" % (name, f(a.get("torch_ns_per_event")),
                                          f(a.get("stowage_ns_per_event")),
                                          f(a.get("loop_overhead_ns")),
                                          f(c.get("warm_ns_per_event")).strip()))

rw = load("remap_wait.json")
if rw:
    # A remap with another stream's queue behind it: waiting on the freeing
    # stream's events against synchronizing the device (docs/design.md).
    print("\n== remap wait (%d rounds, %d MiB blocks, other stream's queue %.2f ms)" % (
        rw["rounds"], rw["block_mib"], rw["s2_queue_ms"]))
    print("  remapping alloc, median: event waits %.3f ms, synchronize %.3f ms (x%.1f)" % (
        rw["event_waits_alloc_ms"], rw["sync_alloc_ms"],
        rw["sync_alloc_ms"] / rw["event_waits_alloc_ms"] if rw["event_waits_alloc_ms"] else 0))

for name, label in (("replay_cuda_vmm.json", "vmm"),
                    ("replay_cuda_vmm_nolearn.json", "vmm, vmm_learn_step:false")):
    r = load(name)
    if r:
        print("\n== page-mapped pool on the driver (%s): peak reserved / peak live, "
              "map+unmap calls per pass" % label)
        print("  %-26s %10s %10s %10s %10s %8s %6s" % (
            "trace", "warm ns/ev", "x classic", "resv/live", "cold calls", "warm", "plans"))
        for trace, v in sorted(r.items()):
            classic = (rc or {}).get(trace, {}).get("warm_ns_per_event")
            ratio = "%10.2f" % (v["warm_ns_per_event"] / classic) if classic else "%10s" % "-"
            print("  %-26s %10.0f %s %10.4f %10d %8d %6d" % (
                trace, v["warm_ns_per_event"], ratio,
                v["peak_reserved_bytes"] / v["peak_live_bytes"],
                v["cold_map_unmap_calls"], v["warm_map_unmap_calls"], v["step_plans"]))

rn = load("replay_native.json")
if rn:
    print("\n== host ns/event from C++ (median; the loop's own cost in 'loop')")
    print("  %-26s %10s %10s %8s %14s" % ("trace", "torch", "stowage", "loop", "stowage/torch"))
    for trace, v in sorted(rn.items()):
        print("  %-26s %10.1f %10.1f %8.1f %14.3f" % (
            trace, v["torch_ns_per_event"], v["stowage_ns_per_event"], v["loop_ns_per_event"],
            v["stowage_over_torch"]))

# Last, the page-mapped pool's cold pass against PyTorch's expandable segments on the same
# traces: the pass that maps what the trace needs, the driver's calls included
# (replay_native.py under STOWAGE_CONF=policy:vmm and PYTORCH_CUDA_ALLOC_CONF=
# expandable_segments:True, both from C++ in one process), and the C pool's own cold pass
# on the driver (replay_cuda, --conf policy:vmm) with its map and unmap calls.
rv = load("replay_native_vmm.json")
rcv = load("replay_cuda_vmm.json")
if rv or rcv:
    print("\n== cold pass, us/event: vmm against PyTorch expandable_segments:True")
    print("  %-26s %12s %12s %8s %14s %10s" % ("trace", "expandable", "vmm", "x", "vmm (C pool)",
                                               "map+unmap"))
    for trace in sorted(set((rv or {}).keys()) | set((rcv or {}).keys())):
        a = (rv or {}).get(trace, {})
        c = (rcv or {}).get(trace, {})
        t = a.get("torch_cold_ns_per_event")
        v = a.get("stowage_cold_ns_per_event")
        cc = c.get("cold_ns_per_event")
        f = lambda x: ("%.2f" % (x / 1e3)) if isinstance(x, (int, float)) else "-"
        ratio = ("%.2f" % (v / t)) if isinstance(t, (int, float)) and t and \
            isinstance(v, (int, float)) else "-"
        print("  %-26s %12s %12s %8s %14s %10s" % (trace, f(t), f(v), ratio, f(cc),
                                                   c.get("cold_map_unmap_calls", "-")))
