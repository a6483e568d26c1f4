"""Stowage under PyTorch, by two routes (docs/torch.md).

The global swap: Stowage serves every CUDA tensor.

    import stowage.torch
    stowage.torch.enable("per_process_memory_fraction:0.9")   # before the first CUDA tensor
    ...
    print(stowage.torch.memory_summary())

enable() installs the C++ adapter (libstowage_torch.so, built against the
installed torch at pip install time), which implements PyTorch's whole CUDA
allocator interface: torch.cuda.memory_stats, cudnn.benchmark, CUDA graphs,
torch.cuda.MemPool, torch.OutOfMemoryError and memory snapshots work as
under PyTorch's own allocator. Without the adapter it falls back to
CUDAPluggableAllocator, with a warning naming what does not work there.

The MemPool route: PyTorch's allocator stays in charge and takes whole
segments from Stowage inside a scope (and for CUDA graphs captured into it).

    pool = stowage.torch.mem_pool("policy:vmm")
    with torch.cuda.use_mem_pool(pool):
        ...

Only enable(), mem_pool() and explain_oom import torch. The statistics
functions are re-exported from the stowage package (Stowage's own figures;
under the pluggable route torch.cuda.memory_stats() and friends raise).
memory_snapshot() and dump_snapshot() give what torch.cuda.memory._snapshot()
gives, for Stowage's pools; oom_report() and explain_oom() explain an
out-of-memory.
"""

import ctypes
import os

from . import _lib
from . import (  # noqa: F401  (re-exported)
    backend_name, dump_trace, empty_cache, last_error, library_path, max_memory_allocated,
    max_memory_reserved, memory_allocated, memory_reserved, memory_stats, memory_summary,
    reset_accumulated_memory_stats, reset_peak_memory_stats, validate_conf)

_installed = None  # keeps the installed allocator object alive
_route = None      # "adapter" or "pluggable" once enable() installed Stowage
_adapter = None    # the adapter library (ctypes.CDLL) once installed

ADAPTER_NAME = "libstowage_torch.so"

# What the pluggable route (CUDAPluggableAllocator) does not serve; enable()
# names these when it has to take that route.
PLUGGABLE_GAPS = (
    "torch.cuda.memory_stats/memory_allocated/max_memory_allocated/memory_reserved/"
    "reset_peak_memory_stats/memory_summary raise (use stowage.memory_stats())",
    "torch.backends.cudnn.benchmark=True raises (cacheInfo)",
    "CUDA graphs, torch.cuda.MemPool and torch.compile(mode='reduce-overhead') are refused",
    "an out-of-memory gives PyTorch a null pointer, not torch.OutOfMemoryError "
    "(wrap the code in stowage.torch.explain_oom())",
    "torch.cuda.memory._record_memory_history/_snapshot raise "
    "(use stowage.torch.memory_snapshot())",
    "CUDA IPC of tensors is refused",
)

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


def route():
    """How enable() installed Stowage: "adapter" (PyTorch's whole allocator
    interface), "pluggable" (CUDAPluggableAllocator), or None (not enabled)."""
    return _route


def adapter_path():
    """The adapter library enable() would load: $STOWAGE_TORCH_ADAPTER when
    set, else libstowage_torch.so beside the loaded libstowage.so, in this
    package, or in a checkout's build/; None when there is none."""
    env = os.environ.get("STOWAGE_TORCH_ADAPTER")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    dirs = [os.path.dirname(_lib.path()), here]
    checkout = os.path.normpath(os.path.join(here, "..", ".."))
    if os.path.isfile(os.path.join(checkout, "CMakeLists.txt")):
        dirs.append(os.path.join(checkout, "build"))
    for d in dirs:
        cand = os.path.join(d, ADAPTER_NAME)
        if os.path.isfile(cand):
            return cand
    return None


def _bind_adapter(lib):
    c = ctypes
    lib.stow_torch_adapter_torch_version.restype = c.c_char_p
    lib.stow_torch_adapter_torch_version.argtypes = []
    lib.stow_torch_adapter_install.restype = c.c_int
    lib.stow_torch_adapter_install.argtypes = [c.c_char_p, c.c_char_p, c.c_size_t]
    lib.stow_torch_adapter_installed.restype = c.c_int
    lib.stow_torch_adapter_installed.argtypes = []
    return lib


def _load_adapter():
    """(ctypes.CDLL of the adapter, None), or (None, the reason there is none)."""
    path = adapter_path()
    if path is None:
        return None, ("no %s was built (pip install --no-build-isolation ./python builds it "
                      "when torch is importable)" % ADAPTER_NAME)
    try:
        return _bind_adapter(ctypes.CDLL(path)), None
    except OSError as e:
        return None, "%s cannot be loaded (%s); rebuild it against this torch" % (path, e)
    except AttributeError as e:
        return None, "%s is not a Stowage adapter (%s)" % (path, e)


def _install_adapter(torch):
    """Makes the adapter PyTorch's CUDA allocator. Returns None when it did,
    else the reason (a torch version it was not built for, no adapter, CUDA
    already initialised). Call it after stowage._lib.load() and import torch."""
    global _adapter
    version = getattr(torch, "__version__", None)
    if not isinstance(version, str):
        return "the torch module has no __version__ to check the adapter against"
    lib, why = _load_adapter()
    if lib is None:
        return why
    buf = ctypes.create_string_buffer(2048)
    st = lib.stow_torch_adapter_install(version.encode(), buf, len(buf))
    if st != 0:
        return buf.value.decode("utf-8", "replace") or _lib.strerror(st)
    _adapter = lib
    return None


def enable(conf=None, adapter=None):
    """Makes PyTorch allocate CUDA memory through Stowage.

    conf: optional STOWAGE_CONF string (PYTORCH_CUDA_ALLOC_CONF syntax, e.g.
    "max_split_size_mb:256,garbage_collection_threshold:0.8"); it is validated
    first and exported as STOWAGE_CONF for the pools, which are created at each
    device's first allocation.

    Must run before CUDA is initialised (before the first CUDA tensor or
    torch.cuda call that creates a context): PyTorch cannot swap an allocator
    that is in use.

    adapter: None (default) installs the C++ adapter when it was built for
    this torch (route() == "adapter": PyTorch's whole allocator interface, so
    torch.cuda.memory_stats, cudnn.benchmark, CUDA graphs, MemPool,
    torch.OutOfMemoryError and memory snapshots work), else warns
    (RuntimeWarning naming what will not work, PLUGGABLE_GAPS) and takes the
    pluggable route; True requires the adapter (RuntimeError without it);
    False takes the pluggable route (route() == "pluggable":
    CUDAPluggableAllocator with empty_cache, record_stream and
    set_per_process_memory_fraction wired to Stowage).

    Returns the installed torch.cuda.memory._CUDAAllocator. Calling it again
    is a no-op. Raises RuntimeError (CUDA already initialised, simulated
    backend selected, adapter=True without an adapter), ValueError (bad conf),
    ImportError (no torch), LibraryNotFound.
    """
    global _installed, _route
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

    import warnings
    if adapter is not False:
        why = _install_adapter(torch)
        if why is None:
            _installed = torch.cuda.memory._get_current_allocator()
            _route = "adapter"
            return _installed
        if adapter:
            raise RuntimeError("stowage.torch.enable(adapter=True): " + why)
        warnings.warn("stowage.torch.enable: the C++ adapter is not in use (%s). Stowage serves "
                      "PyTorch through CUDAPluggableAllocator, where: %s."
                      % (why, "; ".join(PLUGGABLE_GAPS)), RuntimeWarning, stacklevel=2)

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
        warnings.warn("stowage.torch.enable: this PyTorch lacks %s; those features fall back "
                      "to no-ops" % ", ".join(missing), RuntimeWarning, stacklevel=2)
    _installed = plug
    _route = "pluggable"
    return plug


# ---- the MemPool route: Stowage behind a torch.cuda.MemPool (docs/torch.md) ----

_mem_pool_plugs = {}       # slot -> CUDAPluggableAllocator, kept while the slot is open
_mem_pool_slots = {}       # id(MemPool) -> slot, while the MemPool lives
_mem_pool_closing = set()  # slots whose MemPool died while Stowage still held segments


def _bind_mem_pool(lib):
    c = ctypes
    lib.stow_torch_mempool_open.restype = c.c_int
    lib.stow_torch_mempool_open.argtypes = [c.c_char_p, c.POINTER(c.c_int), c.c_char_p,
                                            c.c_size_t]
    lib.stow_torch_mempool_close.restype = c.c_int
    lib.stow_torch_mempool_close.argtypes = [c.c_int]
    lib.stow_torch_mempool_pool.restype = c.c_void_p
    lib.stow_torch_mempool_pool.argtypes = [c.c_int, c.c_int]
    for name in ("stow_torch_mempool_stats_json", "stow_torch_mempool_last_error"):
        getattr(lib, name).restype = c.c_size_t
        getattr(lib, name).argtypes = [c.c_int, c.c_int, c.c_char_p, c.c_size_t]
    return lib


def _close_slot(slot):
    """Closes a slot whose MemPool is gone, or keeps it for a later try while
    Stowage still holds its segments (PyTorch returns them at empty_cache)."""
    st = _bind_mem_pool(_lib.load()).stow_torch_mempool_close(slot)
    if st == 0:
        _mem_pool_closing.discard(slot)
        _mem_pool_plugs.pop(slot, None)
    else:
        _mem_pool_closing.add(slot)


def _retry_closing():
    for slot in list(_mem_pool_closing):
        _close_slot(slot)


def mem_pool(conf=None):
    """A torch.cuda.MemPool whose segments come from Stowage (the MemPool route).

        pool = stowage.torch.mem_pool("policy:vmm")
        with torch.cuda.use_mem_pool(pool):
            kv = torch.empty(...)                 # PyTorch's allocator, Stowage's memory
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool.id):   # a graph's memory from it too
            ...

    PyTorch's caching allocator stays in charge: it serves the tensors and asks
    Stowage only for whole segments, so torch.cuda.memory_stats,
    torch.cuda.memory._snapshot(), pool.snapshot() and torch.OutOfMemoryError
    work as usual; stowage.torch.mem_pool_stats(pool) and memory_snapshot(pool=pool)
    show the segments as Stowage holds them. conf: this pool's STOWAGE_CONF text
    (None: the environment's STOWAGE_CONF). Works before or after CUDA is
    initialised, but not with enable() (the global swap), which replaces the
    allocator a MemPool needs (through the adapter, torch.cuda.MemPool() itself
    gives a pool of Stowage's). At most STOW_TORCH_MAX_MEMPOOLS (8) are open at
    once; a pool's slot closes once the MemPool is gone and Stowage holds none
    of its segments. Raises ValueError (bad conf), RuntimeError (enable() in
    effect, the simulated backend, or every slot open), ImportError (no torch).
    """
    if _installed is not None:
        raise RuntimeError(
            "stowage.torch.mem_pool: Stowage is already PyTorch's allocator (enable()); a "
            "torch.cuda.MemPool needs PyTorch's own caching allocator in charge. Use one route%s."
            % (" (through the adapter, torch.cuda.MemPool() is a Stowage pool already)"
               if _route == "adapter" else ""))
    lib = _bind_mem_pool(_lib.load())
    if backend_name() != "cuda":
        raise RuntimeError("stowage.torch.mem_pool: STOWAGE_BACKEND=%s is not GPU memory"
                           % backend_name())
    import torch  # only here: importing stowage must not import torch
    import weakref

    _retry_closing()
    slot, why = ctypes.c_int(-1), ctypes.create_string_buffer(512)
    st = lib.stow_torch_mempool_open(None if conf is None else conf.encode(),
                                     ctypes.byref(slot), why, len(why))
    if st != 0:
        text = why.value.decode("utf-8", "replace") or _lib.strerror(st)
        if st == 1:  # STOW_EINVAL: the configuration
            raise ValueError("invalid Stowage configuration %r: %s" % (conf, text))
        raise RuntimeError("stowage.torch.mem_pool: %s" % text)
    k = slot.value
    try:
        plug = torch.cuda.memory.CUDAPluggableAllocator(
            _lib.path(), "stow_torch_mempool_malloc_%d" % k, "stow_torch_mempool_free_%d" % k)
        pool = torch.cuda.MemPool(plug.allocator())
    except Exception:
        lib.stow_torch_mempool_close(k)
        raise
    # The allocator outlives the MemPool: PyTorch may give segments back after it.
    _mem_pool_plugs[k] = plug
    _mem_pool_slots[id(pool)] = k
    try:
        weakref.finalize(pool, _mem_pool_gone, id(pool), k)
    except TypeError:
        pass  # a MemPool without weak references: its slot stays open until exit
    return pool


def _mem_pool_gone(pool_id, slot):
    _mem_pool_slots.pop(pool_id, None)
    _close_slot(slot)


def mem_pool_slot(pool):
    """The Stowage slot serving a MemPool that mem_pool() returned; ValueError otherwise."""
    slot = _mem_pool_slots.get(id(pool))
    if slot is None:
        raise ValueError("not a MemPool of stowage.torch.mem_pool()")
    return slot


def mem_pool_stats(pool, device=None):
    """stowage.memory_stats() of the Stowage pool behind a MemPool on device:
    the segments PyTorch asked for, as Stowage holds them."""
    import json
    from . import _device_index
    lib = _bind_mem_pool(_lib.load())
    return json.loads(_lib.call_text(lib.stow_torch_mempool_stats_json, mem_pool_slot(pool),
                                     _device_index(device)))


# ---- snapshots PyTorch's memory tools open (stowage/snapshot.py) ----

def memory_snapshot(device=None, pool=None):
    """The structure torch.cuda.memory._snapshot() returns, for Stowage's pools:
    the global swap's (enable()), or with pool=MemPool the Stowage pools behind a
    mem_pool(). One device, or every device with a pool (device=None). Recorded
    events fill 'device_traces' when recording is on (stowage.record(N), or
    record_events:N in STOWAGE_CONF). pytorch.org/memory_viz and
    torch.cuda._memory_viz read it (dump_snapshot writes the file)."""
    from . import snapshot
    if pool is None:
        return snapshot.memory_snapshot(device)
    lib = _bind_mem_pool(_lib.load())
    slot = mem_pool_slot(pool)
    devices = range(64) if device is None else [device]
    pools = {d: lib.stow_torch_mempool_pool(slot, d) for d in devices}
    pools = {d: p for d, p in pools.items() if p}
    return snapshot.pools_snapshot(pools, pool_id=tuple(getattr(pool, "id", (0, slot + 1))))


def dump_snapshot(path, device=None, pool=None):
    """Pickles memory_snapshot(device, pool) to path, as
    torch.cuda.memory._dump_snapshot does; returns path."""
    from . import snapshot
    return snapshot.dump_snapshot(path, memory_snapshot(device, pool))


# ---- out of memory: PyTorch's error with Stowage's explanation ----

def oom_report(device=None, pool=None):
    """Stowage's explanation of the device's last out-of-memory: the pool's
    message (requested, reserved, allocated, cached, largest free block, limit)
    and where the reserved bytes went at their peak. "" when it had none. With
    pool=MemPool: the Stowage pool behind it."""
    from . import _device_index
    d = _device_index(device)
    if pool is None:
        from . import last_error as _last_error
        text, stats = _last_error(d), memory_stats(d)
    else:
        lib = _bind_mem_pool(_lib.load())
        text = _lib.call_text(lib.stow_torch_mempool_last_error, mem_pool_slot(pool), d)
        stats = mem_pool_stats(pool, d)
    if not text:
        return ""
    w = {k[len("waste_at_peak."):]: v for k, v in stats.items() if k.startswith("waste_at_peak.")}
    causes = ["%s %d" % (k[:-len("_bytes")].replace("_", " "), v) for k, v in sorted(w.items())
              if k.endswith("_bytes") and k not in ("reserved_bytes", "requested_bytes") and v]
    return ("%s\nStowage at its reserved peak: %d bytes reserved for %d requested; the rest "
            "went to %s. OOMs %d, retries %d (stowage.memory_summary() has the whole table)."
            % (text, w.get("reserved_bytes", 0), w.get("requested_bytes", 0),
               ", ".join(causes) or "nothing", stats.get("num_ooms", 0),
               stats.get("num_alloc_retries", 0)))


class explain_oom:
    """Adds Stowage's explanation (oom_report) to PyTorch's out-of-memory error.

        with stowage.torch.explain_oom():
            loss = model(batch).sum()

    When Stowage counted an out-of-memory inside the block, a
    torch.OutOfMemoryError raised there is raised again with oom_report() at
    the end of its message (one that PyTorch's own limits caused is left as it
    is). Through the adapter PyTorch raises the error with Stowage's
    explanation already; this adds where the reserved bytes went. On the
    pluggable route PyTorch does not check the pointer Stowage returns, so an
    out-of-memory there gives a tensor with a null pointer (and later a CUDA
    error) instead of the exception: then the block's end raises
    torch.OutOfMemoryError with the report, chained to any error the null
    pointer caused (docs/torch.md: do not go on using CUDA in that process).
    """

    def __init__(self, device=None, pool=None):
        self.device, self.pool = device, pool

    def _ooms(self):
        if self.pool is None:
            return int(memory_stats(self.device).get("num_ooms", 0))
        return int(mem_pool_stats(self.pool, self.device).get("num_ooms", 0))

    def __enter__(self):
        self._before = self._ooms()
        return self

    def __exit__(self, kind, exc, tb):
        import torch
        counted = self._ooms() > self._before
        pytorch_oom = isinstance(exc, torch.OutOfMemoryError)
        # Only an out-of-memory Stowage counted inside the block: PyTorch's own
        # limits raise their error as it is.
        if not counted or not (exc is None or isinstance(exc, RuntimeError)):
            return False
        report = oom_report(self.device, self.pool)
        head = str(exc) if pytorch_oom else (
            "Stowage could not allocate on this device (PyTorch received a null pointer)")
        raise torch.OutOfMemoryError("%s\n%s" % (head, report)) from exc


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
