"""The two routes by which Stowage serves PyTorch, checked on a GPU (docs/torch.md).

    python3 bench/gpu/torch_routes.py --route mempool --out DIR   # PyTorch's allocator,
                                                                  # Stowage behind MemPools
    python3 bench/gpu/torch_routes.py --route global --out DIR    # enable(): the global swap

One process per route (the global swap must come before CUDA starts). Each
check runs on its own, is recorded PASS, FAIL or what happened, and never stops
the others; figures go with it. Written to DIR/routes_ROUTE.json, with the
pickles and the pages torch.cuda._memory_viz made from Stowage's snapshots
(bench/gpu/routes_report.py prints the table).

mempool: a region under stowage.torch.mem_pool() (classic and vmm): its tensors
  lie in Stowage's segments, which are exactly PyTorch's segments of that pool,
  tensors outside it do not, PyTorch's statistics and pool.snapshot() work, and
  what empty_cache and the pool's end give back; a CUDA graph captured into it
  (torch.cuda.graph(g, pool=pool.id)) and replayed against eager results;
  torch.compile(mode="reduce-overhead") outside any pool and inside the
  region; Stowage's snapshot of the pool next to torch.cuda.memory._snapshot()
  (same keys) and drawn by torch.cuda._memory_viz; out of memory in a pool
  limited to 1% of the device, plain and under explain_oom.
global: a few training steps under enable("record_events:..."); Stowage's
  snapshot drawn by torch.cuda._memory_viz (and `python -m
  torch.cuda._memory_viz stats`); what torch.cuda.memory._snapshot(),
  torch.cuda.graph and torch.compile(mode="reduce-overhead") do; out of memory
  under explain_oom.
"""

import argparse
import contextlib
import gc
import os
import statistics
import subprocess
import sys
import time
import traceback

import common

ap = argparse.ArgumentParser()
ap.add_argument("--route", choices=("mempool", "global"), required=True)
ap.add_argument("--out", required=True, help="folder for routes_ROUTE.json and the viz files")
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)

import stowage  # noqa: E402
import stowage.snapshot  # noqa: E402
import stowage.torch  # noqa: E402

if args.route == "global":
    stowage.torch.enable("record_events:300000")
import torch  # noqa: E402

MiB = 1 << 20
results = {"route": args.route, "torch": torch.__version__, "checks": {}, "figures": {}}


def check(name):
    """Runs fn(); its returned dict goes to figures[name]; an exception is a FAIL."""
    def deco(fn):
        t = time.time()
        try:
            fig = fn() or {}
            results["checks"][name] = fig.pop("verdict", "PASS")
            results["figures"][name] = fig
        except Exception as e:  # report, go on
            results["checks"][name] = "FAIL: %s: %s" % (type(e).__name__, str(e)[:300])
            traceback.print_exc()
        results["figures"].setdefault(name, {})["seconds"] = round(time.time() - t, 2)
        print("%-34s %s" % (name, results["checks"][name]), flush=True)
        return fn
    return deco


def model_and_input(seed=0):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                            torch.nn.Linear(4096, 1024)).cuda()
    return m, torch.randn(256, 1024, device="cuda")


def ms_median(fn, n=20):
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return round(statistics.median(times), 4)


def stowage_ranges(snap):
    return [(s["address"], s["address"] + s["total_size"]) for s in snap["segments"]]


def inside(ptr, ranges):
    return any(a <= ptr < b for a, b in ranges)


def draw_with_memory_viz(snap, stem):
    """Runs torch.cuda._memory_viz on a snapshot; writes what it makes."""
    from torch.cuda import _memory_viz as viz
    out = {}
    text = viz.segsum(snap)
    with open(os.path.join(args.out, stem + ".segsum.txt"), "w") as f:
        f.write(text)
    out["segsum_lines"] = text.count("\n")
    text = viz.trace(snap)
    with open(os.path.join(args.out, stem + ".trace.txt"), "w") as f:
        f.write(text)
    out["trace_lines"] = text.count("\n")
    for kind, fn in (("trace_plot", viz.trace_plot), ("segment_plot", viz.segment_plot)):
        html = fn(snap)
        with open(os.path.join(args.out, "%s.%s.html" % (stem, kind)), "w") as f:
            f.write(html)
        out[kind + "_bytes"] = len(html)
    path = stowage.snapshot.dump_snapshot(os.path.join(args.out, stem + ".pickle"), snap)
    r = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "stats", path],
                       capture_output=True, text=True, timeout=120)
    out["viz_cli_stats_rc"] = r.returncode
    if r.returncode:
        out["viz_cli_stats_stderr"] = r.stderr[-300:]
    return out


def key_sets(snap):
    seg = set().union(*[set(s) for s in snap["segments"]]) if snap["segments"] else set()
    blk = set().union(*[set(b) for s in snap["segments"] for b in s["blocks"]]) \
        if snap["segments"] else set()
    ent = set().union(*[set(e) for t in snap["device_traces"] for e in t]) \
        if any(snap["device_traces"]) else set()
    return seg, blk, ent


# ---------------- the MemPool route ----------------

def region(conf):
    pool = stowage.torch.mem_pool(conf)
    outside = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    native_before = torch.cuda.memory_reserved()
    t = time.perf_counter()
    with torch.cuda.use_mem_pool(pool):
        ts = [torch.randn(n, device="cuda") for n in (256, 1 << 16, 1 << 20, 1 << 24, 3 << 24)]
        y = ts[3] * 2
    torch.cuda.synchronize()
    region_ms = (time.perf_counter() - t) * 1e3
    snap = stowage.torch.memory_snapshot(pool=pool)
    ranges = stowage_ranges(snap)
    assert all(inside(x.data_ptr(), ranges) for x in ts + [y]), "a tensor of the region is not in Stowage's memory"
    assert not inside(outside.data_ptr(), ranges), "a tensor outside the region is in Stowage's memory"
    assert torch.equal(y, ts[3] * 2)
    # PyTorch's segments of this pool are Stowage's allocations, one for one.
    theirs = sorted((s["address"], s["total_size"]) for s in pool.snapshot())
    ours = sorted((b["address"], b["requested_size"]) for s in snap["segments"]
                  for b in s["blocks"] if b["state"] == "active_allocated")
    assert theirs == ours, "PyTorch's pool segments %s, Stowage's allocations %s" % (theirs[:4], ours[:4])
    st = stowage.torch.mem_pool_stats(pool)
    ms = torch.cuda.memory_stats()
    fig = {"conf": conf or "", "segments": len(theirs), "region_ms": round(region_ms, 2),
           "torch_reserved_by_region": torch.cuda.memory_reserved() - native_before,
           "stowage_reserved": st["reserved_bytes.all.current"],
           "stowage_allocated": st["allocated_bytes.all.current"],
           "torch_memory_stats_ok": "reserved_bytes.all.current" in ms}
    del ts, y
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    fig["stowage_reserved_after_empty_cache"] = stowage.torch.mem_pool_stats(pool)[
        "reserved_bytes.all.current"]
    slot = stowage.torch.mem_pool_slot(pool)
    del pool
    gc.collect()
    torch.cuda.empty_cache()
    fig["slot_closed_after_pool_end"] = slot not in stowage.torch._mem_pool_plugs
    del outside
    return fig


if args.route == "mempool":
    torch.cuda.init()

    @check("region_classic")
    def _():
        return region(None)

    @check("region_vmm")
    def _():
        return region("policy:vmm")

    @check("graph_into_mem_pool")
    def _():
        pool = stowage.torch.mem_pool()
        m, x = model_and_input(1)
        inputs = [torch.randn_like(x) for _ in range(20)]
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                m(x)
        torch.cuda.current_stream().wait_stream(s)
        before = stowage.torch.mem_pool_stats(pool)["allocation.all.allocated"]
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool.id):
            out = m(x)
        g2 = torch.cuda.CUDAGraph()  # a second graph sharing the pool, another shape
        x2 = torch.randn(64, 1024, device="cuda")
        with torch.cuda.graph(g2, pool=pool.id):
            out2 = m(x2)
        segs = stowage.torch.mem_pool_stats(pool)["allocation.all.allocated"] - before
        ranges = stowage_ranges(stowage.torch.memory_snapshot(pool=pool))
        assert inside(out.data_ptr(), ranges) and inside(out2.data_ptr(), ranges), \
            "the graphs' outputs are not in Stowage's memory"
        worst = 0.0
        for xi in inputs:
            x.copy_(xi)
            g.replay()
            g2.replay()
            with torch.no_grad():
                ref = m(xi)
            worst = max(worst, float((out - ref).abs().max()))
        assert worst < 1e-3, worst
        fig = {"stowage_segments_for_graphs": segs, "max_abs_diff": worst,
               "replay_ms": ms_median(g.replay), "eager_ms": ms_median(lambda: m(x))}
        del g, g2, out, out2
        return fig

    def compile_run(inside_pool):
        torch._dynamo.reset()
        m, x = model_and_input(2)
        f = torch.compile(m, mode="reduce-overhead")
        pool = stowage.torch.mem_pool() if inside_pool else None
        before = stowage.torch.mem_pool_stats(pool)["allocation.all.allocated"] if pool else 0
        ctx = torch.cuda.use_mem_pool(pool) if pool else contextlib.nullcontext()
        with ctx:
            t = time.perf_counter()
            y = f(x)
            torch.cuda.synchronize()
            first_s = time.perf_counter() - t
            for _ in range(5):
                y = f(x)
            steady = ms_median(lambda: f(x))
        with torch.no_grad():
            diff = float((y - m(x)).abs().max())
        assert diff < 1e-2, diff
        fig = {"first_call_s": round(first_s, 2), "steady_ms": steady, "max_abs_diff": diff}
        if pool:
            fig["stowage_segments_during"] = stowage.torch.mem_pool_stats(pool)[
                "allocation.all.allocated"] - before
        return fig

    @check("compile_reduce_overhead_native")
    def _():
        return compile_run(False)

    @check("compile_reduce_overhead_in_mem_pool")
    def _():
        return compile_run(True)

    @check("snapshot_memory_viz_mem_pool")
    def _():
        torch.cuda.memory._record_memory_history(max_entries=100000)
        pool = stowage.torch.mem_pool("record_events:100000")
        with torch.cuda.use_mem_pool(pool):
            ts = [torch.randn(n, device="cuda") for n in (1 << 10, 1 << 20, 1 << 24)]
            del ts[1]
        theirs = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        ours = stowage.torch.memory_snapshot(pool=pool)
        t_seg, t_blk, t_ent = key_sets(theirs)
        o_seg, o_blk, o_ent = key_sets(ours)
        fig = {"segment_keys_missing": sorted(t_seg - o_seg), "block_keys_missing": sorted(t_blk - o_blk),
               "entry_keys_missing": sorted(t_ent - o_ent - {"compile_context", "user_metadata"}),
               "extra_keys": sorted((o_seg - t_seg) | (o_blk - t_blk) | (o_ent - t_ent))}
        fig.update(draw_with_memory_viz(ours, "stowage_mem_pool"))
        assert not (fig["segment_keys_missing"] or fig["block_keys_missing"] or
                    fig["entry_keys_missing"] or fig["extra_keys"]), fig
        assert fig["viz_cli_stats_rc"] == 0, fig
        del ts
        return fig

    @check("oom_in_mem_pool")
    def _():
        pool = stowage.torch.mem_pool("per_process_memory_fraction:0.01")
        total = torch.cuda.get_device_properties(0).total_memory
        fig = {}
        try:
            with torch.cuda.use_mem_pool(pool):
                torch.empty(int(total * 0.05), dtype=torch.uint8, device="cuda")
            fig["plain"] = "no error"
        except torch.OutOfMemoryError as e:
            fig["plain"] = "torch.OutOfMemoryError"
            fig["plain_message_head"] = str(e)[:160]
        try:
            with stowage.torch.explain_oom(pool=pool):
                with torch.cuda.use_mem_pool(pool):
                    torch.empty(int(total * 0.05), dtype=torch.uint8, device="cuda")
            fig["explained"] = "no error"
        except torch.OutOfMemoryError as e:
            fig["explained"] = "torch.OutOfMemoryError"
            fig["explained_has_stowage_report"] = "Stowage" in str(e) and "out of memory" in str(e)
        ok = fig["plain"] == fig["explained"] == "torch.OutOfMemoryError" and \
            fig.get("explained_has_stowage_report")
        fig["verdict"] = "PASS" if ok else "FAIL: %s" % fig
        return fig


# ---------------- the global swap ----------------

if args.route == "global":
    @check("train_steps")
    def _():
        m, x = model_and_input(3)
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        losses = []
        for _ in range(10):
            opt.zero_grad()
            loss = m(x).pow(2).mean()
            loss.backward()
            opt.step()
            losses.append(float(loss))
        assert losses[-1] < losses[0], losses
        return {"first_loss": losses[0], "last_loss": losses[-1],
                "stowage_peak_reserved": stowage.max_memory_reserved()}

    @check("snapshot_memory_viz_global")
    def _():
        snap = stowage.torch.memory_snapshot()
        fig = {"segments": len(snap["segments"]), "entries": len(snap["device_traces"][0])}
        fig.update(draw_with_memory_viz(snap, "stowage_global"))
        try:
            torch.cuda.memory._snapshot()
            fig["torch_snapshot"] = "works"
        except Exception as e:
            fig["torch_snapshot"] = "%s: %s" % (type(e).__name__, str(e)[:120])
        assert fig["viz_cli_stats_rc"] == 0, fig
        return fig

    @check("cuda_graph_global")
    def _():
        m, x = model_and_input(4)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                m(x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = m(x)
        g.replay()
        with torch.no_grad():
            diff = float((out - m(x)).abs().max())
        return {"max_abs_diff": diff, "verdict": "captured and replayed (max diff %.2g)" % diff}

    @check("compile_reduce_overhead_global")
    def _():
        m, x = model_and_input(5)
        f = torch.compile(m, mode="reduce-overhead")
        t = time.perf_counter()
        for _ in range(6):
            y = f(x)
        torch.cuda.synchronize()
        with torch.no_grad():
            diff = float((y - m(x)).abs().max())
        return {"six_calls_s": round(time.perf_counter() - t, 2), "max_abs_diff": diff,
                "verdict": "ran (max diff %.2g)" % diff}

    @check("oom_global_explained")
    def _():
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(0.25, 0)
        fig = {}
        try:
            with stowage.torch.explain_oom():
                x = torch.empty(int(total * 0.5), dtype=torch.uint8, device="cuda")
                fig["data_ptr_is_null"] = x.data_ptr() == 0
                del x
            fig["outcome"] = "no error"
        except torch.OutOfMemoryError as e:
            fig["outcome"] = "torch.OutOfMemoryError"
            fig["has_stowage_report"] = "out of memory" in str(e) and "Stowage" in str(e)
        ok = fig["outcome"] == "torch.OutOfMemoryError" and fig.get("has_stowage_report")
        fig["verdict"] = "PASS" if ok else "FAIL: %s" % fig
        return fig

common.write_json(os.path.join(args.out, "routes_%s.json" % args.route), results)
raise SystemExit(0 if all(v.startswith(("PASS", "captured", "ran")) for v in
                          results["checks"].values()) else 1)
