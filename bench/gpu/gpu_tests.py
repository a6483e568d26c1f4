"""Functional GPU checks of PyTorch on Stowage (one process; bench/gpu/run.sh).

Each check is independent; the script prints PASS/FAIL per check and exits 1
if any failed. Memory fraction is set before the first allocation so that the
pool is created with it (see docs/torch.md for why).
"""

import argparse
import os
import time
import traceback

import common

ap = argparse.ArgumentParser()
ap.add_argument("--out")
args = ap.parse_args()

import stowage  # noqa: E402
import stowage.torch  # noqa: E402

stowage.torch.enable()
import torch  # noqa: E402

results = {}
GiB = 1 << 30


def check(name):
    def deco(fn):
        t = time.time()
        try:
            fn()
            results[name] = "PASS"
        except Exception as e:  # report, continue
            results[name] = "FAIL: %s" % e
            traceback.print_exc()
        print("%-32s %s (%.2fs)" % (name, results[name], time.time() - t), flush=True)
        return fn
    return deco


total = torch.cuda.get_device_properties(0).total_memory
# limit the pool to 25% of the device: set before the first CUDA tensor
torch.cuda.set_per_process_memory_fraction(0.25, 0)


@check("write_read")
def _():
    for n in (1, 1000, 1 << 20, (64 << 20) + 3):
        x = torch.arange(n, device="cuda", dtype=torch.int32)
        y = x.cpu()
        assert torch.equal(y, torch.arange(n, dtype=torch.int32))
    assert stowage.memory_allocated() >= 0


@check("stats_track_tensors")
def _():
    torch.cuda.synchronize()
    before = stowage.memory_allocated()
    x = torch.empty(100 << 20, dtype=torch.uint8, device="cuda")
    assert stowage.memory_allocated() - before >= 100 << 20, stowage.memory_allocated()
    del x
    assert stowage.memory_allocated() == before
    s = stowage.memory_stats()
    assert s["allocated_bytes.all.peak"] >= 100 << 20


@check("streams_record_stream")
def _():
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    for _ in range(50):
        with torch.cuda.stream(s1):
            a = torch.randn(4 << 20, device="cuda")
        with torch.cuda.stream(s2):
            s2.wait_stream(s1)
            b = a * 2
            a.record_stream(s2)
        del a  # freed on s1's side while s2 may still read it
        with torch.cuda.stream(s1):
            c = torch.zeros(4 << 20, device="cuda")  # must not alias a before s2 is done
        s2.synchronize()
        assert float(b.abs().sum().item()) > 0
        del b, c
    torch.cuda.synchronize()
    st = stowage.memory_stats()
    assert st["num_event_records"] > 0, st["num_event_records"]


@check("oom_under_memory_fraction")
def _():
    big = int(total * 0.3)  # > 25% limit
    try:
        x = torch.empty(big, dtype=torch.uint8, device="cuda")
        # The pluggable wrapper does not check for NULL (docs/torch.md): detect it.
        ok = x.data_ptr() == 0
        del x
        assert ok, "allocation over the limit succeeded"
    except torch.OutOfMemoryError:
        pass
    except RuntimeError as e:  # older PyTorch raises a plain RuntimeError
        assert "memory" in str(e).lower(), e
    st = stowage.memory_stats()
    assert st["num_ooms"] >= 1, st["num_ooms"]
    assert "out of memory" in stowage.last_error()
    y = torch.empty(int(total * 0.1), dtype=torch.uint8, device="cuda")  # fits
    del y


@check("empty_cache")
def _():
    x = torch.empty(1 * GiB, dtype=torch.uint8, device="cuda")
    del x
    torch.cuda.synchronize()
    r0 = stowage.memory_reserved()
    free0, _ = torch.cuda.mem_get_info()
    torch.cuda.empty_cache()  # reset_fn -> stow_torch_empty_cache
    r1 = stowage.memory_reserved()
    free1, _ = torch.cuda.mem_get_info()
    assert r1 < r0, (r0, r1)
    assert free1 - free0 >= (1 * GiB) - (64 << 20), (free0, free1)


@check("reset_peak")
def _():
    stowage.reset_peak_memory_stats()
    assert stowage.max_memory_allocated() == stowage.memory_allocated()


@check("summary")
def _():
    text = stowage.memory_summary()
    assert len(text) > 100
    print(text)


@check("threads")
def _():
    import threading
    errs = []

    def work():
        try:
            for _ in range(100):
                t = torch.ones(1 << 18, device="cuda")
                assert float(t.sum().item()) == 1 << 18
        except Exception as e:
            errs.append(e)
    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs, errs


common.write_json(args.out, {"checks": results, "stats": stowage.memory_stats()})
raise SystemExit(0 if all(v == "PASS" for v in results.values()) else 1)
