"""cuDNN's recurrent networks (nn.LSTM, nn.GRU, nn.RNN on CUDA) on the emulated device, as
PyTorch 2.11 runs them (aten/src/ATen/native/cudnn/RNN.cpp, AutocastRNN.cpp).

On a GPU, `_VF.lstm` (and gru, rnn_tanh, rnn_relu) reach `_cudnn_impl`, C++ that asks a cuDNN
handle where the weights belong before it calls the operator `_cudnn_rnn`; under autocast the
operator's autocast kernel asks it again to lay the weights out in half precision. Neither runs
without a device, so the recorder routes these calls here: `route()` does what `_cudnn_impl` and
the autocast kernel do, with the operators they call (the casts and copies are recorded as
operators), and `_cudnn_rnn` and `_cudnn_rnn_backward` take the fake kernels below, whose
models (kernels.MODELS) allocate what the CUDA kernels allocate, in their order:

    _cudnn_rnn            the input made sequence-first and contiguous (batch_first), the
                          output, hy, cy, the weight buffer (where the weights are not one),
                          the workspace, the reserve (training), then the workspace and the
                          input's copy freed;
    _cudnn_rnn_backward   zeros for the gradients autograd does not give, then for the data:
                          the input's and the output gradient's contiguous copies, dx, dhx,
                          dcx and the workspace; for the weights: the input's copy again, dw
                          (one buffer, the weights' gradients are views of it) and the
                          workspace.

`flatten_parameters()` at Module.to() puts the weights in one buffer, as a GPU run does (a fake
tensor's data_ptr() is 0, which makes PyTorch's own check give up).

cuDNN's workspace and reserve sizes come from the library (cudnnGetRNNTempSpaceSizes); here
they are estimates: the workspace holds one layer's input projections for every step
(T x N x D x G x H elements), the reserve every layer's gates and states for every step
(L x D x T x N x H x (G + 2) elements for an LSTM, G + 1 for the others), G the gates per cell.
"""

import torch
from torch._subclasses.fake_tensor import FakeTensor

from . import kernels

aten = torch.ops.aten

# cudnnRNNMode_t, and the gates of a cell
MODES = {"rnn_relu": 0, "rnn_tanh": 1, "lstm": 2, "gru": 3}
_GATES = {0: 1, 1: 1, 2: 4, 3: 3}
_LSTM = 2


def _geometry(input, batch_first):
    """(T, N) of an unpacked input."""
    if batch_first:
        return int(input.shape[1]), int(input.shape[0])
    return int(input.shape[0]), int(input.shape[1])


def workspace_bytes(mode, input, hidden_size, num_layers, bidirectional, batch_first):
    t, n = _geometry(input, batch_first)
    d = 2 if bidirectional else 1
    return t * n * d * _GATES[mode] * int(hidden_size) * input.element_size()


def reserve_bytes(mode, input, hidden_size, num_layers, bidirectional, batch_first):
    t, n = _geometry(input, batch_first)
    d = 2 if bidirectional else 1
    per_step = _GATES[mode] + (2 if mode == _LSTM else 1)
    return (int(num_layers) * d * t * n * int(hidden_size) * per_step
            * input.element_size())


# ---- the fake kernels ----

def _cudnn_rnn_fake(input, weight, weight_stride0, weight_buf, hx, cx, mode, hidden_size,
                    proj_size, num_layers, batch_first, dropout, train, bidirectional,
                    batch_sizes, dropout_state):
    if len(batch_sizes):
        raise RuntimeError("stowage predict: packed sequences on cuDNN's RNN are not modelled")
    d = 2 if bidirectional else 1
    out_size = int(proj_size) or int(hidden_size)
    t, n = _geometry(input, batch_first)
    output = input.new_empty((t, n, out_size * d))
    if batch_first:
        output = output.transpose(0, 1)
    hy = hx.new_empty((int(num_layers) * d, n, out_size))
    if cx is not None:
        cy = cx.new_empty((int(num_layers) * d, n, int(hidden_size)))
    else:
        cy = hx.new_empty((0,))
    if weight_buf is None:
        weight_buf = input.new_empty((sum(w.numel() for w in weight),))
    size = reserve_bytes(mode, input, hidden_size, num_layers, bidirectional,
                         batch_first) if train else 0
    reserve = input.new_empty((size,), dtype=torch.uint8)
    return output, hy, cy, reserve, weight_buf


def _cudnn_rnn_backward_fake(input, weight, weight_stride0, weight_buf, hx, cx, output,
                             grad_output, grad_hy, grad_cy, mode, hidden_size, proj_size,
                             num_layers, batch_first, dropout, train, bidirectional,
                             batch_sizes, dropout_state, reserve, output_mask):
    if grad_output is None and grad_hy is None and grad_cy is None:
        return None, None, None, [None] * len(weight)
    t, n = _geometry(input, batch_first)
    dx = input.new_empty((t, n, int(input.shape[-1])))
    if batch_first:
        dx = dx.transpose(0, 1)
    dhx = hx.new_empty(tuple(hx.shape))
    dcx = cx.new_empty(tuple(cx.shape)) if cx is not None else None
    dw = []
    if output_mask[3]:
        flat = weight_buf.new_empty(tuple(weight_buf.shape))
        off = 0
        for w in weight:
            dw.append(flat[off:off + w.numel()].view(tuple(w.shape)))
            off += w.numel()
    return dx, dhx, dcx, dw


# ---- the models: what the CUDA kernels allocate beyond their outputs ----

def _seq_first_copy(t, batch_first):
    """Bytes of `t.transpose(0, 1).contiguous()` (batch_first) or `t.contiguous()`."""
    if t is None:
        return 0
    v = t.transpose(0, 1) if batch_first else t
    return 0 if v.is_contiguous() else t.numel() * t.element_size()


def _cudnn_rnn_model(a, outs, card):
    x = a["input"]
    bf = a["batch_first"]
    steps = []
    copy = _seq_first_copy(x, bf)
    if copy:
        steps.append(("tmp", "x", copy))
    steps += [("out", 0), ("out", 1), ("out", 2), ("out", 4),
              ("tmp", "workspace", workspace_bytes(a["mode"], x, a["hidden_size"],
                                                   a["num_layers"], a["bidirectional"], bf)),
              ("out", 3), ("free", "workspace")]
    if copy:
        steps.append(("free", "x"))
    return steps


def _cudnn_rnn_backward_model(a, outs, card):
    if a["grad_output"] is None and a["grad_hy"] is None and a["grad_cy"] is None:
        return []
    x, bf = a["input"], a["batch_first"]
    steps, zeros = [], []
    for name, like in (("grad_output", a["output"]), ("grad_hy", a["hx"]),
                       ("grad_cy", a["cx"])):
        if a[name] is None and like is not None:
            steps.append(("tmp", name, like.numel() * like.element_size()))
            zeros.append(name)
    ws = workspace_bytes(a["mode"], x, a["hidden_size"], a["num_layers"], a["bidirectional"],
                         bf)
    xcopy = _seq_first_copy(x, bf)
    dy = a["grad_output"] if a["grad_output"] is not None else None
    dycopy = _seq_first_copy(dy, bf)
    if xcopy:
        steps.append(("tmp", "x", xcopy))
    if dycopy:
        steps.append(("tmp", "dy", dycopy))
    steps += [("out", 0), ("out", 1), ("out", 2), ("tmp", "workspace", ws),
              ("free", "workspace")]
    if dycopy:
        steps.append(("free", "dy"))
    if xcopy:
        steps.append(("free", "x"))
    if a["output_mask"][3] and len(outs) > 3:
        if xcopy:
            steps.append(("tmp", "x", xcopy))
        steps += [("out", 3), ("tmp", "workspace", ws), ("free", "workspace")]
        if xcopy:
            steps.append(("free", "x"))
    return steps + [("free", z) for z in reversed(zeros)]


kernels.FAKE_KERNELS[aten._cudnn_rnn.default] = _cudnn_rnn_fake
kernels.FAKE_KERNELS[aten._cudnn_rnn_backward.default] = _cudnn_rnn_backward_fake
kernels.MODELS[aten._cudnn_rnn.default] = _cudnn_rnn_model
kernels.MODELS[aten._cudnn_rnn_backward.default] = _cudnn_rnn_backward_model


# ---- the route: _cudnn_impl and the autocast kernel ----

def _fake_cuda(t):
    return isinstance(t, FakeTensor) and t.device.type == "cuda"


def _one_buffer(params):
    """The weights' common buffer when they lie one after another in one storage (what
    try_get_weight_buf finds after flatten_parameters), else None."""
    st = params[0].untyped_storage()
    off = params[0].storage_offset()
    for p in params:
        if (p.untyped_storage()._cdata != st._cdata or p.storage_offset() != off
                or not p.is_contiguous()):
            return None
        off += p.numel()
    buf = params[0].new_empty((0,))
    buf.set_(st, 0, (off,), (1,))
    return buf


def _half_weights(params):
    """The autocast kernel's copy of the weights into a new half-precision buffer (zeros, then
    each weight copied into a tensor on the buffer's storage, not an autograd view of it, as
    get_parameters makes them: the buffer takes no gradient): (buffer, weights)."""
    total = sum(p.numel() for p in params)
    buf = torch.zeros((total,), dtype=torch.half, device=params[0].device)
    views, off = [], 0
    for p in params:
        v = buf.new_empty((0,))
        v.set_(buf.untyped_storage(), off, tuple(p.shape))
        v.copy_(p)
        views.append(v)
        off += p.numel()
    return buf, views


def _eligible(t):
    return t is not None and t.is_floating_point() and t.dtype != torch.double


def route(name, original):
    """The _VF function `name` (lstm, gru, rnn_tanh, rnn_relu): its unpacked form on fake CUDA
    tensors that cuDNN accepts goes through `_cudnn_rnn` as on a GPU; other calls go on to
    `original`."""
    mode = MODES[name]
    autocast_keys = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCUDA)

    def run(input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
            batch_first):
        if mode == _LSTM:
            h, c = hx[0], hx[1]
        else:
            h, c = hx, None
        hidden_size, proj_size = int(h.shape[2]), 0
        if c is not None and c.shape[2] != h.shape[2]:
            hidden_size, proj_size = int(c.shape[2]), int(h.shape[2])
        stride0 = (4 if has_biases else 2) + (1 if proj_size else 0)
        params = list(params)
        weight_buf = _one_buffer(params)
        autocast = torch.is_autocast_enabled("cuda")  # false under the guard below
        with torch._C._ExcludeDispatchKeyGuard(autocast_keys):
            if autocast and _eligible(params[0]):
                if not (weight_buf if weight_buf is not None else params[0]).dtype == torch.half:
                    weight_buf, params = _half_weights(params)

                def half(t):
                    return t.half() if _eligible(t) and t.dtype != torch.half else t
                input, h, c = half(input), half(h), half(c)
            out = aten._cudnn_rnn.default(input, params, stride0, weight_buf, h, c, mode,
                                          hidden_size, proj_size, num_layers, batch_first,
                                          dropout, train, bidirectional, [], None)
        if mode == _LSTM:
            return out[0], out[1], out[2]
        return out[0], out[1]

    def call(*args, **kwargs):
        if (not kwargs and len(args) == 9 and isinstance(args[2], (list, tuple))
                and _fake_cuda(args[0]) and torch.backends.cudnn.is_acceptable(args[0])):
            return run(*args)
        return original(*args, **kwargs)
    return call


def flatten(rnn_module, original):
    """nn.RNNBase.flatten_parameters for fake CUDA weights: one buffer (zeros), each weight
    copied into its view and set to it, as _cudnn_rnn_flatten_weight does."""
    ws = rnn_module._flat_weights
    if (len(ws) != len(rnn_module._flat_weights_names) or not ws
            or not all(isinstance(w, torch.Tensor) and _fake_cuda(w) for w in ws)
            or len({w.dtype for w in ws}) != 1
            or not torch.backends.cudnn.is_acceptable(ws[0])):
        return original(rnn_module)
    if _one_buffer(ws) is not None:
        return None
    with torch.no_grad():
        buf = torch.zeros((sum(w.numel() for w in ws),), dtype=ws[0].dtype,
                          device=ws[0].device)
        off = 0
        for w in ws:
            v = buf[off:off + w.numel()].view(tuple(w.shape))
            v.copy_(w)
            w.set_(v)
            off += w.numel()
    return None
