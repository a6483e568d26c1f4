"""The C++ adapter (python/csrc/torch_allocator.cpp) on a GPU: PyTorch's features under
Stowage, each against PyTorch's own allocator (docs/torch.md, "The adapter").

    python3 bench/gpu/torch_adapter.py --out DIR [--checks a,b] [--test-cuda PATH]

bench/gpu/torch_adapter.sh builds what this needs and runs it in one device call.
Each check runs twice, in processes of its own: under PyTorch's allocator
(native) and under stowage.torch.enable(adapter=True) (stowage); a check that
fails or times out is recorded with its reason and never stops the others.
Results: DIR/torch_adapter.json; the table is printed last.

checks:
  stats      torch.cuda / torch.accelerator memory statistics around one tensor,
             reset_peak_memory_stats, memory_summary, empty_cache
  streams    a tensor used on a second stream (record_stream), freed, the memory
             taken again at once on the first: the second stream's result intact
  oom        set_per_process_memory_fraction(0.1), then too large a tensor:
             torch.OutOfMemoryError, num_ooms 1, and the process goes on
  graphs     a CUDA graph captured (its private pool) and replayed against eager
             results, a second graph sharing the pool, both deleted
  mempool    torch.cuda.MemPool and use_mem_pool: pool.snapshot(), use_count, its
             memory back after the pool is gone
  history    torch.cuda.memory._record_memory_history with stacks, _snapshot,
             torch.cuda._memory_viz.trace_plot and segment_plot
  resnet50   torchvision ResNet-50, cudnn.benchmark = True, 10 SGD steps on fixed
             random data: losses, max_memory_reserved
  trainer    an unchanged Hugging Face Trainer (a 2-layer GPT-2 from its config,
             20 steps, skip_memory_metrics=False): losses, max_memory_reserved
  compile    torch.compile(mode="reduce-overhead") of an MLP: 10 training steps,
             then a second batch size (a new path of the CUDA-graph tree)
  hostcost   ns per allocation + free through c10's allocator from C++ (an
             extension built here), sizes of a training step's mix
  test_cuda  PyTorch's test/test_cuda.py of this torch's release (--test-cuda;
             the wheel does not ship it): its allocator tests, each test's result
             and the reason of each failure (stowage only; native for reference)
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
CHECKS = ("stats", "streams", "oom", "graphs", "mempool", "history", "resnet50", "trainer",
          "compile", "hostcost", "test_cuda")
TIMEOUT_S = {"resnet50": 120, "trainer": 150, "compile": 200, "hostcost": 150, "test_cuda": 300}
# test_cuda.py's tests of the allocator's public behaviour (unittest -k patterns).
TEST_CUDA_PATTERNS = ("memory", "oom", "empty_cache", "record_stream", "graph", "mempool",
                      "MemPool", "caching_allocator", "fraction", "snapshot", "allocator")
MiB = 1 << 20


# ---- the checks, each run in a process of its own (child) ----

def setup(mode):
    sys.path.insert(0, os.path.join(ROOT, "python"))
    if mode == "stowage":
        import stowage.torch
        stowage.torch.enable(adapter=True)
    import torch
    return torch


def check_stats(torch):
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    before = torch.cuda.memory_allocated()
    active = torch.accelerator.memory_stats()["active_bytes.all.current"]
    t = torch.randn(256, device="cuda")
    grew = torch.cuda.memory_allocated() - before
    acc = torch.accelerator.memory_stats()
    assert acc["active_bytes.all.current"] == active + 1024, acc["active_bytes.all.current"]
    assert acc["active_bytes.all.freed"] == 0
    del t
    torch.accelerator.empty_cache()
    acc = torch.accelerator.memory_stats()
    assert acc["active_bytes.all.freed"] == 1024, acc["active_bytes.all.freed"]
    big = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    peak = torch.cuda.max_memory_allocated()
    del big
    torch.cuda.reset_peak_memory_stats()
    after = torch.cuda.max_memory_allocated()
    summary = torch.cuda.memory_summary()
    reserved = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    return {"grew": grew, "peak_64mib": peak, "peak_after_reset": after,
            "reserved_before_empty": reserved,
            "reserved_after_empty": torch.cuda.memory_reserved(),
            "summary_lines": len(summary.splitlines()),
            "num_ooms": torch.cuda.memory_stats()["num_ooms"]}


def check_streams(torch):
    s1, s2 = torch.cuda.current_stream(), torch.cuda.Stream()
    n = 16 * MiB
    ok = True
    for _ in range(20):
        x = torch.ones(n, device="cuda")
        s2.wait_stream(s1)
        with torch.cuda.stream(s2):
            torch.cuda._sleep(2_000_000)  # keep s2 busy while s1 goes on
            y = x * 2
        x.record_stream(s2)
        del x
        z = torch.zeros(n, device="cuda")  # must not take x's memory while s2 reads it
        z.fill_(7)
        torch.cuda.synchronize()
        ok &= bool((y == 2).all())
    return {"second_stream_intact": ok}


def check_oom(torch):
    torch.cuda.set_per_process_memory_fraction(0.1)
    total = torch.cuda.get_device_properties(0).total_memory
    err = None
    try:
        torch.empty(int(total * 0.2), dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as e:
        err = str(e)
    assert err is not None, "no torch.OutOfMemoryError"
    x = torch.ones(1024, device="cuda")
    x.add_(1)
    torch.cuda.synchronize()
    return {"raised": err.splitlines()[0][:200], "goes_on": bool((x == 2).all()),
            "num_ooms": torch.cuda.memory_stats()["num_ooms"],
            "fraction": torch.cuda.get_per_process_memory_fraction()}


def check_graphs(torch):
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 512)).cuda()
    static_in = torch.randn(64, 512, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            model(static_in)
    torch.cuda.current_stream().wait_stream(s)
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1):
        out1 = model(static_in)
    with torch.cuda.graph(g2, pool=g1.pool()):
        out2 = model(out1)
    errs = []
    for _ in range(5):
        static_in.copy_(torch.randn(64, 512, device="cuda"))
        g1.replay()
        g2.replay()
        with torch.no_grad():
            e1 = model(static_in)
            e2 = model(e1)
        errs.append(float((out2 - e2).abs().max()))
    reserved = torch.cuda.memory_reserved()
    del g1, g2, out1, out2
    torch.cuda.empty_cache()
    return {"max_abs_err": max(errs), "reserved_with_graphs": reserved,
            "reserved_after": torch.cuda.memory_reserved()}


def check_mempool(torch):
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        x = torch.randn(8 * MiB, device="cuda")
    y = torch.randn(MiB, device="cuda")
    segs = pool.snapshot()
    inside = any(s["address"] <= x.data_ptr() < s["address"] + s["total_size"] for s in segs)
    outside = any(s["address"] <= y.data_ptr() < s["address"] + s["total_size"] for s in segs)
    uses = pool.use_count()
    reserved = torch.cuda.memory_reserved()
    del x, pool
    torch.cuda.empty_cache()
    return {"in_pool": inside, "other_tensor_outside": not outside, "use_count": uses,
            "reserved_with_pool": reserved, "reserved_after": torch.cuda.memory_reserved()}


def check_history(torch):
    torch.cuda.memory._record_memory_history(max_entries=100000)
    keep = [torch.randn(n, device="cuda") for n in (1000, 300000, 5 * MiB)]
    for n in (2000, 4 * MiB):
        del_me = torch.randn(n, device="cuda")
        del del_me
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    from torch.cuda import _memory_viz
    trace = snap["device_traces"][0]
    frames = sum(1 for e in trace if e.get("frames"))
    html = _memory_viz.trace_plot(snap) + _memory_viz.segment_plot(snap)
    del keep
    return {"entries": len(trace), "with_frames": frames,
            "actions": sorted({e["action"] for e in trace}), "segments": len(snap["segments"]),
            "html_bytes": len(html)}


def check_resnet50(torch):
    import torchvision
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    model = torchvision.models.resnet50().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(32, 3, 224, 224, device="cuda", generator=g)
    y = torch.randint(0, 1000, (32,), device="cuda", generator=g)
    losses = []
    t0 = time.time()
    for _ in range(10):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return {"losses": losses, "max_reserved": torch.cuda.max_memory_reserved(),
            "max_allocated": torch.cuda.max_memory_allocated(), "seconds": time.time() - t0}


def check_trainer(torch):
    import tempfile
    import transformers
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=256, vocab_size=1000,
                                  n_positions=128)
    model = transformers.GPT2LMHeadModel(cfg)
    g = torch.Generator().manual_seed(2)
    data = [{"input_ids": ids, "labels": ids}
            for ids in torch.randint(0, 1000, (160, 128), generator=g)]
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out, max_steps=20, per_device_train_batch_size=8, logging_steps=1,
            report_to=[], save_strategy="no", skip_memory_metrics=False, seed=0,
            data_seed=0, dataloader_num_workers=0)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
        result = trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"losses": losses, "train_loss": result.training_loss,
            "max_reserved": torch.cuda.max_memory_reserved(),
            "memory_metrics": sorted(k for k in result.metrics if "mem" in k)}


def check_compile(torch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                                torch.nn.Linear(512, 256)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = torch.compile(lambda x: model(x).square().mean(), mode="reduce-overhead")
    g = torch.Generator(device="cuda").manual_seed(3)
    losses = []
    for bs in (64,) * 10 + (32,) * 5:
        x = torch.randn(bs, 256, device="cuda", generator=g)
        loss = step(x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
    return {"losses": losses, "max_reserved": torch.cuda.max_memory_reserved()}


HOSTCOST_SRC = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <chrono>
#include <vector>
double alloc_free_ns(int64_t rounds) {
    auto* a = c10::cuda::CUDACachingAllocator::get();
    const size_t sizes[] = {512, 4096, 65536, 1 << 20, 3 << 20, 12 << 20, 256, 2048};
    std::vector<void*> live(64, nullptr);
    auto t0 = std::chrono::steady_clock::now();
    int64_t n = 0;
    for (int64_t r = 0; r < rounds; r++) {
        for (size_t i = 0; i < live.size(); i++) { live[i] = a->raw_alloc(sizes[(i + r) % 8]); n++; }
        for (size_t i = 0; i < live.size(); i++) a->raw_delete(live[i]);
    }
    auto t1 = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::nano>(t1 - t0).count() / double(n);
}
"""


def check_hostcost(torch):
    from torch.utils.cpp_extension import load_inline
    ext = load_inline("stowage_hostcost", cpp_sources=HOSTCOST_SRC, functions=["alloc_free_ns"],
                      with_cuda=True, extra_cflags=["-O2"], verbose=False)
    torch.empty(1, device="cuda")
    ext.alloc_free_ns(200)  # warm: segments reserved, pools made
    runs = sorted(ext.alloc_free_ns(2000) for _ in range(5))
    return {"ns_per_alloc_free": runs[2], "runs": runs}


def child(mode, name):
    torch = setup(mode)
    fn = globals()["check_" + name]
    t0 = time.time()
    try:
        figures = fn(torch)
        result = {"status": "PASS", "figures": figures}
    except Exception as e:  # recorded, never fatal
        result = {"status": "FAIL", "error": "%s: %s" % (type(e).__name__, str(e)[:2000]),
                  "traceback": traceback.format_exc()[-4000:]}
    result["seconds"] = round(time.time() - t0, 2)
    print("RESULT " + json.dumps(result))


# ---- PyTorch's test_cuda.py under each allocator ----

BOOT = r"""
import runpy, sys
sys.path.insert(0, %(py)r)
if %(mode)r == "stowage":
    import stowage.torch
    stowage.torch.enable(adapter=True)
path = sys.argv[1]
sys.argv = [path] + sys.argv[2:]
runpy.run_path(path, run_name="__main__")
"""
LINE = re.compile(r"^(test\w+) \(([\w.]+)\)\s*\.\.\.\s*(ok|FAIL|ERROR|skipped.*|expected failure"
                  r"|unexpected success)\s*$", re.M)


def run_test_cuda(mode, path, timeout):
    cmd = [sys.executable, "-c", BOOT % {"py": os.path.join(ROOT, "python"), "mode": mode},
           path, "-v"]
    for p in TEST_CUDA_PATTERNS:
        cmd += ["-k", p]
    t0 = time.time()
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True, timeout=timeout, cwd=os.path.dirname(path))
        out, rc = r.stdout, r.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout or ""
        if isinstance(out, bytes):
            out = out.decode("utf-8", "replace")
        rc = "timeout"
    def key(name, where):  # "__main__.TestCuda.test_x" -> "TestCuda.test_x"
        parts = [p for p in where.split(".") if p != "__main__"]
        return ".".join(parts if parts[-1] == name else parts + [name])

    tests = {}
    for name, where, verdict in LINE.findall(out):
        tests[key(name, where)] = verdict
    # The reason of each failure: the last line of its traceback.
    for block in re.split(r"^={50,}$", out, flags=re.M)[1:]:
        head = re.match(r"\s*(FAIL|ERROR): (test\w+) \(([\w.]+)\)", block)
        if not head:
            continue
        block = re.split(r"^-{50,}$", block, flags=re.M)[1] if re.search(
            r"^-{50,}$", block, flags=re.M) else block
        lines = [ln for ln in block.strip().splitlines() if ln.strip()]
        tests[key(head.group(2), head.group(3))] = "%s: %s" % (
            head.group(1), lines[-1][:300] if lines else "?")
    return {"rc": rc, "seconds": round(time.time() - t0, 1), "tests": tests,
            "tail": out[-3000:]}


# ---- the parent ----

def run_child(mode, name, timeout):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, name]
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "TIMEOUT(%ds)" % timeout}
    for line in reversed(r.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"status": "FAIL(rc=%s)" % r.returncode, "error": r.stdout[-3000:]}


def compare(name, native, stowage):
    """What the two runs should share, as a verdict string."""
    a, b = native.get("figures", {}), stowage.get("figures", {})
    if name in ("resnet50", "trainer", "compile") and a.get("losses") and b.get("losses"):
        worst = max(abs(x - y) / max(abs(x), 1e-6) for x, y in zip(a["losses"], b["losses"]))
        less = b["max_reserved"] <= a["max_reserved"]
        return "losses within %.1e (relative); reserved %s native's (%d vs %d)" % (
            worst, "at most" if less else "ABOVE", b["max_reserved"], a["max_reserved"])
    if name == "hostcost" and a.get("ns_per_alloc_free") and b.get("ns_per_alloc_free"):
        return "%.0f ns vs native %.0f ns: %.2f x" % (
            b["ns_per_alloc_free"], a["ns_per_alloc_free"],
            b["ns_per_alloc_free"] / a["ns_per_alloc_free"])
    return ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="folder for torch_adapter.json")
    ap.add_argument("--checks", default=",".join(CHECKS))
    ap.add_argument("--test-cuda", default=os.environ.get("TEST_CUDA_PY", ""),
                    help="PyTorch's test/test_cuda.py of this torch's release")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "CHECK"))
    args = ap.parse_args()
    if args.child:
        return child(*args.child)
    os.makedirs(args.out, exist_ok=True)
    import torch
    try:
        device = torch.cuda.get_device_name(0)
    except Exception as e:  # the checks say what fails without a GPU
        device = "none (%s)" % str(e).splitlines()[0]
    results = {"torch": torch.__version__, "device": device, "checks": {}}
    for name in args.checks.split(","):
        t = TIMEOUT_S.get(name, 90)
        if name == "test_cuda":
            if not os.path.isfile(args.test_cuda):
                results["checks"][name] = {"status": "SKIP", "why": (
                    "no test_cuda.py (--test-cuda or TEST_CUDA_PY: test/test_cuda.py of the "
                    "pytorch repository at tag v%s)" % torch.__version__.split("+")[0])}
                continue
            results["checks"][name] = {m: run_test_cuda(m, args.test_cuda, t)
                                       for m in ("stowage", "native")}
            continue
        runs = {m: run_child(m, name, t) for m in ("native", "stowage")}
        runs["compare"] = compare(name, runs["native"], runs["stowage"])
        results["checks"][name] = runs
        with open(os.path.join(args.out, "torch_adapter.json"), "w") as f:
            json.dump(results, f, indent=1)
    with open(os.path.join(args.out, "torch_adapter.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("%-10s %-10s %-10s %s" % ("check", "native", "stowage", "figures / comparison"))
    for name, r in results["checks"].items():
        if name == "test_cuda":
            if "status" in r:
                print("%-10s %s" % (name, r["why"]))
                continue
            for mode in ("stowage", "native"):
                counts = {}
                for v in r[mode]["tests"].values():
                    kind = v.split(":")[0].split(" ")[0]
                    counts[kind] = counts.get(kind, 0) + 1
                print("%-10s %-10s %s" % (name, mode, counts))
            for test, verdict in sorted(r["stowage"]["tests"].items()):
                if verdict.startswith(("FAIL", "ERROR")):
                    print("    %s: %s" % (test, verdict))
            continue
        n, s = r["native"], r["stowage"]
        shown = r["compare"] or json.dumps(s.get("figures", s.get("error", "")))[:160]
        print("%-10s %-10s %-10s %s" % (name, n["status"], s["status"], shown))
        if s["status"] != "PASS":
            print("    stowage: %s" % s.get("error", "")[:400])


if __name__ == "__main__":
    main()
