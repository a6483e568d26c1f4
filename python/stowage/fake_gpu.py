"""The target cards of `stowage predict` and the emulated CUDA device that answers for them.

A card is what a model's code and PyTorch's C++ side ask about the device: its name, compute
capability, multiprocessor count, memory, shared memory per block. fake_cuda.c, built here once
into libcuda.so.1, answers those CUDA runtime and driver calls for one device; it is loaded into
the process before PyTorch so that its functions take the place of libcudart's. Then
torch.cuda.is_available() is true, torch.cuda.get_device_properties() is the card's, the
autograd engine runs backward on its device thread as on a GPU, and every choice PyTorch makes
on the device (attention backend, cuBLAS workspace size) is the card's.

Figures per card (PyTorch 2.11, CUDA 13): see docs/predict.md, "Cards". The CUDA context is not
reserved memory: it is kept apart (context_bytes) for the fit test of `predict --capacity`.

Only the standard library is used; importing this module never imports torch.
"""

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

MiB = 1 << 20


class Card:
    """One target card: what its driver reports, and what PyTorch derives from it."""

    def __init__(self, key, name, major, minor, sm_count, total_mib, l2_mib, smem_optin,
                 smem_per_sm, bus_width_bits, context_mib):
        self.key = key                      # the --gpu name
        self.name = name                    # torch.cuda.get_device_name()
        self.major, self.minor = major, minor
        self.sm_count = sm_count
        self.total_bytes = total_mib * MiB  # torch.cuda.get_device_properties().total_memory
        self.l2_bytes = l2_mib * MiB
        self.smem_optin = smem_optin        # bytes of shared memory per block, opted in
        self.smem_per_sm = smem_per_sm
        self.bus_width_bits = bus_width_bits
        self.context_bytes = context_mib * MiB  # CUDA context and kernels: outside the allocator

    @property
    def capability(self):
        return (self.major, self.minor)

    def cublas_workspace_bytes(self, environ=None):
        """Bytes of one cuBLAS workspace (one per handle and stream): CUBLAS_WORKSPACE_CONFIG's
        ':SIZE_KIB:COUNT' pairs summed, else 32 MiB on sm90 and 4096 KiB x 2 + 16 KiB x 8
        elsewhere (CublasHandlePool.cpp, parseChosenWorkspaceSize, PyTorch 2.11)."""
        env = os.environ if environ is None else environ
        conf = env.get("CUBLAS_WORKSPACE_CONFIG")
        if conf:
            parts = conf.split(":")
            try:
                if parts[0] == "" and len(parts) % 2 == 1 and len(parts) > 1:
                    return sum(int(parts[i]) * 1024 * int(parts[i + 1])
                               for i in range(1, len(parts), 2))
            except ValueError:
                pass
        if (self.major, self.minor) == (9, 0):
            return 4096 * 1024 * 8
        return 4096 * 1024 * 2 + 16 * 1024 * 8

    def cublaslt_workspace_bytes(self, environ=None):
        """Bytes of one cuBLASLt workspace: CUBLASLT_WORKSPACE_SIZE KiB, default 1024 KiB."""
        env = os.environ if environ is None else environ
        try:
            return int(env.get("CUBLASLT_WORKSPACE_SIZE", "1024")) * 1024
        except ValueError:
            return 1024 * 1024

    def describe(self):
        return "%s (sm%d%d, %d SMs, %.1f GiB)" % (self.name, self.major, self.minor,
                                                  self.sm_count, self.total_bytes / (1 << 30))


# Board memory as nvidia-smi reports it; the context figure is an estimate of what a PyTorch
# process holds outside the caching allocator with lazy module loading (docs/predict.md).
CARDS = {c.key: c for c in [
    Card("H100", "NVIDIA H100 80GB HBM3", 9, 0, 132, 81559, 50, 232448, 233472, 5120, 512),
    Card("H200", "NVIDIA H200", 9, 0, 132, 143771, 60, 232448, 233472, 6144, 512),
    Card("A100-80GB", "NVIDIA A100-SXM4-80GB", 8, 0, 108, 81920, 40, 166912, 167936, 5120, 512),
    Card("A100-40GB", "NVIDIA A100-SXM4-40GB", 8, 0, 108, 40960, 40, 166912, 167936, 5120, 512),
]}
DEFAULT_CARD = "H100"


def card(name=None):
    """The Card for a --gpu name (case and '-'/'_' ignored; 'A100' is the 80 GB one)."""
    if isinstance(name, Card):
        return name
    key = (name or DEFAULT_CARD).upper().replace("_", "-")
    aliases = {"A100": "A100-80GB", "A100-80G": "A100-80GB", "A100-40G": "A100-40GB",
               "H100-80GB": "H100", "H200-141GB": "H200"}
    key = aliases.get(key, key)
    if key not in CARDS:
        raise ValueError("unknown GPU %r: one of %s" % (name, ", ".join(CARDS)))
    return CARDS[key]


# ---- the emulated device library ----

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_cuda.c")
_loaded = None  # the ctypes handle once loaded in this process


class FakeCudaError(RuntimeError):
    """The emulated device cannot be built or loaded here."""


def _cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "stowage", "fake_cuda")


def library_path():
    """Path of libcuda.so.1 built from fake_cuda.c (compiled once per source, cached under
    ~/.cache/stowage/fake_cuda; STOWAGE_FAKE_CUDA_LIB names a prebuilt one)."""
    given = os.environ.get("STOWAGE_FAKE_CUDA_LIB")
    if given:
        if not os.path.isfile(given):
            raise FakeCudaError("STOWAGE_FAKE_CUDA_LIB=%s: no such file" % given)
        return given
    with open(_SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    out_dir = os.path.join(_cache_dir(), digest)
    out = os.path.join(out_dir, "libcuda.so.1")
    if os.path.isfile(out):
        return out
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise FakeCudaError("stowage predict builds its emulated CUDA device from fake_cuda.c "
                            "once and needs a C compiler for it (set CC, or install gcc)")
    os.makedirs(out_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_dir, suffix=".so")
    os.close(fd)
    cmd = [cc, "-shared", "-fPIC", "-O2", "-Wl,-soname,libcuda.so.1", "-o", tmp, _SOURCE, "-ldl"]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        os.unlink(tmp)
        raise FakeCudaError("building the emulated CUDA device failed: %s\n%s"
                            % (" ".join(cmd), r.stdout.decode(errors="replace")))
    os.replace(tmp, out)  # atomic: a concurrent build of the same source is harmless
    return out


def _mapped(path):
    """Whether the shared object at path is mapped into this process."""
    real = os.path.realpath(path)
    try:
        with open("/proc/self/maps") as f:
            return any(line.rstrip().endswith(real) for line in f)
    except OSError:
        return False


def load(target):
    """Loads the emulated device into this process, configured as the Card target. It must come
    before PyTorch asks about CUDA: before `import torch`, or through LD_PRELOAD (what
    `stowage predict` does for its child process)."""
    global _loaded
    target = card(target)
    if _loaded is None:
        path = library_path()
        torch = sys.modules.get("torch")
        if torch is not None and not _mapped(path):
            raise FakeCudaError(
                "torch was imported before the recorder: its CUDA runtime is bound and found no "
                "device. Import stowage.predict (or call stowage.predict.record) before torch, "
                "or run the script with `python -m stowage predict SCRIPT`")
        _loaded = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
        _loaded.stow_fake_cuda_configure.argtypes = [
            ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_ulonglong,
            ctypes.c_ulonglong, ctypes.c_int, ctypes.c_ulonglong, ctypes.c_ulonglong, ctypes.c_int]
        _loaded.stow_fake_cuda_refused_calls.restype = ctypes.c_ulonglong
    _loaded.stow_fake_cuda_configure(target.name.encode(), target.major, target.minor,
                                     target.sm_count, target.total_bytes, target.context_bytes,
                                     target.l2_bytes, target.smem_optin, target.smem_per_sm,
                                     target.bus_width_bits)
    return _loaded


def refused_calls():
    """Calls that tried to allocate or copy real device memory on the emulated device."""
    return int(_loaded.stow_fake_cuda_refused_calls()) if _loaded is not None else 0
