"""Installing Stowage as PyTorch's CUDA allocator (docs/torch.md).

    import stowage.torch
    stowage.torch.enable("max_split_size_mb:256")   # before the first CUDA tensor
    ...
    print(stowage.torch.memory_summary())

Only enable() imports torch. The statistics functions are re-exported from the
stowage package: with a pluggable allocator, torch.cuda.memory_stats() and
friends raise, so use these instead.
"""

import ctypes
import os

from . import _lib
from . import (  # noqa: F401  (re-exported)
    backend_name, dump_trace, empty_cache, last_error, library_path, max_memory_allocated,
    max_memory_reserved, memory_allocated, memory_reserved, memory_stats, memory_summary,
    reset_accumulated_memory_stats, reset_peak_memory_stats, validate_conf)

_installed = None  # keeps the CUDAPluggableAllocator alive once installed

# PyTorch hook setter -> exported C function
_HOOKS = (
    ("set_reset_fn", "stow_torch_empty_cache"),
    ("set_record_stream_fn", "stow_torch_record_stream"),
    ("set_memory_fraction_fn", "stow_torch_memory_fraction"),
)


def _fn_address(lib, name):
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def enabled():
    """Whether enable() installed Stowage in this process."""
    return _installed is not None


def enable(conf=None):
    """Makes PyTorch allocate CUDA memory through Stowage.

    conf: optional STOWAGE_CONF string (PYTORCH_CUDA_ALLOC_CONF syntax, e.g.
    "max_split_size_mb:256,garbage_collection_threshold:0.8"); it is validated
    first and exported as STOWAGE_CONF for the pools, which are created at each
    device's first allocation.

    Must run before CUDA is initialised (before the first CUDA tensor or
    torch.cuda call that creates a context): PyTorch cannot swap an allocator
    that is in use. Wires empty_cache, record_stream and
    set_per_process_memory_fraction to Stowage. Returns the
    torch.cuda.memory.CUDAPluggableAllocator. Calling it again is a no-op.
    Raises RuntimeError (CUDA already initialised, simulated backend selected),
    ValueError (bad conf), ImportError (no torch), LibraryNotFound.
    """
    global _installed
    if _installed is not None:
        return _installed
    if conf is not None:
        validate_conf(conf)
    lib = _lib.load()
    if backend_name() != "cuda":
        raise RuntimeError(
            "stowage.torch.enable: STOWAGE_BACKEND=%s selects a simulated device whose addresses "
            "are not real GPU memory; unset it to use Stowage with PyTorch" % backend_name())
    import torch  # only here: importing stowage must not import torch

    if torch.cuda.is_initialized():
        raise RuntimeError(
            "stowage.torch.enable() must be called before CUDA is initialised: PyTorch cannot "
            "swap an allocator that already served memory. Call it at the top of the program, "
            "before creating any CUDA tensor (or anything that calls torch.cuda.init()).")
    if conf is not None:
        os.environ["STOWAGE_CONF"] = conf

    plug = torch.cuda.memory.CUDAPluggableAllocator(
        _lib.path(), "stow_torch_malloc", "stow_torch_free")
    inner = plug.allocator()
    missing = []
    for setter, cname in _HOOKS:
        fn = getattr(inner, setter, None)
        if fn is None:
            missing.append(setter)
            continue
        fn(_fn_address(lib, cname))
    torch.cuda.memory.change_current_allocator(plug)
    if missing:
        import warnings
        warnings.warn("stowage.torch.enable: this PyTorch lacks %s; those features fall back "
                      "to no-ops" % ", ".join(missing), RuntimeWarning, stacklevel=2)
    _installed = plug
    return plug


# ---- step markers and planned steps (docs/planned.md) ----

import contextlib as _contextlib  # noqa: E402  (kept with the functions that use it)


def step(key="train", device=None):
    """Marks the beginning of a step with this key on the device's pool (the
    step in progress ends): call it at the top of each training iteration.
    key is 1-64 characters of [A-Za-z0-9_.:/-] (ValueError otherwise); None
    ends the step in progress. With planned_steps:true in the configuration
    the pool records a few steps of the key, plans them, and serves the later
    ones from a planned arena (docs/planned.md); otherwise the marker is only
    recorded (stowage.record). Before the device's first allocation there is
    no pool yet and the marker is ignored."""
    from . import _device_index

    _step(_device_index(device), key)


def _step(device, key):
    st = _lib.load().stow_torch_step(device, None if key is None else str(key).encode())
    if st != 0:
        raise ValueError("stowage.torch.step(%r): %s (a key is 1-64 characters of "
                         "[A-Za-z0-9_.:/-])" % (key, _lib.strerror(st)))


@_contextlib.contextmanager
def planned(key, device=None):
    """A step with this key around a block of code, ended when the block is
    left (also by an exception): for an inference call,

        with stowage.torch.planned("resnet50-bs64"):
            out = model(x)

    With planned_steps:true, the first call is recorded and planned, and the
    later ones are served from the pool's planned arena; the tensors that
    outlive the block (the output) come from the pool as usual."""
    from . import _device_index

    d = _device_index(device)
    _step(d, key)
    try:
        yield
    finally:
        _step(d, None)
