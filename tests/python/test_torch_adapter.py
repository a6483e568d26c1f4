"""The C++ adapter (python/csrc/torch_allocator.cpp): Stowage behind PyTorch's
whole CUDA allocator interface, checked without a GPU.

Needs torch (a CUDA build; the venvs' pythons: make deps, then
~/.cache/stowage/venv/bin/python -m unittest tests/python/test_torch_adapter.py
for the pinned torch, ~/.cache/stowage/venv-torch-newest/bin/python for the
newest); skips with the reason otherwise. The adapter is built, when it is
missing or older than its source (stowage_backend's torch-adapter build, about
20 s), beside the loaded libstowage.so for the pinned torch, in torch-M.N/
beside it for another; or taken from $STOWAGE_TORCH_ADAPTER. What a torch
version's interface has beside another's is tested under that version
(TORCH_2_15).

It is installed once, as PyTorch's allocator, with its pools on the simulated
device (STOWAGE_BACKEND=sim): device and stream of each allocation then come
from stow_torch_adapter_sim_select, never from CUDA. The methods are reached
through PyTorch's own bindings where one exists that needs no GPU
(torch._C._cuda_memoryStats, _cuda_cudaCachingAllocator_raw_alloc,
_cuda_beginAllocateToPool, _cuda_getCheckpointState,
torch.cuda.memory._snapshot...), else through stow_torch_adapter_call, which
calls the method on c10::cuda::CUDACachingAllocator::get() as PyTorch's C++
code does. Each test starts from no pool (stow_torch_adapter_reset).
What needs a GPU (tensors, cudnn.benchmark, real graph captures,
torch.compile, PyTorch's own allocator tests) is bench/gpu/torch_adapter.py.
"""

import ctypes
import os
import pickle
import random
import subprocess
import sys
import tempfile
import threading
import time
import unittest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "python", "backend"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    import torch
except ImportError as e:
    raise unittest.SkipTest("torch is not importable by %s (%s): run these with the venv's python "
                            "(make deps)" % (sys.executable, e))
if not getattr(torch.version, "cuda", None):
    raise unittest.SkipTest("torch %s is not a CUDA build" % torch.__version__)

os.environ["STOWAGE_BACKEND"] = "sim"
TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
TORCH_2_15 = TORCH >= (2, 15)

import stowage  # noqa: E402
import stowage._lib  # noqa: E402
import stowage.torch as st  # noqa: E402
import stowage_backend  # noqa: E402

try:
    LIB = stowage._lib.load()
except stowage.LibraryNotFound as e:  # pragma: no cover
    raise unittest.SkipTest(str(e))

MiB = 1 << 20
GiB = 1 << 30
SIM_CAPACITY = 1 << 46          # the simulated device's default capacity
ONE_GIB_FRACTION = GiB / SIM_CAPACITY


def adapter_library():
    """The adapter to test: $STOWAGE_TORCH_ADAPTER, else built beside libstowage.so."""
    env = os.environ.get("STOWAGE_TORCH_ADAPTER")
    if env:
        return env
    lib = stowage._lib.path()
    out_dir = os.path.dirname(lib)
    pinned = next(iter(stowage_backend.ADAPTER_TORCH))
    if "%d.%d" % TORCH != pinned:
        # Not the file stowage.torch.adapter_path() finds, nor the one the
        # pinned torch's tests build (ctest runs both at once).
        out_dir = os.path.join(out_dir, "torch-%d.%d" % TORCH)
    target = os.path.join(out_dir, stowage_backend.ADAPTER_NAME)
    newest = max(os.path.getmtime(stowage_backend.ADAPTER_SOURCE), os.path.getmtime(lib))
    if not os.path.exists(target) or os.path.getmtime(target) < newest:
        log = tempfile.TemporaryFile(mode="w+")
        path, why = stowage_backend.build_torch_adapter(out_dir, lib, log)
        if path is None:
            log.seek(0)
            raise RuntimeError("the adapter was not built: %s\n%s" % (why, log.read()[-6000:]))
    os.environ["STOWAGE_TORCH_ADAPTER"] = target  # for the subprocesses below
    return target


ADAPTER = adapter_library()
_why = st._install_adapter(torch)
if _why is not None:
    raise RuntimeError("installing the adapter failed: %s" % _why)
A = st._adapter
c = ctypes
for _name, _res, _args in (
        ("stow_torch_adapter_sim_select", c.c_int, [c.c_int, c.c_void_p]),
        ("stow_torch_adapter_record_history", c.c_int,
         [c.c_int, c.c_size_t, c.c_int, c.c_char_p, c.c_char_p, c.c_size_t]),
        ("stow_torch_adapter_hold", c.c_int,
         [c.c_int, c.c_size_t, c.POINTER(c.c_void_p), c.c_char_p, c.c_size_t]),
        ("stow_torch_adapter_drop", c.c_int, [c.c_int]),
        ("stow_torch_adapter_record_stream", c.c_int,
         [c.c_int, c.c_void_p, c.c_char_p, c.c_size_t]),
        ("stow_torch_adapter_reset", c.c_int, []),
        ("stow_torch_adapter_call", c.c_int,
         [c.c_char_p, c.c_uint64, c.c_uint64, c.c_char_p, c.c_size_t])):
    getattr(A, _name).restype = _res
    getattr(A, _name).argtypes = _args


def call(method, a=0, b=0):
    """(status, text) of one interface method called through PyTorch's allocator."""
    buf = ctypes.create_string_buffer(8192)
    status = A.stow_torch_adapter_call(method.encode(), a, b, buf, len(buf))
    return status, buf.value.decode()


def raw_alloc(size, stream=0):
    return torch._C._cuda_cudaCachingAllocator_raw_alloc(size, stream)


def raw_delete(ptr):
    torch._C._cuda_cudaCachingAllocator_raw_delete(ptr)


def flat(d, prefix=""):
    """Nested keys joined by ".", a tuple key's parts by "_" (as torch.cuda.memory_stats)."""
    out = {}
    for k, v in d.items():
        if isinstance(k, tuple):
            k = "_".join(map(str, k))
        if isinstance(v, dict):
            out.update(flat(v, prefix + k + "."))
        else:
            out[prefix + k] = v
    return out


def stats(device=0):
    """torch.cuda.memory_stats(device), from PyTorch's binding (the Python
    function answers {} before CUDA is initialised)."""
    return flat(torch._C._cuda_memoryStats(device))


def hold(slot, size):
    ptr, why = ctypes.c_void_p(), ctypes.create_string_buffer(4096)
    status = A.stow_torch_adapter_hold(slot, size, ctypes.byref(ptr), why, len(why))
    return status, ptr.value, why.value.decode()


def record_history(enabled=True, max_entries=10000, when=3, skip=None):
    why = ctypes.create_string_buffer(1024)
    status = A.stow_torch_adapter_record_history(int(enabled), max_entries, when,
                                                 skip.encode() if skip else None, why, len(why))
    if status != 0:
        raise AssertionError(why.value.decode())


def set_fraction(fraction, device=0):
    torch._C._cuda_setMemoryFraction(fraction, device)


def segments_of(snap, pool_id):
    return [s for s in snap["segments"] if tuple(s["segment_pool_id"]) == pool_id]


class Base(unittest.TestCase):
    def setUp(self):
        self.assertEqual(A.stow_torch_adapter_reset(), 0)
        self.assertEqual(A.stow_torch_adapter_sim_select(0, None), 0)

    def tearDown(self):
        A.stow_torch_adapter_reset()


class Installation(Base):
    def test_pytorch_calls_the_adapter(self):
        self.assertEqual(A.stow_torch_adapter_installed(), 1)
        self.assertEqual(call("name"), (0, "stowage"))
        self.assertEqual(call("raw_deleter"), (0, "adapter"))
        self.assertEqual(call("c10::GetAllocator"), (0, "adapter"),
                         "c10::GetAllocator(kCUDA) (torch.accelerator, storages) is the adapter")
        self.assertIsNotNone(torch._C._cuda_getAllocator())
        self.assertEqual(A.stow_torch_adapter_torch_version().decode(),
                         torch.__version__.split("+")[0])

    def test_a_torch_of_another_version_is_refused(self):
        why = ctypes.create_string_buffer(1024)
        status = A.stow_torch_adapter_install(b"2.9.1", why, len(why))
        self.assertEqual(status, 1)  # STOW_EINVAL
        text = why.value.decode()
        self.assertIn("built for torch %d.%d" % TORCH, text)
        self.assertIn("runs torch 2.9.1", text)
        self.assertIn("CUDAAllocator interface", text)

    def test_a_second_install_is_refused(self):
        why = ctypes.create_string_buffer(1024)
        self.assertEqual(A.stow_torch_adapter_install(torch.__version__.encode(), why, len(why)),
                         3)  # STOW_EBUSY
        self.assertIn("installed already", why.value.decode())


class Statistics(Base):
    def test_memory_stats_have_pytorchs_keys_and_stowages_figures(self):
        a = raw_alloc(1000)
        b = raw_alloc(3 * MiB)
        s = stats()
        self.assertEqual(s["allocation.all.current"], 2)
        self.assertEqual(s["allocation.small_pool.current"], 1)
        self.assertEqual(s["allocation.large_pool.current"], 1)
        self.assertEqual(s["requested_bytes.all.current"], 1000 + 3 * MiB)
        self.assertEqual(s["allocated_bytes.all.current"], 1024 + 3 * MiB)
        self.assertEqual(s["num_ooms"], 0)
        self.assertEqual(s["max_split_size"], -1)  # unlimited, as PyTorch reports it
        mine = stowage.memory_stats(0)
        for key in ("reserved_bytes.all.current", "segment.all.current", "active_bytes.all.peak",
                    "inactive_split_bytes.all.current", "num_device_alloc"):
            self.assertEqual(s[key], mine[key], key)
        for key in ("oversize_allocations.current", "num_sync_all_streams", "num_device_free",
                    "num_alloc_retries"):
            self.assertIn(key, s)
        raw_delete(a)
        raw_delete(b)
        s = stats()
        self.assertEqual(s["allocated_bytes.all.current"], 0)
        self.assertEqual(s["allocated_bytes.all.peak"], 1024 + 3 * MiB)
        self.assertGreater(s["reserved_bytes.all.current"], 0, "freed blocks stay cached")

    def test_reset_peak_and_accumulated(self):
        raw_delete(raw_alloc(8 * MiB))
        keep = raw_alloc(MiB)
        torch._C._cuda_resetPeakMemoryStats(0)
        s = stats()
        self.assertEqual(s["allocated_bytes.all.peak"], s["allocated_bytes.all.current"])
        self.assertEqual(s["allocated_bytes.all.peak"], MiB)
        self.assertEqual(s["allocation.all.allocated"], 2)
        torch._C._cuda_resetAccumulatedMemoryStats(0)
        s = stats()
        self.assertEqual(s["allocation.all.allocated"], 0)
        self.assertEqual(s["allocation.all.freed"], 0)
        self.assertEqual(s["allocation.all.current"], 1)
        raw_delete(keep)

    def test_reserved_bytes_of_each_private_pool(self):
        pool = (0, 7)
        torch._C._cuda_beginAllocateToPool(0, pool)
        p = raw_alloc(3 * MiB)
        torch._C._cuda_endAllocateToPool(0, pool)
        keep = raw_alloc(MiB)  # the device pool's: not in the figures of private pools

        def of_pool():
            by_pool = torch._C._cuda_memoryStats(0).get("reserved_bytes_by_private_pools")
            if by_pool is None:
                return None
            s = by_pool.get(pool)
            self.assertEqual(set(by_pool), {pool} if s else set())
            return s and (s["all"]["current"], s["all"]["peak"], s["all"]["allocated"],
                          s["all"]["freed"])

        if not TORCH_2_15:
            self.assertIsNone(of_pool(), "torch 2.11's statistics have no such figures")
        else:
            seg = sum(s["total_size"] for s in segments_of(torch.cuda.memory._snapshot(), pool))
            self.assertGreaterEqual(seg, 3 * MiB)
            self.assertEqual(of_pool(), (seg, seg, seg, 0))
            torch._C._cuda_resetAccumulatedMemoryStats(0)
            self.assertEqual(of_pool(), (seg, seg, 0, 0))
        torch._C._cuda_releasePool(0, pool)
        raw_delete(p)
        self.assertEqual(segments_of(torch.cuda.memory._snapshot(), pool), [], "pool destroyed")
        if TORCH_2_15:
            self.assertEqual(of_pool(), (0, seg, 0, seg), "a destroyed pool's figures remain")
            torch._C._cuda_resetPeakMemoryStats(0)
            self.assertEqual(of_pool(), (0, 0, 0, seg))
            torch._C._cuda_resetAccumulatedMemoryStats(0)
            self.assertIsNone(of_pool(), "gone once reset")
        raw_delete(keep)

    def test_a_device_without_a_pool_has_zero_figures(self):
        s = stats(5)
        self.assertEqual(s["allocated_bytes.all.current"], 0)
        self.assertEqual(s["reserved_bytes.all.peak"], 0)
        with self.assertRaisesRegex(RuntimeError, "out of range"):
            torch._C._cuda_memoryStats(64)

    def test_each_device_its_own_figures(self):
        A.stow_torch_adapter_sim_select(1, None)
        p = raw_alloc(2 * MiB)
        self.assertEqual(stats(1)["allocation.all.current"], 1)
        self.assertEqual(stats(0)["allocation.all.current"], 0)
        raw_delete(p)
        self.assertEqual(stats(1)["allocation.all.current"], 0)


class OutOfMemory(Base):
    def test_out_of_memory_is_pytorchs_error_with_stowages_explanation(self):
        set_fraction(ONE_GIB_FRACTION)
        self.assertEqual(call("attachOutOfMemoryObserver")[0], 0)
        before = int(call("observed")[1].split()[0])
        with self.assertRaises(torch.OutOfMemoryError) as cm:
            raw_alloc(2 * GiB)
        text = str(cm.exception)
        self.assertTrue(text.startswith("CUDA out of memory."), text)
        self.assertIn("Tried to allocate 2.00 GiB. GPU 0 has a total capacity of", text)
        self.assertIn("stowage: out of memory", text)
        self.assertIn("pool limit 1.00 GiB", text)
        observed = call("observed")[1].split()
        self.assertEqual(int(observed[0]), before + 1, "the observers are called")
        self.assertEqual([int(x) for x in observed[1:4]], [0, 2 * GiB, GiB])
        self.assertEqual(stats()["num_ooms"], 1)
        self.assertIn("stowage: out of memory", st.oom_report(0))
        p = raw_alloc(MiB)  # the process goes on
        raw_delete(p)
        with self.assertRaisesRegex(torch.OutOfMemoryError, "more than 1EB"):
            raw_alloc(1 << 61)

    def test_memory_fraction(self):
        set_fraction(0.5)
        self.assertEqual(torch._C._cuda_getMemoryFraction(0), 0.5)
        p = raw_alloc(MiB)
        self.assertAlmostEqual(torch._C._cuda_getMemoryFraction(0), 0.5)
        set_fraction(ONE_GIB_FRACTION)
        with self.assertRaises(torch.OutOfMemoryError):
            raw_alloc(GiB)
        with self.assertRaisesRegex(RuntimeError, r"outside \(0, 1\]"):
            set_fraction(0.0)
        raw_delete(p)

    def test_a_use_on_oom_pool_serves_what_the_device_pool_cannot(self):
        set_fraction(ONE_GIB_FRACTION)
        pool = (0, 3)
        torch._C._cuda_beginAllocateToPool(0, pool)
        raw_delete(raw_alloc(512 * MiB))  # stays cached in the private pool
        torch._C._cuda_endAllocateToPool(0, pool)
        self.assertEqual(call("setUseOnOOM", 0, 3)[0], 0)
        big = raw_alloc(900 * MiB)
        p = raw_alloc(300 * MiB)  # does not fit the device pool's 1 GiB
        snap = torch.cuda.memory._snapshot()
        served = [b["address"] for seg in segments_of(snap, pool) for b in seg["blocks"]
                  if b["state"] == "active_allocated"]
        self.assertEqual(served, [p])
        raw_delete(p)
        raw_delete(big)
        torch._C._cuda_releasePool(0, pool)


class CacheAndEmpty(Base):
    def test_cache_info_gives_the_largest_block_a_request_could_get(self):
        set_fraction(ONE_GIB_FRACTION)
        raw_delete(raw_alloc(64 * MiB))
        status, largest = call("cacheInfo", 0, 1)
        self.assertEqual(status, 0, largest)
        self.assertEqual(int(largest), 64 * MiB, "a cached block of 64 MiB")
        status, largest = call("cacheInfo", 0, 0)
        self.assertEqual(int(largest), GiB - 64 * MiB, "a new segment: room left under the limit")

    def test_empty_cache_returns_cached_segments(self):
        raw_delete(raw_alloc(64 * MiB))
        self.assertGreater(stats()["reserved_bytes.all.current"], 0)
        torch._C._cuda_emptyCache()
        self.assertEqual(stats()["reserved_bytes.all.current"], 0)

    def test_empty_cache_is_skipped_while_a_capture_may_run(self):
        # Returning memory waits for the device, which a capture does not allow. Torch 2.15
        # says when a capture runs (markCaptureBegin, markCaptureEnd); under 2.11 any
        # allocation to a pool may be one.
        raw_delete(raw_alloc(64 * MiB))  # cached in the device pool
        torch._C._cuda_beginAllocateToPool(0, (0, 6))
        if TORCH_2_15:
            torch._C._cuda_emptyCache()
            self.assertEqual(stats()["reserved_bytes.all.current"], 0,
                             "served: allocations go to a pool, no capture runs")
            torch._C._cuda_endAllocateToPool(0, (0, 6))
            raw_delete(raw_alloc(64 * MiB))
            torch._C._cuda_beginAllocateToPool(0, (0, 6))
            self.assertEqual(call("markCaptureBegin", 0)[0], 0)
        torch._C._cuda_emptyCache()
        self.assertGreater(stats()["reserved_bytes.all.current"], 0, "skipped while capturing")
        if TORCH_2_15:
            self.assertEqual(call("markCaptureEnd", 0)[0], 0)
            status, text = call("markCaptureEnd", 0)
            self.assertNotEqual(status, 0)
            self.assertIn("without a capture", text)
        torch._C._cuda_endAllocateToPool(0, (0, 6))
        torch._C._cuda_emptyCache()
        self.assertEqual(stats()["reserved_bytes.all.current"], 0)
        torch._C._cuda_releasePool(0, (0, 6))

    def test_memory_info_of_the_simulated_device(self):
        p = raw_alloc(64 * MiB)
        status, text = call("getMemoryInfo", 0)
        free, total = map(int, text.split())
        self.assertEqual(total, SIM_CAPACITY)
        self.assertEqual(free, SIM_CAPACITY - 64 * MiB)
        raw_delete(p)


class Blocks(Base):
    def test_allocate_gives_a_data_ptr_whose_deleter_frees_the_block(self):
        status, ptr, why = hold(0, MiB)
        self.assertEqual(status, 0, why)
        self.assertEqual(ptr % 512, 0)
        self.assertEqual(stats()["allocation.all.current"], 1)
        A.stow_torch_adapter_drop(0)
        self.assertEqual(stats()["allocation.all.current"], 0)

    def test_size_zero_is_a_null_data_ptr(self):
        status, ptr, why = hold(0, 0)
        self.assertEqual(status, 0, why)
        self.assertIsNone(ptr)
        A.stow_torch_adapter_drop(0)
        self.assertEqual(stats()["allocation.all.allocated"], 0)

    def test_record_stream_then_free(self):
        status, ptr, why = hold(0, MiB)
        why = ctypes.create_string_buffer(1024)
        self.assertEqual(A.stow_torch_adapter_record_stream(0, 0x2000, why, len(why)), 0,
                         why.value.decode())
        A.stow_torch_adapter_drop(0)
        s = stats()
        self.assertEqual(s["allocation.all.current"], 0)

    def test_a_pointer_stowage_did_not_give_is_ignored(self):
        raw_delete(0x1234000)  # logged once, no exception
        raw_delete(0)

    def test_base_allocation_is_the_segment(self):
        p = raw_alloc(1000)
        status, text = call("getBaseAllocation", p)
        self.assertEqual(status, 0, text)
        base, size = map(int, text.split())
        self.assertLessEqual(base, p)
        self.assertLess(p, base + size)
        self.assertEqual(size, 2 * MiB)
        raw_delete(p)
        status, text = call("getBaseAllocation", p)
        self.assertNotEqual(status, 0)
        self.assertIn("not a live block", text)

    def test_threads(self):
        errors = []

        def work(seed):
            rng = random.Random(seed)
            live = []
            try:
                for _ in range(300):
                    if live and rng.random() < 0.5:
                        raw_delete(live.pop(rng.randrange(len(live))))
                    else:
                        live.append(raw_alloc(rng.choice((512, 4096, 70000, MiB + 3, 5 * MiB))))
                for p in live:
                    raw_delete(p)
            except Exception as e:  # pragma: no cover
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        s = stats()
        self.assertEqual(s["allocation.all.current"], 0)
        self.assertEqual(s["allocation.all.allocated"], s["allocation.all.freed"])


class PrivatePools(Base):
    @classmethod
    def setUpClass(cls):
        import test_torch_snapshot
        cls.tts = test_torch_snapshot

    def test_allocations_go_to_the_pool_while_allocating_to_it(self):
        pool = (0, 7)
        torch._C._cuda_beginAllocateToPool(0, pool)
        self.assertEqual(call("getPoolUseCount", 0, 7), (0, "1"))
        p = raw_alloc(MiB)
        torch._C._cuda_endAllocateToPool(0, pool)
        q = raw_alloc(MiB)
        snap = torch.cuda.memory._snapshot()
        mine = segments_of(snap, pool)
        self.assertEqual([s["address"] for s in mine], [p])
        self.assertEqual([s["address"] for s in segments_of(snap, (0, 0))], [q])
        self.assertEqual(stats()["allocation.all.current"], 2, "the device counts both pools")
        self.assertEqual(torch.cuda.memory.memory_snapshot(pool)[0]["address"], p)
        # Released: the pool lives until its last block is freed.
        torch._C._cuda_releasePool(0, pool)
        self.assertEqual(call("getPoolUseCount", 0, 7), (0, "0"))
        self.assertEqual(len(segments_of(torch.cuda.memory._snapshot(), pool)), 1)
        raw_delete(p)
        self.assertEqual(segments_of(torch.cuda.memory._snapshot(), pool), [])
        s = stats()
        self.assertEqual(s["allocation.all.allocated"], 2, "a destroyed pool's counts remain")
        self.assertEqual(s["allocation.all.current"], 1)
        self.assertEqual(s["reserved_bytes.all.current"],
                         stowage.memory_stats(0)["reserved_bytes.all.current"])
        raw_delete(q)

    def test_use_counts_and_wrong_calls(self):
        self.assertEqual(call("createOrIncrefPool", 0, 4)[0], 0)
        self.assertEqual(call("createOrIncrefPool", 0, 4)[0], 0)
        self.assertEqual(call("getPoolUseCount", 0, 4), (0, "2"))
        torch._C._cuda_releasePool(0, (0, 4))
        torch._C._cuda_releasePool(0, (0, 4))
        self.assertEqual(call("getPoolUseCount", 0, 4), (0, "0"))
        with self.assertRaisesRegex(RuntimeError, "does not exist"):
            torch._C._cuda_releasePool(0, (0, 4))
        with self.assertRaisesRegex(RuntimeError, "not allocating to pool"):
            torch._C._cuda_endAllocateToPool(0, (0, 5))
        torch._C._cuda_beginAllocateToPool(0, (0, 5))
        with self.assertRaisesRegex(RuntimeError, "already allocating"):
            torch._C._cuda_beginAllocateToPool(0, (0, 5))
        torch._C._cuda_endAllocateToPool(0, (0, 5))
        torch._C._cuda_releasePool(0, (0, 5))

    def test_frees_of_blocks_used_on_other_streams_wait_for_the_capture_to_end(self):
        status, ptr, why = hold(0, MiB)
        why = ctypes.create_string_buffer(1024)
        self.assertEqual(A.stow_torch_adapter_record_stream(0, 0x2000, why, len(why)), 0)
        torch._C._cuda_beginAllocateToPool(0, (0, 8))
        A.stow_torch_adapter_drop(0)
        self.assertEqual(stats()["allocation.all.current"], 1, "held while capturing")
        torch._C._cuda_endAllocateToPool(0, (0, 8))
        self.assertEqual(stats()["allocation.all.current"], 0, "freed when the capture ended")
        torch._C._cuda_releasePool(0, (0, 8))

    def test_checkpoint_and_live_allocations(self):
        pool = (0, 9)
        torch._C._cuda_beginAllocateToPool(0, pool)
        a, b = raw_alloc(MiB), raw_alloc(2 * MiB)
        torch._C._cuda_endAllocateToPool(0, pool)
        self.assertTrue(torch._C._cuda_checkPoolLiveAllocations(0, pool, {a, b}))
        self.assertFalse(torch._C._cuda_checkPoolLiveAllocations(0, pool, {a}))
        state = torch._C._cuda_getCheckpointState(0, pool)
        # Every block of the checkpoint is still live: the blocks come back as
        # new DataPtrs (released by the binding, as no storage takes them).
        torch._C._cuda_setCheckpointPoolState(0, state, [], [])
        self.assertTrue(torch._C._cuda_checkPoolLiveAllocations(0, pool, {a, b}))
        # A block freed since is made again at its address, and one allocated
        # since is freed: a CUDA-graph tree that records a new path.
        raw_delete(b)
        torch._C._cuda_beginAllocateToPool(0, pool)
        c = raw_alloc(3 * MiB)
        torch._C._cuda_endAllocateToPool(0, pool)
        torch._C._cuda_setCheckpointPoolState(0, state, [], [])
        self.assertTrue(torch._C._cuda_checkPoolLiveAllocations(0, pool, {a, b}))
        live = [blk for seg in segments_of(torch.cuda.memory._snapshot(), pool)
                for blk in seg["blocks"] if blk["state"] == "active_allocated"]
        self.assertEqual(sorted(blk["size"] for blk in live), [MiB, 2 * MiB],
                         "c (3 MiB, maybe at b's address) freed, b made again")
        raw_delete(b)
        raw_delete(a)
        with self.assertRaisesRegex(RuntimeError, "no private pool"):
            torch._C._cuda_getCheckpointState(0, (0, 99))
        torch._C._cuda_releasePool(0, pool)
        torch._C._cuda_releasePool(0, pool)  # the second beginAllocateToPool's use
        self.assertEqual(segments_of(torch.cuda.memory._snapshot(), pool), [])

    def test_a_restore_that_cannot_finish_leaves_the_pool_as_it_was(self):
        # A CUDA-graph tree restores a checkpoint whose block b was freed
        # since; an empty_cache of the pool (which waits for the device) made
        # b's bytes any stream's, or gave them back to the device when no
        # block d kept their segment. c was allocated since on stream 0x3000,
        # in b's bytes when they stayed. The restore frees c, cannot make b
        # again (its bytes are stream 0x3000's, or not the pool's), and must
        # make c again.
        for keep_segment in (True, False):
            with self.subTest(keep_segment=keep_segment):
                self.restore_fails(keep_segment)
            self.setUp()

    def restore_fails(self, keep_segment):
        pool = (0, 10)
        record_history()
        torch._C._cuda_beginAllocateToPool(0, pool)
        a, b = raw_alloc(MiB), raw_alloc(4 * MiB)
        d = raw_alloc(4 * MiB) if keep_segment else None
        torch._C._cuda_endAllocateToPool(0, pool)
        state = torch._C._cuda_getCheckpointState(0, pool)
        raw_delete(b)
        self.assertEqual(call("emptyCache", 0, 10), (0, ""))
        torch._C._cuda_beginAllocateToPool(0, pool)
        c = raw_alloc(2 * MiB, 0x3000)
        torch._C._cuda_endAllocateToPool(0, pool)
        self.assertEqual(c == b, keep_segment)
        live = {a, c, d} - {None}

        def blocks():
            return [[(blk["size"], blk["requested_size"], blk["state"]) for blk in seg["blocks"]]
                    for seg in segments_of(torch.cuda.memory._snapshot(), pool)]

        keys = ("allocated_bytes.all.current", "allocation.all.current",
                "active_bytes.all.current", "requested_bytes.all.current",
                "reserved_bytes.all.current", "segment.all.current")
        before = stats()
        layout = blocks()
        history = len(torch.cuda.memory._snapshot()["device_traces"][0])
        with self.assertRaises(RuntimeError) as caught:
            torch._C._cuda_setCheckpointPoolState(0, state, [], [])
        text = str(caught.exception)
        self.assertIn("cannot restore private pool (0, 10)", text)
        self.assertIn("%#x cannot be made again" % b, text)
        self.assertIn("the pool is as it was", text)
        self.assertTrue(torch._C._cuda_checkPoolLiveAllocations(0, pool, live))
        after = stats()
        self.assertEqual({k: after[k] for k in keys}, {k: before[k] for k in keys})
        self.assertEqual(blocks(), layout)
        # The history says what happened to the pool: c freed and made again,
        # at its address, on its stream, which its free names too.
        snap = torch.cuda.memory._snapshot()
        trace = snap["device_traces"][0]
        self.assertEqual([(e["action"], e["addr"], e["size"], e["stream"])
                          for e in trace[history:]],
                         [("free_requested", c, 2 * MiB, 0x3000),
                          ("free_completed", c, 2 * MiB, 0x3000),
                          ("alloc", c, 2 * MiB, 0x3000)])
        self.tts.viewer_replay(snap, 0)
        for p in live:
            raw_delete(p)
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        self.assertEqual([(e["action"], e["stream"]) for e in trace if e["addr"] == c][-2:],
                         [("free_requested", 0x3000), ("free_completed", 0x3000)])
        record_history(False)
        torch._C._cuda_releasePool(0, pool)
        torch._C._cuda_releasePool(0, pool)


class Snapshots(Base):
    @classmethod
    def setUpClass(cls):
        import test_torch_snapshot
        cls.tts = test_torch_snapshot

    def workload(self):
        set_fraction(ONE_GIB_FRACTION)
        keep = [raw_alloc(s) for s in (1000, 70000, 3 * MiB, 25 * MiB)]
        for s in (512, 2 * MiB, 40 * MiB):
            raw_delete(raw_alloc(s))
        torch._C._cuda_beginAllocateToPool(0, (0, 11))
        keep.append(raw_alloc(5 * MiB))
        torch._C._cuda_endAllocateToPool(0, (0, 11))
        try:
            raw_alloc(2 * GiB)
        except torch.OutOfMemoryError:
            pass
        torch._C._cuda_emptyCache()
        return keep

    def test_snapshot_without_history(self):
        keep = self.workload()
        snap = torch.cuda.memory._snapshot()
        self.tts.check_format(self, snap, "adapter")
        self.tts.check_invariants(self, snap, "adapter")
        self.assertEqual(snap["device_traces"], [[]])
        self.assertEqual(sum(s["allocated_size"] for s in snap["segments"]),
                         stats()["allocated_bytes.all.current"])
        self.assertEqual(len(segments_of(snap, (0, 11))), 1)
        for p in keep:
            raw_delete(p)
        torch._C._cuda_releasePool(0, (0, 11))

    def test_history_in_pytorchs_format_for_memory_viz(self):
        record_history()
        self.assertEqual(call("isHistoryEnabled"), (0, "1"))
        keep = self.workload()
        call("compileContext", 0, 4096)
        call("userMetadata", 0, 7)
        call("annotation")
        snap = torch.cuda.memory._snapshot()
        # The pool's own policy: the default is page-mapped where pages map (the simulated device).
        self.assertTrue(snap["allocator_settings"]["expandable_segments"])
        trace = snap["device_traces"][0]
        actions = {e["action"] for e in trace}
        self.assertTrue({"alloc", "free_requested", "free_completed", "segment_alloc",
                         "oom"} <= actions, actions)
        # A classic pool frees segments; a page-mapped one (the default) unmaps granules.
        self.assertTrue({"segment_free", "segment_unmap"} & actions, actions)
        oom = [e for e in trace if e["action"] == "oom"]
        self.assertEqual(oom[0]["size"], 2 * GiB)
        self.assertIn("device_free", oom[0])
        # Entries carry frames when a stack recorder is given (none here).
        rest = dict(snap, device_traces=[[dict(e, frames=[]) for e in trace
                                          if e["action"] != "oom"]])
        if TORCH_2_15:
            # Torch 2.15's entries name their pool, which the checked format has not.
            pools = {e["pool_id"] for e in trace if e["action"] == "alloc"}
            self.assertEqual(pools, {(0, 0), (0, 11)})
            for e in rest["device_traces"][0]:
                self.assertIn(e.pop("pool_id"), pools)
        self.tts.check_format(self, rest, "adapter")
        self.tts.check_invariants(self, snap, "adapter")
        self.assertGreater(self.tts.viewer_replay(rest, 0), 10)
        times = [e["time_us"] for e in trace]
        self.assertEqual(times, sorted(times))
        self.assertTrue(any(e.get("compile_context") == "compiled_fn" for e in trace))
        self.assertEqual(snap["external_annotations"][0]["stage"], "START")
        self.assertEqual(snap["allocator_settings"]["max_split_size"], -1)
        from torch.cuda import _memory_viz
        for fn in (_memory_viz.segsum, _memory_viz.trace, _memory_viz.trace_plot,
                   _memory_viz.segment_plot):
            self.assertIsInstance(fn(snap), str, fn.__name__)
        lines = lambda text, *args: text  # noqa: E731  (the flame graph script is not fetched)
        for fn in (_memory_viz.segments, _memory_viz.memory):
            self.assertTrue(fn(snap, format_flamegraph=lines), fn.__name__)
        self.assertIsInstance(_memory_viz.compare(snap["segments"], snap["segments"],
                                                  format_flamegraph=lines), str)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "snap.pickle")
            torch.cuda.memory._dump_snapshot(path)
            with open(path, "rb") as f:
                again = pickle.load(f)
            self.assertEqual(len(again["segments"]), len(snap["segments"]))
            r = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "stats", path],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               universal_newlines=True)
            self.assertEqual(r.returncode, 0, r.stdout)
        for p in keep:
            raw_delete(p)
        torch._C._cuda_releasePool(0, (0, 11))
        record_history(False)
        self.assertEqual(call("isHistoryEnabled"), (0, "0"))
        kept = torch.cuda.memory._snapshot()["device_traces"][0]
        self.assertTrue(any(e["action"] == "segment_alloc" for e in kept),
                        "the history stays after it stops")

    def check_pool_order(self, trace, held=()):
        """Each block entry lies in memory its pool holds at that point of the
        list: mapped or reserved by an earlier segment entry, or held (the
        [start, end) ranges the pools held as the history began), and not
        unmapped or released since."""
        held = list(held)

        def take(a, n):
            nonlocal held
            held = [(s, e) for s, e in held if e <= a or s >= a + n] + \
                   [(s, a) for s, e in held if s < a < e] + \
                   [(a + n, e) for s, e in held if s < a + n < e]

        def covered(a, n):
            at = a
            for s, e in sorted(held):
                if s <= at < e:
                    at = e
            return at >= a + n

        for i, e in enumerate(trace):
            act = e["action"]
            if act in ("segment_alloc", "segment_map"):
                held.append((e["addr"], e["addr"] + e["size"]))
            elif act in ("segment_free", "segment_unmap"):
                take(e["addr"], e["size"])
            elif act in ("alloc", "free_requested", "free_completed"):
                self.assertTrue(covered(e["addr"], max(e["size"], 1)),
                                "entry %d: %s of %#x (%d bytes) in memory no earlier segment "
                                "entry holds" % (i, act, e["addr"], e["size"]))
        times = [e["time_us"] for e in trace]
        self.assertEqual(times, sorted(times))

    def test_each_pools_entries_follow_its_own_order_of_events(self):
        # A pool's recorded times come from its own clock (a cycle counter,
        # converted when read), the block entries' from PyTorch's: the order must
        # not rest on their agreeing to the microsecond. Many maps and unmaps,
        # and private pools whose recordings are short, give them room to differ.
        record_history(max_entries=100000)
        rng = random.Random(7)
        for cycle in range(48):
            ptrs = [raw_alloc(rng.choice((MiB, 3 * MiB, 9 * MiB, 33 * MiB)))
                    for _ in range(rng.randint(1, 3))]
            time.sleep(0.002)
            for p in ptrs:
                raw_delete(p)
            if cycle % 3 == 2:
                torch._C._cuda_emptyCache()
            if cycle % 2 == 0:
                pool = (0, 40 + cycle)
                torch._C._cuda_beginAllocateToPool(0, pool)
                p = raw_alloc(rng.choice((MiB, 5 * MiB)))
                torch._C._cuda_endAllocateToPool(0, pool)
                time.sleep(0.001)
                raw_delete(p)
                torch._C._cuda_releasePool(0, pool)
        snap = torch.cuda.memory._snapshot()
        trace = snap["device_traces"][0]
        actions = {e["action"] for e in trace}
        self.assertTrue({"segment_map", "segment_unmap", "segment_alloc", "segment_free"}
                        <= actions, actions)
        self.check_pool_order(trace)
        self.tts.viewer_replay(snap, 0)
        record_history(False)
        # The recordings' times are estimated again when they are read.
        snap = torch.cuda.memory._snapshot()
        self.assertEqual(len(snap["device_traces"][0]), len(trace))
        self.check_pool_order(snap["device_traces"][0])
        self.tts.viewer_replay(snap, 0)

    def test_history_across_stops_and_restarts(self):
        # Recording stops and starts again, with another max_entries each
        # time; between, blocks are allocated and freed, the cache emptied,
        # and a private pool made, used after the restart. Each history holds
        # what happened since its start, in each pool's own order of events,
        # on the memory the pools held at its start.
        from torch.cuda import _memory_viz
        lines = lambda text, *args: text  # noqa: E731
        rng = random.Random(13)

        def work(cycles, first_pool):
            for cycle in range(cycles):
                ptrs = [raw_alloc(rng.choice((512, 70000, MiB, 3 * MiB, 9 * MiB, 33 * MiB)))
                        for _ in range(rng.randint(1, 3))]
                time.sleep(0.001)
                for p in ptrs[1:]:
                    raw_delete(p)
                across.append(ptrs[0])
                if len(across) > 4:
                    raw_delete(across.pop(rng.randrange(len(across))))
                if cycle % 3 == 2:
                    torch._C._cuda_emptyCache()
                if cycle % 2 == 0:
                    pool = (0, first_pool + cycle)
                    torch._C._cuda_beginAllocateToPool(0, pool)
                    p = raw_alloc(rng.choice((MiB, 5 * MiB)))
                    torch._C._cuda_endAllocateToPool(0, pool)
                    raw_delete(p)
                    torch._C._cuda_releasePool(0, pool)

        def check(snap, held, where):
            trace = snap["device_traces"][0]
            self.assertTrue(trace, where)
            with self.subTest(where=where):
                self.check_pool_order(trace, held)
                self.tts.viewer_replay(snap, 0)
                for fn in (_memory_viz.segsum, _memory_viz.trace, _memory_viz.trace_plot,
                           _memory_viz.segment_plot):
                    self.assertIsInstance(fn(snap), str, fn.__name__)
                for fn in (_memory_viz.segments, _memory_viz.memory):
                    self.assertTrue(fn(snap, format_flamegraph=lines), fn.__name__)

        def held_before(snap):
            """The memory the pools held before the first entry: the final
            segments, the list's segment entries undone."""
            held = [(s["address"], s["address"] + s["total_size"]) for s in snap["segments"]]
            for e in reversed(snap["device_traces"][0]):
                a, n = e.get("addr"), e.get("size")
                if e["action"] in ("segment_alloc", "segment_map"):
                    held = [r for s, t in held for r in ((s, min(t, a)), (max(s, a + n), t))
                            if r[0] < r[1]]
                elif e["action"] in ("segment_free", "segment_unmap"):
                    held.append((a, a + n))
            return held

        across = []       # blocks live across a stop and a restart
        made_while_stopped = []  # (pool, its block): used after the restart
        trims = []
        for round, max_entries in enumerate((100000, 20000, 64, 50000, 100000)):
            record_history(max_entries=max_entries)
            at_start = [(s["address"], s["address"] + s["total_size"])
                        for s in torch.cuda.memory._snapshot()["segments"]]
            for pool, p in made_while_stopped:
                raw_delete(p)
                torch._C._cuda_beginAllocateToPool(0, pool)
                across.append(raw_alloc(2 * MiB))
                torch._C._cuda_endAllocateToPool(0, pool)
                torch._C._cuda_releasePool(0, pool)  # its other use
                torch._C._cuda_releasePool(0, pool)
            made_while_stopped = []
            work(10, 1000 + 100 * round)
            snap = torch.cuda.memory._snapshot()
            trimmed = len(snap["device_traces"][0]) == max_entries
            # A trimmed history starts after the restart, on the memory held then.
            held = held_before(snap) if trimmed else at_start
            check(snap, held, "round %d, recording" % round)
            record_history(False)
            stopped = torch.cuda.memory._snapshot()
            self.assertEqual(len(stopped["device_traces"][0]), len(snap["device_traces"][0]))
            check(stopped, held, "round %d, stopped" % round)
            trims.append(trimmed)
            # While stopped: nothing joins the history.
            work(6, 1000 + 100 * round + 50)
            pool = (0, 1000 + 100 * round + 99)
            torch._C._cuda_beginAllocateToPool(0, pool)
            made_while_stopped.append((pool, raw_alloc(3 * MiB)))
            torch._C._cuda_endAllocateToPool(0, pool)
            torch._C._cuda_emptyCache()
            self.assertEqual(torch.cuda.memory._snapshot()["device_traces"][0],
                             stopped["device_traces"][0])
        self.assertEqual(trims, [False, False, True, False, False])
        for pool, p in made_while_stopped:
            raw_delete(p)
            torch._C._cuda_releasePool(0, pool)
        for p in across:
            raw_delete(p)

    def test_skipped_actions_and_context_levels(self):
        record_history(skip="segment_alloc,free_completed")
        raw_delete(raw_alloc(3 * MiB))
        actions = [e["action"] for e in torch.cuda.memory._snapshot()["device_traces"][0]]
        # The pool is page-mapped: its first allocation maps pages, recorded before it.
        self.assertEqual(actions, ["segment_map", "alloc", "free_requested"])
        with self.assertRaises(AssertionError):
            record_history(skip="no_such_action")
        # A stop keeps the skipped actions out (PyTorch's stop call names none).
        record_history(False)
        record_history(skip="segment_map,segment_unmap")
        raw_delete(raw_alloc(40 * MiB))
        torch._C._cuda_emptyCache()
        record_history(False)
        actions = [e["action"] for e in torch.cuda.memory._snapshot()["device_traces"][0]]
        self.assertEqual(actions, ["alloc", "free_requested", "free_completed"])

    def test_user_metadata_of_the_history(self):
        # Torch 2.15: each thread's own, as under PyTorch's allocator (and said supported);
        # 2.11: the process's.
        record_history()
        torch._C._cuda_setMemoryMetadata("step=1")
        seen = []

        def other_thread():
            seen.append(torch._C._cuda_getMemoryMetadata())
            raw_delete(raw_alloc(MiB))

        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
        raw_delete(raw_alloc(2 * MiB))
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        allocs = {e["size"]: e["user_metadata"] for e in trace if e["action"] == "alloc"}
        other = "" if TORCH_2_15 else "step=1"
        self.assertEqual(seen, [other])
        self.assertEqual(allocs, {MiB: other, 2 * MiB: "step=1"})
        if TORCH_2_15:
            self.assertTrue(torch._C._cuda_memoryMetadataSupported())
        torch._C._cuda_setMemoryMetadata("")


@unittest.skipUnless(TORCH_2_15, "torch %s: these methods are torch 2.15's" % torch.__version__)
class Torch215Methods(Base):
    """What torch 2.15's interface has beside 2.11's (the rest is in the classes above)."""

    @classmethod
    def setUpClass(cls):
        import test_torch_snapshot
        cls.tts = test_torch_snapshot

    def test_annotate_memory(self):
        p = raw_alloc(MiB)
        torch._C._cuda_annotateMemory(p, "unseen")  # no history: nothing happens
        record_history()
        torch._C._cuda_annotateMemory(p, "packed")
        with self.assertRaisesRegex(RuntimeError, "Stowage: annotateMemory: no live allocation"):
            torch._C._cuda_annotateMemory(p + 256, "inside")
        record_history(skip="annotate")
        torch._C._cuda_annotateMemory(p, "skipped")
        snap = torch.cuda.memory._snapshot()
        notes = [e for e in snap["device_traces"][0] if e["action"] == "annotate"]
        self.assertEqual([(e["addr"], e["size"], e["user_metadata"], e["pool_id"])
                          for e in notes], [(p, MiB, "packed", (0, 0))])
        from torch.cuda import _memory_viz
        self.assertIn("# annotate", _memory_viz.trace(snap))
        # The pinned host allocator's settings: PyTorch's (unlimited: -1).
        self.assertEqual(snap["allocator_settings"]["max_round_threshold"], -1)
        self.assertEqual(snap["allocator_settings"]["max_cached_size"], -1)
        raw_delete(p)

    def test_the_context_of_a_live_block(self):
        p = raw_alloc(MiB)
        self.assertEqual(call("getContextForPointer", p), (0, "none"), "allocated before")
        self.assertIsNone(torch._C._cuda_allocationTraceback(p))
        self.assertEqual(call("recordHistoryWithContext")[0], 0)
        q = raw_alloc(MiB)
        self.assertEqual(call("getContextForPointer", q), (0, "context"))
        self.assertEqual(call("getContextForPointer", q + 256), (0, "none"), "not a block's start")
        raw_delete(q)
        self.assertEqual(call("getContextForPointer", q), (0, "none"), "freed")
        raw_delete(p)

    def test_no_allocation_is_rejected_ahead_of_the_device(self):
        set_fraction(ONE_GIB_FRACTION)
        self.assertEqual(call("attachOomRejectionObserver")[0], 0)
        with self.assertRaises(torch.OutOfMemoryError):
            raw_alloc(2 * GiB)
        self.assertEqual(call("rejections"), (0, "0"))
        s = stats()
        self.assertEqual((s["num_ooms"], s["num_oom_rejections"]), (1, 0))

    def test_allocate_with_address_takes_free_bytes_of_the_current_pool(self):
        # As PyTorch's allocator: from the free blocks of the pool the current
        # stream allocates from, here a capture's private pool (classic).
        pool = (0, 12)
        record_history()
        torch._C._cuda_beginAllocateToPool(0, pool)
        p = raw_alloc(8 * MiB)
        raw_delete(p)
        status, text = call("allocateWithAddress", p + 2 * MiB, 3 * MiB)
        self.assertEqual((status, text), (0, str(p + 2 * MiB)))
        self.assertTrue(torch._C._cuda_checkPoolLiveAllocations(0, pool, {p + 2 * MiB}))
        status, text = call("allocateWithAddress", p + 4 * MiB, MiB)
        self.assertNotEqual(status, 0)
        self.assertIn("Could not allocate CUDA storage at exact address", text)
        self.assertIn("private pool (0, 12) holds those bytes in no free block", text)
        torch._C._cuda_endAllocateToPool(0, pool)
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        self.assertEqual([(e["action"], e["addr"], e["size"], e["pool_id"]) for e in trace][-1],
                         ("alloc", p + 2 * MiB, 3 * MiB, pool))
        A.stow_torch_adapter_drop(63)  # the call's slot: its deleter frees the block
        self.assertTrue(torch._C._cuda_checkPoolLiveAllocations(0, pool, set()))
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        self.assertEqual(trace[-1]["action"], "free_completed")
        self.tts.viewer_replay(torch.cuda.memory._snapshot(), 0)
        record_history(False)
        torch._C._cuda_releasePool(0, pool)
        # The device pool is page-mapped here (the default where pages map).
        q = raw_alloc(4 * MiB)
        raw_delete(q)
        status, text = call("allocateWithAddress", q, MiB)
        self.assertNotEqual(status, 0)
        self.assertIn("the device pool is page-mapped", text)
        self.assertIn("STOWAGE_CONF=policy:classic", text)


class Refusals(Base):
    """Every method Stowage does not serve says what and why."""

    def test_unserved_methods_are_clear_errors(self):
        for method, words in (
                ("setNoSplit", "no_split"),
                ("shareIpcHandle", "CUDA IPC"),
                ("getIpcDevPtr", "CUDA IPC"),
                ("attachAllocatorTraceTracker", "TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK"),
                ("createOrIncrefPoolWithAllocator", "allocator of its own"),
                ("enablePeerAccess", "simulated device"),
                ("copy_data", "simulated device")):
            status, text = call(method, 0, 1)
            self.assertNotEqual(status, 0, method)
            self.assertIn("Stowage", text, method)
            self.assertIn(words, text, method)
        with self.assertRaisesRegex(RuntimeError, "cannot turn caching off"):
            torch._C._cuda_cudaCachingAllocator_enable(False)
        torch._C._cuda_cudaCachingAllocator_enable(True)

    def test_served_trivia(self):
        self.assertEqual(call("getExpandableSegmentSizes"), (0, "0"))
        self.assertEqual(call("enable", 1), (0, "enabled"))
        self.assertEqual(call("initialized"), (0, "0"), "CUDA never started here")


def run_enable(code, **env):
    e = dict(os.environ)
    e.pop("STOWAGE_BACKEND", None)
    e.update(env)
    r = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r)\n" %
                        os.path.join(ROOT, "python") + code], env=e, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
    return r.returncode, r.stdout


class Enable(unittest.TestCase):
    """stowage.torch.enable() in a fresh process (CUDA backend; no GPU is needed to install)."""

    def test_enable_installs_the_adapter(self):
        rc, out = run_enable(
            "import stowage.torch, torch\n"
            "a = stowage.torch.enable()\n"
            "print(stowage.torch.route(), type(a).__name__)\n"
            "print(torch._C._cuda_memoryStats(0)['allocated_bytes']['all']['current'])\n")
        self.assertEqual(rc, 0, out)
        self.assertIn("adapter _CUDAAllocator", out)

    def test_without_the_adapter_it_warns_and_takes_the_pluggable_route(self):
        rc, out = run_enable(
            "import warnings, stowage.torch, torch\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    stowage.torch.enable()\n"
            "print(stowage.torch.route())\n"
            "print([str(x.message) for x in w])\n",
            STOWAGE_TORCH_ADAPTER="/nonexistent/libstowage_torch.so")
        self.assertEqual(rc, 0, out)
        self.assertIn("pluggable", out)
        for words in ("cannot be loaded", "memory_stats", "cudnn.benchmark", "OutOfMemoryError",
                      "CUDA graphs", "_record_memory_history"):
            self.assertIn(words, out)

    def test_adapter_true_requires_it(self):
        rc, out = run_enable(
            "import stowage.torch, torch\n"
            "try:\n"
            "    stowage.torch.enable(adapter=True)\n"
            "except RuntimeError as e:\n"
            "    print('refused:', e)\n",
            STOWAGE_TORCH_ADAPTER="/nonexistent/libstowage_torch.so")
        self.assertEqual(rc, 0, out)
        self.assertIn("refused: stowage.torch.enable(adapter=True)", out)


if __name__ == "__main__":
    unittest.main()
