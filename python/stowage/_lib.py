"""Locating and binding libstowage.so with ctypes (no build step, no torch).

The library is searched, in order, at:
  1. $STOWAGE_LIB (a path to the .so), when set: an explicit choice overrides the rest;
  2. libstowage.so inside this package directory, which `pip install ./python`
     puts there (python/pyproject.toml), so an installed package needs no
     environment variable;
  3. <checkout>/build/libstowage.so when the package is a source checkout's
     python/stowage (the checkout's CMakeLists.txt is two levels up);
  4. the system loader path (ctypes.util.find_library("stowage")), e.g. after
     `cmake --install`.
"""

import ctypes
import ctypes.util
import os
import threading

_HERE = os.path.dirname(os.path.abspath(__file__))
_lock = threading.Lock()
_lib = None
_path = None


class LibraryNotFound(OSError):
    """libstowage.so could not be found or loaded."""


def _candidates():
    env = os.environ.get("STOWAGE_LIB")
    if env:
        yield env
        return
    yield os.path.join(_HERE, "libstowage.so")
    checkout = os.path.normpath(os.path.join(_HERE, "..", ".."))
    if os.path.isfile(os.path.join(checkout, "CMakeLists.txt")):
        yield os.path.join(checkout, "build", "libstowage.so")
    found = ctypes.util.find_library("stowage")
    if found:
        yield found


def _bind(lib):
    c = ctypes
    sig = {
        "stow_torch_malloc": (c.c_void_p, [c.c_ssize_t, c.c_int, c.c_void_p]),
        "stow_torch_free": (None, [c.c_void_p, c.c_ssize_t, c.c_int, c.c_void_p]),
        "stow_torch_empty_cache": (None, []),
        "stow_torch_record_stream": (None, [c.c_void_p, c.c_void_p]),
        "stow_torch_memory_fraction": (None, [c.c_double, c.c_int]),
        "stow_torch_pool": (c.c_void_p, [c.c_int]),
        "stow_torch_pool_init": (c.c_int, [c.c_int, c.c_char_p, c.c_size_t]),
        "stow_torch_stats_json": (c.c_size_t, [c.c_int, c.c_char_p, c.c_size_t]),
        "stow_torch_step": (c.c_int, [c.c_int, c.c_char_p]),
        "stow_torch_summary": (c.c_size_t, [c.c_int, c.c_char_p, c.c_size_t]),
        "stow_torch_reset_peak": (None, [c.c_int]),
        "stow_torch_reset_accumulated": (None, [c.c_int]),
        "stow_torch_last_error": (c.c_size_t, [c.c_int, c.c_char_p, c.c_size_t]),
        "stow_torch_backend_name": (c.c_char_p, []),
        "stow_torch_shutdown": (None, []),
        "stow_cuda_probe": (c.c_int, [c.c_char_p, c.c_size_t]),
        "stow_cuda_device_count": (c.c_int, []),
        "stow_config_default": (None, [c.c_void_p]),
        "stow_config_parse": (c.c_int, [c.c_void_p, c.c_char_p, c.c_char_p, c.c_size_t]),
        "stow_strerror": (c.c_char_p, [c.c_int]),
        "stow_version": (c.c_uint, []),
        # raw pool API, for callers holding stow_torch_pool(device)
        "stow_pool_oom_message": (c.c_size_t, [c.c_void_p, c.c_char_p, c.c_size_t]),
        "stow_summary": (c.c_size_t, [c.c_void_p, c.c_char_p, c.c_size_t]),
        "stow_empty_cache": (c.c_int, [c.c_void_p]),
        "stow_stats_reset_peak": (None, [c.c_void_p]),
    }
    for name, (restype, argtypes) in sig.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def load():
    """The loaded library (ctypes.CDLL), loading it on first use."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for cand in _candidates():
            if os.path.sep in cand and not os.path.exists(cand):
                tried.append(cand + " (missing)")
                continue
            try:
                lib = ctypes.CDLL(cand)
            except OSError as e:
                tried.append("%s (%s)" % (cand, e))
                continue
            try:
                _bind(lib)
            except AttributeError as e:
                tried.append("%s (not a Stowage library with torch entry points: %s)" % (cand, e))
                continue
            _path = os.path.realpath(cand) if os.path.exists(cand) else cand
            _lib = lib
            return _lib
        raise LibraryNotFound(
            "libstowage.so not found; install the package (pip install ./python), build it "
            "(cmake --build build --target stowage) or set STOWAGE_LIB. Tried: " + "; ".join(tried or ["nothing"]))


def path():
    """Absolute path of the loaded library (what PyTorch must dlopen too)."""
    load()
    return _path


def call_text(fn, *args):
    """Calls an snprintf-style function (..., buf, len) -> full length, and returns str."""
    size = 1 << 14
    while True:
        buf = ctypes.create_string_buffer(size)
        n = fn(*args, buf, size)
        if n < size:
            return buf.value.decode("utf-8", "replace")
        size = n + 1


def strerror(status):
    return load().stow_strerror(status).decode()
