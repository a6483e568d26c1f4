"""The recorder of `stowage predict`: PyTorch code run on fake CUDA tensors, every storage
allocation and free written down in program order.

Nothing is computed: tensors are FakeTensorMode's (shapes, dtypes, devices, no data), on the
emulated card of fake_gpu.py. A TorchDispatchMode above the fake mode sees every ATen operator
the program runs, forward and backward (the autograd engine's device thread included), and:

- books each new CUDA storage of an operator's outputs as an allocation of its bytes on the
  current stream, tagged with the user's line (stack_tags.py's rule; an allocation of the
  backward pass takes the tag of the forward line that made its autograd node, with the node's
  name), and its free when the storage dies (a weak reference's callback: CPython frees it where
  a GPU run frees the block);
- adds what a GPU run allocates through the caching allocator that fake kernels do not: the
  cuBLAS workspace of each (thread, stream) at its first GEMM and the cuBLASLt workspace at its
  first cuBLASLt GEMM (sizes: fake_gpu.Card);
- keeps the values of small integer and boolean tensors (and of small tensors computed only from
  known values) on the CPU, so that `.item()`, `nonzero`, boolean masks and loops that test a
  tensor behave as on the GPU. Values computed from data the recorder does not have
  (activations, weights) are zeros: the policy for data-dependent calls, counted and named in
  the output.

Only what allocates through the caching allocator is recorded; the CUDA context is apart.
"""

import os
import re
import sys
import threading
import weakref

import torch
import torch._subclasses.fake_tensor as _ft
from torch._subclasses.fake_tensor import (
    DataDependentOutputException, DynamicOutputShapeException, FakeTensor, FakeTensorConverter,
    FakeTensorMode, UnsupportedOperatorException)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from . import kernels, rnn, stack_tags

aten = torch.ops.aten
_HERE = os.path.dirname(os.path.abspath(__file__))

VALUE_LIMIT = 1 << 22        # elements: larger tensors keep no value
RANDOM_FLOAT_LIMIT = 4096    # random floating-point tensors up to this size are drawn


class PredictError(RuntimeError):
    """The run cannot be recorded faithfully: names the operator and the user's line."""

    def __init__(self, message, op=None, line=None):
        super().__init__(message)
        self.op = op
        self.line = line


# ---- the user's line ----

_kind = {}  # filename -> stack_tags.python_kind


def _frames():
    """The Python stack, innermost first, as stack_tags frames, up to the first user frame;
    the recorder's own frames are left out."""
    out = []
    f = sys._getframe(2)
    while f is not None:
        code = f.f_code
        fn = code.co_filename
        if not fn.startswith(_HERE):
            out.append({"filename": fn, "line": f.f_lineno, "name": code.co_name})
            kind = _kind.get(fn)
            if kind is None:
                kind = _kind[fn] = stack_tags.python_kind(fn.replace("\\", "/"))
            if kind == "user":
                break
        f = f.f_back
    return out


def user_line():
    """'file:line' of the innermost frame of the user's code, or None."""
    for fr in _frames():
        if _kind.get(fr["filename"]) == "user":
            return "%s:%d" % (fr["filename"], fr["line"])
    return None


def _op_name(func):
    """'aten.mm' for an OpOverload, else the object's name."""
    packet = getattr(func, "overloadpacket", None)
    namespace = getattr(func, "namespace", None)
    if packet is not None and namespace:
        return "%s.%s" % (namespace, packet.__name__)
    return str(getattr(func, "__name__", func))


# ---- the books ----

class Books:
    """The recorded trace and the live and peak bytes it implies.

    events: ('a', id, size, stream) and ('f', id) in program order; ids dense from 0.
    allocated bytes are PyTorch's: each request rounded up to 512 B (round_size)."""

    def __init__(self):
        self.events = []
        self.tags = []             # id -> tag (str or None)
        self.sizes = []            # id -> requested bytes
        self.live_bytes = 0        # requested
        self.peak_live_bytes = 0
        self.allocated_bytes = 0   # rounded
        self.peak_allocated_bytes = 0
        self.window_peak_allocated = 0  # since reset_peak_memory_stats
        self.streams = {}          # stream id -> dense index
        self.closed = False        # set when the recording ends: later frees are not booked
        self.lock = threading.RLock()

    @staticmethod
    def rounded(size):
        return 512 if size < 512 else (size + 511) // 512 * 512

    def alloc(self, size, stream, tag):
        with self.lock:
            i = len(self.sizes)
            self.sizes.append(size)
            self.tags.append(tag)
            self.events.append(("a", i, size, stream))
            self.live_bytes += size
            if self.live_bytes > self.peak_live_bytes:
                self.peak_live_bytes = self.live_bytes
            self.allocated_bytes += self.rounded(size)
            if self.allocated_bytes > self.peak_allocated_bytes:
                self.peak_allocated_bytes = self.allocated_bytes
            if self.allocated_bytes > self.window_peak_allocated:
                self.window_peak_allocated = self.allocated_bytes
            return i

    def free(self, i):
        with self.lock:
            self.events.append(("f", i))
            size = self.sizes[i]
            self.live_bytes -= size
            self.allocated_bytes -= self.rounded(size)

    def stream_index(self, stream_id):
        idx = self.streams.get(stream_id)
        if idx is None:
            idx = self.streams[stream_id] = len(self.streams)
        return idx

    def write(self, path, tags=True):
        """Writes the .rep trace (docs/trace_format.md) and, when tags, PATH.tags."""
        with self.lock:
            events = list(self.events)
            ids = len(self.sizes)
        with open(path, "w") as f:
            f.write("%d %d\n" % (ids, len(events)))
            f.write("".join("a %d %d %d\n" % (e[1], e[2], e[3]) if e[0] == "a" else "f %d\n" % e[1]
                            for e in events))
        if tags:
            with open(path + ".tags", "w") as f:
                for i, tag in enumerate(self.tags):
                    if tag:
                        f.write("%d %s\n" % (i, stack_tags.one_line(tag)))


# ---- values of small tensors ----

def _is_int_like(dtype):
    return not (dtype.is_floating_point or dtype.is_complex)


def _numel(t):
    n = 1
    for s in t.shape:
        n *= int(s)
    return n


class DataPolicy:
    """What the recorder answered where a value came from data it does not have."""

    def __init__(self):
        self.count = 0
        self.sites = {}  # (op, line) -> count

    def note(self, func, line):
        self.count += 1
        key = (_op_name(func), line or "?")
        self.sites[key] = self.sites.get(key, 0) + 1

    def summary(self, limit=5):
        top = sorted(self.sites.items(), key=lambda kv: -kv[1])[:limit]
        return [{"op": op, "line": line, "count": n} for (op, line), n in top]


def _value(t):
    """The known CPU value of a tensor, or None."""
    if not isinstance(t, FakeTensor):
        return t  # a real tensor made outside the fake mode
    v = t.__dict__.get("_stow_value") if hasattr(t, "__dict__") else None
    if v is not None:
        return v
    c = getattr(t, "constant", None)
    return c


def _set_value(t, v):
    try:
        t.__dict__["_stow_value"] = v
    except (AttributeError, TypeError):
        pass


def _drop_value(t):
    try:
        t.__dict__.pop("_stow_value", None)
    except (AttributeError, TypeError):
        pass


_VALUE_FREE_OPS = {  # outputs depend on their inputs' metadata only
    aten.ones_like.default, aten.zeros_like.default, aten.full_like.default,
    aten.new_ones.default, aten.new_zeros.default, aten.new_full.default,
    aten.scalar_tensor.default,
}


class _one_thread:
    """The recorder's CPU work (small tensors' values) on the calling thread alone: waking
    intra-op threads costs more than these tensors' arithmetic."""

    def __enter__(self):
        self.prev = torch.get_num_threads()
        if self.prev != 1:
            torch.set_num_threads(1)

    def __exit__(self, *exc):
        if self.prev != 1:
            torch.set_num_threads(self.prev)


def _non_overlapping_and_dense(t):
    from torch._prims_common import is_non_overlapping_and_dense_or_false
    return is_non_overlapping_and_dense_or_false(t)


def _cpu_device(x):
    if isinstance(x, torch.device) and x.type != "cpu":
        return torch.device("cpu")
    return x


# ---- the dispatch mode ----

_GEMM = {aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default,
         aten.addbmm.default, aten.mv.default, aten.addmv.default, aten.dot.default,
         aten.vdot.default, aten._addmm_activation.default, aten.addr.default,
         aten._int_mm.default, aten.mm.out, aten.bmm.out, aten.addmm.out, aten.baddbmm.out}
_LT_ALWAYS = {aten._addmm_activation.default}
if hasattr(aten, "_scaled_mm"):
    _GEMM.add(aten._scaled_mm.default)
    _LT_ALWAYS.add(aten._scaled_mm.default)


def _addmm_uses_lt(args, kwargs):
    """addmm goes through cuBLASLt (and its workspace) for a 1-D bias added with beta 1 to a
    2-D float result (Blas.cpp, addmm_out_cuda_impl)."""
    bias, mat1, mat2 = args[0], args[1], args[2]
    beta = kwargs.get("beta", args[3] if len(args) > 3 else 1)
    return (getattr(bias, "dim", lambda: 0)() == 1 and beta == 1
            and mat1.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64)
            and mat2.shape[0] > 1 and mat2.shape[1] > 1 and bias.shape[0] == mat2.shape[1])


def _note(exc, text):
    """Adds a line to an exception's report, once (Python 3.11's add_note)."""
    if hasattr(exc, "add_note") and text not in getattr(exc, "__notes__", ()):
        exc.add_note("stowage predict: " + text)


# What FakeTensorMode and the dispatcher say when an operator has no fake or meta kernel.
_NO_FAKE_KERNEL = re.compile(r"no fake impl|register_fake|could not run .* with arguments from "
                             r"the 'Meta' backend|no meta (kernel|function|impl)", re.I)


class RecordMode(TorchDispatchMode):
    """Books every operator's new CUDA storages; keeps small tensors' values."""

    def __init__(self, recorder):
        super().__init__()
        self.rec = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rec = self.rec
        if func is aten.add.Tensor and rec.accumulates_in_place(args, kwargs):
            return aten.add_.Tensor(args[0], args[1])
        try:
            fake = kernels.FAKE_KERNELS.get(func)
            out = fake(*args, **kwargs) if fake is not None else func(*args, **kwargs)
        except (DataDependentOutputException, DynamicOutputShapeException):
            out = rec.data_dependent(func, args, kwargs)
            rec.book_outputs(func, out, args, kwargs)
            return out
        except UnsupportedOperatorException as exc:
            raise rec.error("the operator %s has no fake (meta) kernel: the recorder cannot "
                            "trace it without running it" % _op_name(exc.func), func) from None
        except PredictError:
            raise
        except torch.OutOfMemoryError:
            # FakeTensorMode ran the operator's CUDA kernel on real tensors (its fallback for an
            # operator without a meta kernel): the emulated device has no memory to give it.
            raise rec.error("the operator %s has no fake (meta) kernel, so the recorder "
                            "cannot trace it without running it" % _op_name(func),
                            func) from None
        except (NotImplementedError, RuntimeError) as exc:
            msg = str(exc)
            if _NO_FAKE_KERNEL.search(msg):
                raise rec.error("the operator %s has no fake (meta) kernel, so the recorder "
                                "cannot trace it without running it (%s)"
                                % (_op_name(func), msg.splitlines()[0][:200]), func) from None
            _note(exc, "raised by %s on fake tensors, called at %s (a fake kernel may check "
                       "more than the CUDA one)" % (_op_name(func), user_line() or "?"))
            raise
        rec.book_outputs(func, out, args, kwargs)
        if func in _GEMM:
            rec.gemm(func, args, kwargs)
        rec.values(func, args, kwargs, out)
        return out


class _Converter(FakeTensorConverter):
    """FakeTensorMode's converter without the memo of fresh outputs: the memo's weak reference
    to every output would make nn.Module.to() fail to swap fake parameters."""

    def from_meta_and_device(self, fake_mode, t, device, pytype=None, dispatch_keys=None):
        return FakeTensor(fake_mode, t, device, pytype=pytype, dispatch_keys=dispatch_keys)


# Libraries that look for fake tensors and take another path on them (an export's or a
# tracer's); in a recording they must see the tensors a GPU run has: (module, attribute, value).
_LIBRARY_PATCHES = {
    # transformers' is_tracing() is true on a fake tensor: attention masks would be built
    # where an eager GPU run lets scaled_dot_product_attention use is_causal.
    "transformers.utils.import_utils": [("is_fake_tensor", lambda x: False)],
}


class _PatchOnImport:
    """A sys.meta_path finder that applies _LIBRARY_PATCHES to a module once it is imported
    (at once if it already is); patch(obj, name, value) records each for the undo."""

    def __init__(self, patch):
        self.patch = patch
        for name, attrs in _LIBRARY_PATCHES.items():
            if name in sys.modules:
                self._apply(sys.modules[name])

    def _apply(self, module):
        for attr, value in _LIBRARY_PATCHES.get(module.__name__, ()):
            if hasattr(module, attr):
                self.patch(module, attr, value)

    def find_spec(self, name, path=None, target=None):
        if name not in _LIBRARY_PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                exec_module = spec.loader.exec_module
                hook = self

                def exec_and_patch(module, exec_module=exec_module):
                    exec_module(module)
                    hook._apply(module)
                spec.loader.exec_module = exec_and_patch
                return spec
        return None


class _FakeMode(FakeTensorMode):
    """FakeTensorMode that never moves its constants (small tensors it computes for real) to
    the device for real, as it does when CUDA is unavailable: the emulated device has no
    memory."""

    @property
    def avoid_device_init(self):
        return True


class Recorder:
    """One recording: the books, the data policy, the patches to torch while it runs."""

    def __init__(self, card, tags=True):
        self.card = card
        self.books = Books()
        self.policy = DataPolicy()
        self.want_tags = tags
        self._live = {}            # storage key -> (id, weakref)
        self._seq_tags = {}        # autograd sequence number -> forward tag
        self._last_seq = None
        self._workspaces = set()   # (thread, stream, kind)
        self._gen = torch.Generator().manual_seed(0)
        self._accum_baseline = None    # reference counts of an accumulation's buffer tensor
        self._calibrating = None       # a list while calibrate() runs
        self.fake_mode = None
        self.mode = None
        self.notes = []            # what the output states about the run
        self._saved = []
        self._appended = []
        self._texpr_fuser = None   # TorchScript's fuser setting, restored by uninstall()

    # -- errors and tags --

    def error(self, message, func=None):
        line = user_line()
        where = (" at %s" % line) if line else ""
        return PredictError("%s%s" % (message, where), op=_op_name(func) if func else None,
                            line=line)

    def _tag(self):
        frames = _frames()
        node = torch._C._current_autograd_node()
        if node is not None and not any(_kind.get(f["filename"]) == "user" for f in frames):
            fwd = self._seq_tags.get(node._sequence_nr())
            return "%s [%s]" % (fwd or "<backward>", node.name())
        tag, _ = stack_tags.stack_tag(frames)
        return tag

    # -- booking --

    def _stream(self):
        s = torch.cuda.current_stream()
        return self.books.stream_index(s.cuda_stream)

    def accumulates_in_place(self, args, kwargs):
        """Whether this add is the autograd engine summing two gradients of one input where a
        GPU run adds in place (InputBuffer::accumulate: grad mode off, the buffer's tensor held
        by the buffer alone, strided and dense). The engine never adds in place on a tensor
        subclass, such as a fake tensor, so the recorder does it for it. The buffer's tensor is
        recognised by its reference counts, measured once on a known accumulation
        (calibrate)."""
        if self._accum_baseline is None or kwargs or len(args) != 2:
            return False
        a, b = args
        if (not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor)
                or torch.is_grad_enabled() or torch._C._current_autograd_node() is None
                or a.shape != b.shape or a.device != b.device or a.layout != torch.strided
                or a.dtype != torch.promote_types(a.dtype, b.dtype)
                or not _non_overlapping_and_dense(a)):
            return False
        counts = (a._use_count(), torch._C._storage_Use_Count(a.untyped_storage()._cdata))
        return counts == self._accum_baseline

    def calibrate(self):
        """Measures the reference counts of an accumulation's buffer tensor (see
        accumulates_in_place) on a two-branch backward, booking nothing."""
        self._calibrating = []
        try:
            x = torch.empty((2, 8), device="cuda", requires_grad=True)
            h = x * 2
            (h.sin() + h.cos()).sum().backward()
            del x, h
        finally:
            seen, self._calibrating = self._calibrating, None
        self._accum_baseline = seen[0] if seen else None

    def book_outputs(self, func, out, args=(), kwargs=None):
        if self._calibrating is not None:
            if func is aten.add.Tensor and torch._C._current_autograd_node() is not None:
                a = args[0]
                self._calibrating.append(
                    (a._use_count(), torch._C._storage_Use_Count(a.untyped_storage()._cdata)))
            return
        tag = None
        if self.want_tags and torch._C._current_autograd_node() is None:
            seq = torch._C._autograd._get_sequence_nr()
            if seq != self._last_seq:  # this operator made an autograd node: remember its line
                tag = self._tag()
                self._seq_tags[seq - 1] = tag
                self._last_seq = seq
        flat, _ = tree_flatten(out)
        model = kernels.MODELS.get(func)
        steps = (model(kernels.bind(func, args, kwargs or {}), flat, self.card)
                 if model is not None else ())
        if not steps:
            for t in flat:
                tag = self._book_tensor(t, tag)
            return
        booked = set()
        temps = {}
        for step in steps:
            kind = step[0]
            if kind == "out":
                k = step[1]
                if k < len(flat) and k not in booked:
                    booked.add(k)
                    tag = self._book_tensor(flat[k], tag)
            elif kind == "none":
                booked.add(step[1])
            elif kind == "tmp":
                if tag is None and self.want_tags:
                    tag = self._tag()
                temps[step[1]] = self.books.alloc(step[2], self._stream(), tag)
            else:
                self.books.free(temps.pop(step[1]))
        for k, t in enumerate(flat):
            if k not in booked:
                tag = self._book_tensor(t, tag)

    def _book_tensor(self, t, tag):
        """Books t's storage if it is a new CUDA one; returns the tag (computed on first need)."""
        if not isinstance(t, torch.Tensor) or t.device.type != "cuda":
            return tag
        st = t.untyped_storage()
        key = st._cdata
        known = self._live.get(key)
        size = st.nbytes()
        if known is not None:
            if size != self.books.sizes[known[0]]:  # resized in place
                if tag is None and self.want_tags:
                    tag = self._tag()
                self._rebook(st, key, size, tag)
            return tag
        if size == 0:
            return tag
        if tag is None and self.want_tags:
            tag = self._tag()
        self._book(st, key, size, tag)
        return tag

    def _book(self, st, key, size, tag):
        i = self.books.alloc(size, self._stream(), tag)
        books, live = self.books, self._live

        def freed(_ref, key=key, i=i):
            entry = live.get(key)
            if entry is not None and entry[0] == i:  # else rebooked: its old id is freed
                del live[key]
                if not books.closed:
                    books.free(i)
        live[key] = (i, weakref.ref(st, freed))

    def _rebook(self, st, key, size, tag):
        """A storage resized in place: PyTorch allocates the new block, then frees the old."""
        old_id, _ = self._live.pop(key)
        if size:
            self._book(st, key, size, tag)
        self.books.free(old_id)

    def gemm(self, func, args, kwargs):
        """The cuBLAS (and cuBLASLt) workspace of this thread's handle on this stream, allocated
        through the caching allocator at its first GEMM and kept (CublasHandlePool.cpp)."""
        stream = self._stream()
        thread = threading.get_ident()
        need = [("cublas", self.card.cublas_workspace_bytes())]
        if func in _LT_ALWAYS or (func is aten.addmm.default and _addmm_uses_lt(args, kwargs)):
            need.append(("cublaslt", self.card.cublaslt_workspace_bytes()))
        for kind, size in need:
            key = (thread, stream, kind)
            if key not in self._workspaces:
                self._workspaces.add(key)
                tag = "<%s workspace>" % kind if self.want_tags else None
                self.books.alloc(size, stream, tag)

    # -- values --

    def values(self, func, args, kwargs, out):
        """Keeps the CPU value of small outputs computed from known values (all of an integer
        or boolean output's unknown inputs count as zeros); drops the value of a tensor written
        from unknown data."""
        flat_out, _ = tree_flatten(out)
        outs = [t for t in flat_out if isinstance(t, torch.Tensor)]
        if not outs or func is aten._local_scalar_dense.default:
            return
        if any(_numel(t) > VALUE_LIMIT for t in outs):
            for t in outs:
                _drop_value(t)
            return
        flat_in, _ = tree_flatten((args, kwargs))
        tensors = [a for a in flat_in if isinstance(a, torch.Tensor)]
        unknown = [a for a in tensors if _value(a) is None]
        random = torch.Tag.nondeterministic_seeded in func.tags
        int_out = all(_is_int_like(t.dtype) for t in outs)
        if random and not (int_out or all(_numel(t) <= RANDOM_FLOAT_LIMIT for t in outs)):
            for t in outs:
                _drop_value(t)
            return
        if unknown and func not in _VALUE_FREE_OPS:
            if not int_out:
                for t in outs:
                    _drop_value(t)
                return
            if any(_numel(a) > VALUE_LIMIT for a in unknown):
                for t in outs:
                    _drop_value(t)  # unknown = zeros, read lazily
                return
            self.policy.note(func, user_line())  # integers from data the recorder lacks
        if not tensors and func.overloadpacket in (aten.empty, aten.empty_strided,
                                                   aten.empty_like, aten.new_empty):
            return
        try:
            cpu = self._on_cpu(func, args, kwargs)
        except Exception:
            for t in outs:
                _drop_value(t)
            return
        flat_cpu, _ = tree_flatten(cpu)
        cpu_outs = [c for c in flat_cpu if isinstance(c, torch.Tensor)]
        if len(cpu_outs) != len(outs):
            return
        for t, c in zip(outs, cpu_outs):
            if tuple(c.shape) == tuple(t.shape) and c.dtype == t.dtype:
                _set_value(t, c)
            else:
                _drop_value(t)

    def _on_cpu(self, func, args, kwargs):
        """func on the CPU values of its arguments (unknown ones as zeros). Everything here
        runs with the dispatch modes off: these are real CPU tensors, not fakes."""
        def to_cpu(a):
            if isinstance(a, torch.Tensor):
                v = _value(a)
                if v is None:
                    v = torch.zeros(tuple(a.shape), dtype=a.dtype)
                return v
            return _cpu_device(a)
        with torch._C._DisableTorchDispatch(), torch.no_grad(), _one_thread():
            cargs = tree_map(to_cpu, args)
            ckw = tree_map(to_cpu, kwargs)
            if "generator" in {a.name for a in func._schema.arguments}:
                ckw["generator"] = self._gen
            if "pin_memory" in ckw:
                ckw["pin_memory"] = False
            return func(*cargs, **ckw)

    def _mask_value(self, func, m):
        v = _value(m)
        if v is None:
            if _numel(m) > VALUE_LIMIT:
                raise self.error("%s needs the values of a mask of %d elements that the recorder "
                                 "does not keep (over %d)" % (_op_name(func), _numel(m),
                                                              VALUE_LIMIT), func)
            self.policy.note(func, user_line())
            with torch._C._DisableTorchDispatch(), _one_thread():
                v = torch.zeros(tuple(m.shape), dtype=m.dtype)
        return v

    def host_value(self, t, what):
        """A NumPy array of t's values: the known ones, else zeros (the data policy, counted
        as `what`); refused over the value limit."""
        v = _value(t)
        if v is None:
            if _numel(t) > VALUE_LIMIT:
                raise self.error("%s needs the values of a tensor of %d elements that the "
                                 "recorder does not keep (over %d)"
                                 % (what, _numel(t), VALUE_LIMIT))
            self.policy.note(what, user_line())
            with torch._C._DisableTorchDispatch(), _one_thread():
                v = torch.zeros(tuple(t.shape), dtype=t.dtype)
        with torch._C._DisableTorchDispatch():  # numpy() runs operators: none on fakes
            return v.detach().reshape(tuple(t.shape)).numpy()

    def _long_indices(self, func, indices):
        """Boolean (or uint8) index tensors as the long index tensors of their true places, fakes
        with values: the shape of the result then needs no data."""
        out = []
        for m in indices:
            if isinstance(m, torch.Tensor) and m.dtype in (torch.bool, torch.uint8):
                v = self._mask_value(func, m)
                with torch._C._DisableTorchDispatch(), _one_thread():
                    nz = torch.nonzero(v)
                    cols = [nz[:, k].contiguous() for k in range(nz.shape[1])]
                for col in cols:
                    t = torch.empty((col.shape[0],), dtype=torch.long, device=m.device)
                    _set_value(t, col)
                    out.append(t)
            else:
                out.append(m)
        return out

    def data_dependent(self, func, args, kwargs):
        """An operator whose result depends on data (.item(), nonzero, masks): computed on the
        CPU values (unknown ones as zeros, the policy), its tensors remade as fakes."""
        if func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
                    aten._index_put_impl_.default) and len(args) >= 2:
            args = (args[0], self._long_indices(func, args[1])) + tuple(args[2:])
            return func(*args, **kwargs)
        if func is aten.masked_select.default:
            x, m = args[0], args[1]
            shape = torch.broadcast_shapes(tuple(x.shape), tuple(m.shape))
            v = self._mask_value(func, m)
            with torch._C._DisableTorchDispatch(), _one_thread():
                count = int(v.expand(shape).sum())
            return torch.empty((count,), dtype=x.dtype, device=x.device)
        line = None
        for a in tree_flatten((args, kwargs))[0]:
            if isinstance(a, torch.Tensor) and _value(a) is None:
                if _numel(a) > VALUE_LIMIT:
                    raise self.error(
                        "%s needs the values of a tensor of %d elements that the recorder does "
                        "not keep (over %d)" % (_op_name(func), _numel(a), VALUE_LIMIT), func)
                if line is None:
                    line = user_line()
                    self.policy.note(func, line)
        try:
            cpu = self._on_cpu(func, args, kwargs)
        except Exception as exc:
            raise self.error("%s on the recorder's CPU values failed: %s"
                             % (_op_name(func), exc), func) from None
        device = None
        for a in tree_flatten((args, kwargs))[0]:
            if isinstance(a, torch.Tensor):
                device = a.device
                break

        def remake(c):
            if not isinstance(c, torch.Tensor):
                return c
            t = torch.empty_strided(tuple(c.shape), tuple(c.stride()), dtype=c.dtype,
                                    device=device or "cpu")
            _set_value(t, c)
            return t
        return tree_map(remake, cpu)

    def _release_device_thread(self):
        """The autograd engine's device thread keeps its last backward pass, with the dispatch
        modes that ran it, until its next one; at interpreter exit that release would take
        the GIL from a finalizing interpreter and abort the process. Run one more backward,
        outside the modes, so that the thread holds nothing of Python's."""
        try:
            with _FakeMode(allow_non_fake_inputs=True):
                x = torch.empty((1,), device="cuda", requires_grad=True)
                y = (x * 2).sum()
            y.backward()
        except Exception:
            pass

    # -- patches --

    def install(self):
        """Patches torch for the recording; undone by uninstall()."""
        cuda = torch.version.cuda or ""
        if cuda.split(".")[0] != "13":
            raise PredictError("the emulated device answers as CUDA 13 does; this torch %s is "
                               "built for %s" % (torch.__version__, "CUDA " + cuda if cuda
                                                 else "no CUDA"))
        saved = self._saved

        def patch(obj, name, value):
            saved.append((obj, name, getattr(obj, name)))
            setattr(obj, name, value)

        patch(_ft, "init_gpu_context", lambda device: torch.cuda._lazy_init())
        books = self.books
        card = self.card

        def memory_allocated(device=None):
            return books.allocated_bytes

        def max_memory_allocated(device=None):
            return books.window_peak_allocated

        def reset_peak(device=None):
            books.window_peak_allocated = books.allocated_bytes

        def memory_stats(device=None):
            cur, peak = books.allocated_bytes, books.window_peak_allocated
            return {"allocated_bytes.all.current": cur, "allocated_bytes.all.peak": peak,
                    "reserved_bytes.all.current": cur, "reserved_bytes.all.peak": peak,
                    "active_bytes.all.current": cur, "active_bytes.all.peak": peak,
                    "requested_bytes.all.current": books.live_bytes,
                    "requested_bytes.all.peak": books.peak_live_bytes,
                    "num_alloc_retries": 0, "num_ooms": 0}

        def mem_get_info(device=None):
            return (card.total_bytes - card.context_bytes - books.allocated_bytes,
                    card.total_bytes)

        def memory_summary(device=None, abbreviated=False):
            return ("stowage predict (recorded, not run): allocated %d B, peak %d B\n"
                    % (books.allocated_bytes, books.window_peak_allocated))

        def compile_eagerly(model=None, **kwargs):
            if "torch.compile" not in self.notes:
                self.notes.append("torch.compile")
            if model is None:
                return lambda m: m
            return model

        for mod in (torch.cuda, torch.cuda.memory):
            for name, fn in (("memory_allocated", memory_allocated),
                             ("max_memory_allocated", max_memory_allocated),
                             ("memory_reserved", memory_allocated),
                             ("max_memory_reserved", max_memory_allocated),
                             ("reset_peak_memory_stats", reset_peak),
                             ("reset_max_memory_allocated", reset_peak),
                             ("memory_stats", memory_stats),
                             ("mem_get_info", mem_get_info),
                             ("memory_summary", memory_summary),
                             ("empty_cache", lambda: None)):
                if hasattr(mod, name):
                    patch(mod, name, fn)
        patch(torch, "compile", compile_eagerly)

        swap = torch.utils.swap_tensors
        apply_code = torch.nn.Module._apply.__code__

        def swap_or_set_data(t1, t2):
            # nn.Module._apply swaps fake parameters where it gives real ones their new data
            # with `.data =`; the swap keeps the old data alive until the loop's next
            # parameter, where a GPU run frees it at once. Give fakes `.data =` too, on one
            # device (a fake's device is also a Python attribute, which `.data =` leaves).
            if (sys._getframe(1).f_code is apply_code and isinstance(t1, FakeTensor)
                    and isinstance(t2, FakeTensor) and t1.device == t2.device
                    and torch._has_compatible_shallow_copy_type(t1, t2)):
                t1.data = t2
                return
            for t in (t1, t2):
                if isinstance(t, FakeTensor) and weakref.getweakrefs(t):
                    self._unref_fake(t)
            return swap(t1, t2)
        patch(torch.utils, "swap_tensors", swap_or_set_data)
        tensor_format = torch.Tensor.__format__

        def format_fake(t, spec):
            # Tensor.__format__ writes a 0-dim tensor as its item() for the Tensor type only; a
            # CUDA tensor of a GPU run is one (f"expert_{idx}" names a module by the value).
            if t.dim() == 0 and not t.is_meta:
                return t.item().__format__(spec)
            return tensor_format(t, spec)
        patch(FakeTensor, "__format__", format_fake)

        def numpy_fake(t, *, force=False):
            # A host tensor of a GPU run (after .cpu()) converts to a NumPy array of its
            # values (np.asarray and SciPy through __array__): the values the recorder has.
            if t.device.type != "cpu":
                raise TypeError("can't convert %s device type tensor to numpy. Use Tensor.cpu() "
                                "to copy the tensor to host memory first." % t.device)
            return self.host_value(t, "Tensor.numpy")
        patch(FakeTensor, "numpy", numpy_fake)
        # TorchScript's profiling executor fuses a function's CUDA operators into a kernel it
        # compiles at the function's second call; nothing compiles for the emulated device (the
        # process dies), so the function's graph runs unfused, operator by operator.
        # cuDNN's RNNs: _VF's C++ asks a cuDNN handle about the weights, which needs a device;
        # rnn.py takes the same path with operators (and Module.to() flattens the weights).
        vf = torch._VF
        for name in rnn.MODES:
            patch(vf, name, rnn.route(name, getattr(vf, name)))
        flatten = torch.nn.RNNBase.flatten_parameters
        patch(torch.nn.RNNBase, "flatten_parameters", lambda m: rnn.flatten(m, flatten))
        self._texpr_fuser = torch._C._jit_texpr_fuser_enabled()
        torch._C._jit_set_texpr_fuser_enabled(False)
        self._library_hook = _PatchOnImport(patch)
        sys.meta_path.insert(0, self._library_hook)
        # Fake tensors take the optimizers' and clip_grad_norm_'s foreach paths, as CUDA
        # tensors do (the lists are how DTensor joins them too).
        import torch.optim.optimizer as _optim
        import torch.utils._foreach_utils as _fe
        for lst in (_optim._foreach_supported_types, _fe._foreach_supported_types):
            if FakeTensor not in lst:
                lst.append(FakeTensor)
                self._appended.append(lst)

        self.fake_mode = _FakeMode(allow_non_fake_inputs=True)
        self.fake_mode.fake_tensor_converter.__class__ = _Converter
        self.mode = RecordMode(self)
        self.fake_mode.__enter__()
        self.mode.__enter__()
        self.calibrate()

    def _unref_fake(self, t):
        """Drops the weak references that the fake mode's converter keeps to the fake t: its
        memo of converted real tensors and its constants by storage (a 0-dim parameter made from
        a value, `nn.Parameter(torch.tensor(v))`, is such a constant). torch.utils.swap_tensors
        refuses a tensor with weak references, and after the swap these would name the tensor
        of the other device."""
        conv = self.fake_mode.fake_tensor_converter if self.fake_mode is not None else None
        if conv is None:
            return
        memo = conv.tensor_memo
        for key in [k for k, v in list(memo.items()) if v is t]:
            del memo[key]
        mapping = conv.constant_storage_mapping
        for key, refs in list(mapping.items()):
            kept = [r for r in refs if r() is not t]
            if len(kept) == len(refs):
                continue
            if kept:
                mapping[key] = kept
            else:
                del mapping[key]

    def uninstall(self):
        if getattr(self, "_library_hook", None) in sys.meta_path:
            sys.meta_path.remove(self._library_hook)
        if self.mode is not None:
            self.mode.__exit__(None, None, None)
            self.fake_mode.__exit__(None, None, None)
            self.mode = None
            self._release_device_thread()
        while self._saved:
            obj, name, value = self._saved.pop()
            setattr(obj, name, value)
        if self._texpr_fuser is not None:
            torch._C._jit_set_texpr_fuser_enabled(self._texpr_fuser)
            self._texpr_fuser = None
        while self._appended:
            self._appended.pop().remove(FakeTensor)
