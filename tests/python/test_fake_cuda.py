"""The PyTorch entry points of libstowage.so on the CUDA backend, without a GPU.

tests/support/fake_cuda.c, built as build/fake_cuda/libcuda.so.1, emulates the
CUDA driver on the host and counts every call that breaks a rule of the driver
API. Each test runs a child Python process with that folder on LD_LIBRARY_PATH
(the loader reads it only at process start), so that libstowage.so's
dlopen("libcuda.so.1") finds the emulation, and drives stow_torch_malloc /
stow_torch_free / stow_torch_record_stream / stow_torch_empty_cache as PyTorch
would, with data written and read back through the driver, under the classic
and the page-mapped policy. The child ends by checking that the driver saw no
violation and holds no memory.

STOWAGE_FAKE_CUDA_DIR names the folder (ctest sets it; default build/fake_cuda).
Skipped when it has no libcuda.so.1 (a library-only build).
"""

import os
import subprocess
import sys
import unittest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FAKE_DIR = os.environ.get("STOWAGE_FAKE_CUDA_DIR") or os.path.join(ROOT, "build", "fake_cuda")

CHILD = r"""
import ctypes, json, os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "python"))
import stowage, stowage._lib

MiB = 1 << 20
lib = stowage._lib.load()
assert stowage.backend_name() == "cuda", stowage.backend_name()
ok, why = stowage.cuda_probe()
assert ok, why
drv = ctypes.CDLL("libcuda.so.1")  # the instance libstowage.so loaded
assert hasattr(drv, "fake_cuda_violations"), "not the emulated driver"
drv.fake_cuda_violations.restype = ctypes.c_uint64
drv.fake_cuda_used_bytes.restype = ctypes.c_uint64
drv.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
drv.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
drv.cuStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
drv.cuStreamDestroy_v2.argtypes = [ctypes.c_void_p]
drv.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
drv.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t,
                                     ctypes.c_void_p]

def check_driver(when):
    v = drv.fake_cuda_violations()
    assert v == 0, "%s: %d driver API violations (see stderr)" % (when, v)

def roundtrip(ptr, n, seed):
    data = bytes((i * 131 + seed) & 0xFF for i in range(n))
    back = ctypes.create_string_buffer(n)
    # The calling thread got the primary context from the backend's first call.
    assert drv.cuMemcpyHtoD_v2(ptr, data, n) == 0
    assert drv.cuMemcpyDtoH_v2(back, ptr, n) == 0
    assert back.raw == data, "device memory at %#x did not read back" % ptr

sizes = [1, 512, 4096, 100 * 1024, MiB, 3 * MiB + 17, 64 * MiB]
ptrs = []
for i, n in enumerate(sizes):
    p = lib.stow_torch_malloc(n, 0, None)
    assert p, "stow_torch_malloc(%d) returned NULL: %s" % (n, stowage.last_error(0))
    assert p % 512 == 0
    roundtrip(p, min(n, 4096), i)
    ptrs.append((p, n))
for i, (p, n) in enumerate(ptrs):
    roundtrip(p, min(n, 4096), i + 50)  # no two blocks overlap at their starts
    roundtrip(p + n - min(n, 4096), min(n, 4096), i + 90)  # nor at their ends
s = stowage.memory_stats(0)
assert s["allocated_bytes.all.current"] >= sum(sizes), s["allocated_bytes.all.current"]
assert s["reserved_bytes.all.current"] >= s["allocated_bytes.all.current"]
assert s["reserved_bytes.all.current"] == drv.fake_cuda_used_bytes(), (
    s["reserved_bytes.all.current"], drv.fake_cuda_used_bytes())

# A block used on a second stream and freed from the first: its memory is not
# reused before that stream's work (emulated with a lag) is done.
side = ctypes.c_void_p()
assert drv.cuStreamCreate(ctypes.byref(side), 1) == 0
for _ in range(20):
    p = lib.stow_torch_malloc(8 * MiB, 0, None)
    assert p
    assert drv.cuMemcpyHtoDAsync_v2(p, b"x" * 4096, 4096, side) == 0
    lib.stow_torch_record_stream(p, side)
    lib.stow_torch_free(p, 8 * MiB, 0, None)
assert drv.cuStreamSynchronize(side) == 0
s = stowage.memory_stats(0)
assert s["num_event_records"] >= 20, s["num_event_records"]
if "classic" in os.environ.get("STOWAGE_CONF", ""):
    assert s["num_map_calls"] == 0
else:  # page-mapped (the default where the driver maps pages): the driver maps
    assert s["num_map_calls"] > 0, s["num_map_calls"]

# Out of memory: NULL back (PyTorch raises its own error), counted, explained.
big = lib.stow_torch_malloc(4096 * MiB, 0, None)
assert not big, "4 GiB on a 1 GiB device"
s = stowage.memory_stats(0)
assert s["num_ooms"] == 1, s["num_ooms"]
assert "out of memory" in stowage.last_error(0), stowage.last_error(0)

if os.environ.get("FAKE_CUDA_DEVICES") == "2":
    # PyTorch names the device with every request: device 1 gets a pool of its own.
    a0 = stowage.memory_allocated(0)
    q = lib.stow_torch_malloc(3 * MiB, 1, None)
    assert q, stowage.last_error(1)
    roundtrip(q, 4096, 7)
    assert stowage.memory_allocated(1) >= 3 * MiB
    assert stowage.memory_allocated(0) == a0
    lib.stow_torch_free(q, 3 * MiB, 1, None)
    assert stowage.memory_allocated(1) == 0

for p, n in ptrs:
    lib.stow_torch_free(p, n, 0, None)
assert stowage.memory_allocated(0) == 0
stowage.empty_cache()
assert stowage.memory_reserved(0) == 0, stowage.memory_reserved(0)
check_driver("after empty_cache")
assert drv.fake_cuda_used_bytes() == 0, drv.fake_cuda_used_bytes()
assert drv.cuStreamDestroy_v2(side) == 0
lib.stow_torch_shutdown()
check_driver("after shutdown")
print("OK", stowage.memory_stats(0).get("reserved_bytes.all.peak"))
"""


@unittest.skipUnless(os.path.exists(os.path.join(FAKE_DIR, "libcuda.so.1")),
                     "no emulated driver in %s (build the tests first)" % FAKE_DIR)
class FakeCudaTorchEntry(unittest.TestCase):
    def run_child(self, conf, devices=1):
        env = dict(os.environ)
        env["FAKE_CUDA_DEVICES"] = str(devices)
        env.pop("STOWAGE_BACKEND", None)
        env["STOWAGE_CONF"] = conf
        env["LD_LIBRARY_PATH"] = FAKE_DIR + (
            ":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        env["FAKE_CUDA_TOTAL_MB"] = "1024"
        r = subprocess.run([sys.executable, "-c", CHILD, ROOT], env=env, capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(r.returncode, 0, "child failed (conf %r):\n%s%s" % (conf, r.stdout,
                                                                            r.stderr))
        self.assertIn("OK", r.stdout)
        self.assertNotIn("violation", r.stderr)
        return r

    def test_default_policy(self):
        self.run_child("")

    def test_classic_policy(self):
        self.run_child("policy:classic")

    def test_page_mapped_policy(self):
        self.run_child("policy:vmm")

    def test_expandable_segments_spelling(self):
        self.run_child("expandable_segments:True")

    def test_two_devices(self):
        self.run_child("policy:vmm", devices=2)


if __name__ == "__main__":
    unittest.main()
