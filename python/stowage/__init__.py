"""Stowage: a caching GPU allocator with built-in accounting (Python side).

Pure Python over ctypes; importing it never imports torch. The statistics
functions mirror torch.cuda's (same names, same keys) and read Stowage's own
per-device pools, which is what PyTorch's pluggable-allocator path cannot do
(its memory_stats raises). To make PyTorch allocate through Stowage, call
stowage.torch.enable() before the first CUDA tensor; see docs/torch.md.
"""

import json
import sys

from . import _lib
from ._lib import LibraryNotFound

__all__ = [
    "LibraryNotFound", "library_path", "version", "backend_name", "cuda_probe",
    "validate_conf", "memory_stats", "memory_allocated", "max_memory_allocated",
    "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats",
    "reset_accumulated_memory_stats", "memory_summary", "empty_cache", "dump_trace",
    "record", "set_tag",
    "last_error",
]


def library_path():
    """Absolute path of the libstowage.so in use."""
    return _lib.path()


def version():
    """The library's version as a (major, minor, patch) tuple."""
    v = _lib.load().stow_version()
    return (v >> 16, (v >> 8) & 0xFF, v & 0xFF)


def backend_name():
    """'cuda', or 'sim' when STOWAGE_BACKEND=sim (pools on a simulated device)."""
    return _lib.load().stow_torch_backend_name().decode()


def cuda_probe():
    """(ok, reason): whether the CUDA driver loads and has a device, and why not."""
    import ctypes
    buf = ctypes.create_string_buffer(512)
    rc = _lib.load().stow_cuda_probe(buf, len(buf))
    return rc == 0, buf.value.decode("utf-8", "replace")


def validate_conf(conf):
    """Checks a STOWAGE_CONF string (PYTORCH_CUDA_ALLOC_CONF syntax); ValueError if bad."""
    import ctypes
    lib = _lib.load()
    cfg = ctypes.create_string_buffer(4096)  # larger than stow_config_t
    err = ctypes.create_string_buffer(512)
    lib.stow_config_default(cfg)
    st = lib.stow_config_parse(cfg, conf.encode(), err, len(err))
    if st != 0:
        raise ValueError("invalid Stowage configuration %r: %s" % (conf, err.value.decode()))


def _device_index(device):
    """int, 'cuda:N', torch.device or None (the current device if torch is
    loaded and CUDA initialised, else 0)."""
    if device is None:
        torch = sys.modules.get("torch")
        try:
            if torch is not None and torch.cuda.is_initialized():
                return int(torch.cuda.current_device())
        except Exception:
            pass
        return 0
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        _, _, idx = device.partition(":")
        return int(idx) if idx else _device_index(None)
    idx = getattr(device, "index", None)
    return _device_index(None) if idx is None else int(idx)


def memory_stats(device=None):
    """A dict with torch.cuda.memory_stats()'s keys ('allocated_bytes.all.current',
    'reserved_bytes.all.peak', 'num_alloc_retries', 'num_ooms', ...) plus
    Stowage's own (fragmentation, waste at peak, size classes...). All zero
    before the device's first allocation."""
    d = _device_index(device)
    text = _lib.call_text(_lib.load().stow_torch_stats_json, d)
    return json.loads(text)


def memory_allocated(device=None):
    return int(memory_stats(device).get("allocated_bytes.all.current", 0))


def max_memory_allocated(device=None):
    return int(memory_stats(device).get("allocated_bytes.all.peak", 0))


def memory_reserved(device=None):
    return int(memory_stats(device).get("reserved_bytes.all.current", 0))


def max_memory_reserved(device=None):
    return int(memory_stats(device).get("reserved_bytes.all.peak", 0))


def reset_peak_memory_stats(device=None):
    """Sets every peak to its current value."""
    _lib.load().stow_torch_reset_peak(_device_index(device))


def reset_accumulated_memory_stats(device=None):
    _lib.load().stow_torch_reset_accumulated(_device_index(device))


def memory_summary(device=None, abbreviated=False):
    """A text table in the spirit of torch.cuda.memory_summary()."""
    del abbreviated  # accepted for signature compatibility
    return _lib.call_text(_lib.load().stow_torch_summary, _device_index(device))


def empty_cache():
    """Returns every pool's idle cached segments to the device."""
    _lib.load().stow_torch_empty_cache()


def last_error(device=None):
    """The explanation of the device's last out-of-memory or pool-creation failure."""
    return _lib.call_text(_lib.load().stow_torch_last_error, _device_index(device))


def record(events=1000000, device=None, lines=True):
    """Starts recording the device's allocations, frees, segment and mapping
    events into a ring of `events` entries (32 bytes each; the oldest are
    overwritten); events=0 stops. Or set record_events:N in STOWAGE_CONF.

    lines=True also tags each allocation PyTorch makes through Stowage (the
    global swap, stowage.torch.enable) with the user's own line that made it,
    by the rule of stowage/stack_tags.py ('train.py:42 forward', with ' via '
    the innermost library line in between): dump_trace writes it to PATH.tags,
    and `stowage report` lists it in its sources of the peak. It costs a few
    microseconds per allocation (docs/report.md). Allocations of a thread with
    no Python frame, such as autograd's backward threads, get '<backward> NODE'
    or '<no Python frame>'. The line hook serves every device; lines=False, or
    events=0, removes it, and allocations then carry only the thread's tag
    (set_tag)."""
    import ctypes
    from . import _sites
    fn = _lib.load().stow_torch_record
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_size_t]
    st = fn(_device_index(device), int(events))
    if st != 0:
        raise OSError("stowage.record(%d): %s (the device's pool is created by its first "
                      "allocation)" % (events, _lib.strerror(st)))
    _sites.install(bool(lines) and int(events) > 0)


def set_tag(name):
    """Tags every allocation the calling thread makes from now on (e.g.
    "weights", "activations", "optimizer", "kv_cache"); None clears it. The
    pool keeps allocated bytes per tag, and dump_trace writes PATH.tags (an
    allocation with a line from record(lines=True) is written with its line).
    A name of 32 bytes or more, with a line break or a leading blank is a
    ValueError."""
    import ctypes
    fn = _lib.load().stow_tag_set
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    st = fn(None if name is None else str(name).encode(), None)
    if st != 0:
        raise ValueError("stowage.set_tag(%r): %s" % (name, _lib.strerror(st)))


def dump_trace(path, device=None):
    """Writes the device's recorded allocation trace (.rep, and PATH.tags when
    allocations were tagged) to path; see record(). The file is what
    `stowage replay`, `report` and `diff` read."""
    import ctypes
    fn = _lib.load().stow_torch_dump_trace
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p]
    st = fn(_device_index(device), str(path).encode())
    if st != 0:
        raise OSError("stowage.dump_trace(%r): %s (is recording on? see stowage.record)"
                      % (path, _lib.strerror(st)))
