"""What PyTorch's CUDA kernels allocate through the caching allocator beyond their outputs, and
in which order, for the operators where it matters (PyTorch 2.11, CUDA 13, cuDNN 9.19).

A fake (meta) kernel only makes an operator's outputs. The CUDA kernel behind it may allocate its
outputs in another order and take scratch memory from the caching allocator: the global buffer
of a reduction split across thread blocks, cuDNN's attention workspace, the sort buffers of an
embedding's backward. The recorder books, for each operator below, the steps its model returns:

    ("out", k)          the operator's k-th output (its flattened outputs, tensors or not)
                        is allocated
    ("none", k)         the k-th output is not an allocation on the GPU (the kernel leaves it
                        empty; the fake kernel gives it a size)
    ("tmp", name, n)    a scratch block of n bytes is allocated
    ("free", name)      the scratch block is freed

Outputs a model does not name are allocated after its steps, in order. Each model follows the
kernel's source and was checked against the real H200 traces (docs/predict.md, "Kernels");
cub's temporary sizes are estimates (small blocks, under 1 MiB).

A model is called as model(a, outs, card): `a` holds the operator's arguments by their names in
its schema (bind), defaults filled in, so that overloads that place an argument differently
(linalg_vector_norm's `ord` before `dim`) read the same name.
"""

import math

import torch

aten = torch.ops.aten


def bind(func, args, kwargs):
    """{argument name: value} of a call of the OpOverload func, as its schema names them;
    arguments not given take their schema default (None where it has none)."""
    out = {}
    for i, arg in enumerate(func._schema.arguments):
        if i < len(args):
            out[arg.name] = args[i]
        elif arg.name in kwargs:
            out[arg.name] = kwargs[arg.name]
        else:
            out[arg.name] = arg.default_value if arg.has_default_value() else None
    return out


def _div_up(a, b):
    return -(-a // b)


def _last_pow2(n):
    return 1 << (int(n).bit_length() - 1) if n > 0 else 1


def _acc_size(dtype):
    """Bytes of the accumulation type of a sum or mean over dtype (at::acc_type on CUDA)."""
    if dtype in (torch.float16, torch.bfloat16, torch.float32):
        return 4
    if dtype.is_complex:
        return 16 if dtype == torch.complex128 else 8
    return 8  # double, integers and bool accumulate in 64 bits


# ---- reductions (aten/src/ATen/native/cuda/Reduce.cuh: setReduceConfig, gpu_reduce_kernel) ----

def _iter_dims(shape, stride, reduced):
    """The reduction's TensorIterator dimensions: (size, input stride, is_reduced), innermost
    first: size-1 dimensions dropped, reduced dimensions first, each group by ascending input
    stride, neighbours coalesced where the input is contiguous across them."""
    dims = [(int(shape[d]), int(stride[d]), d in reduced) for d in range(len(shape))
            if int(shape[d]) != 1]
    red = sorted([d for d in dims if d[2]], key=lambda d: d[1])
    kept = sorted([d for d in dims if not d[2]], key=lambda d: d[1])
    out = []
    for group in (red, kept):
        merged = []
        for size, st, r in group:
            if merged and merged[-1][1] * merged[-1][0] == st:
                merged[-1] = (merged[-1][0] * size, merged[-1][1], r)
            else:
                merged.append((size, st, r))
        out.extend(merged)
    return out


def reduce_scratch(shape, stride, reduced, elem_size, arg_size, card, input_vec_size=4):
    """(global buffer bytes, semaphore bytes) of gpu_reduce_kernel for an input of this shape
    and stride (elements) reduced over the dimensions `reduced`; (0, 0) when the reduction stays
    within thread blocks."""
    dims = _iter_dims(shape, stride, set(reduced))
    num_reduce = sum(1 for d in dims if d[2])
    ndim = len(dims)
    num_outputs = 1
    inputs_per_output = 1
    for size, _, r in dims:
        if r:
            inputs_per_output *= size
        else:
            num_outputs *= size
    if inputs_per_output <= 1 or num_outputs * inputs_per_output == 0:
        return 0, 0
    vt0 = 4
    output_vec_size = 1
    if ndim > 0:
        fastest = num_reduce == ndim or (num_reduce > 0 and dims[0][1] < dims[num_reduce][1])
        if fastest:
            dim0, dim1 = inputs_per_output, num_outputs
            moving = dims[0][1]
        else:
            dim0, dim1 = num_outputs, inputs_per_output
            moving = dims[num_reduce][1]
    else:
        fastest, dim0, dim1, moving = True, 1, 1, 1
    if moving == 1:
        if fastest and dim0 > 128 and num_reduce == 1 and vt0 >= input_vec_size:
            dim0 //= input_vec_size
        elif not fastest:
            vec = 4
            out_stride = 1
            for k, (size, _, _) in enumerate(dims[num_reduce:]):
                if k == 0:
                    while size % vec:
                        vec //= 2
                else:
                    while out_stride % vec:
                        vec //= 2
                out_stride *= size
            output_vec_size = vec
            dim0 //= output_vec_size
    # set_block_dimension
    max_threads = 512 // output_vec_size
    dim0_pow2 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    dim1_pow2 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    block_width = min(dim0_pow2, 32)
    block_height = min(dim1_pow2, max_threads // block_width)
    block_width = min(dim0_pow2, max_threads // block_height)
    num_threads = block_width * block_height
    step_input, step_output = 1, 1
    input_mult = [0, 0, 0]
    if fastest:
        input_mult[0] = step_input
        step_input *= block_width
    else:
        step_output *= block_width

    def values_per_thread():
        return _div_up(inputs_per_output, step_input)
    if values_per_thread() >= block_height * 16 or values_per_thread() >= 256:
        input_mult[1] = step_input
        step_input *= block_height
    else:
        step_output *= block_height
    blocks_per_sm = 2048 // num_threads
    target_grid = card.sm_count * blocks_per_sm
    grid_x = _div_up(num_outputs // output_vec_size, step_output)
    ctas_per_output = 1
    if input_mult[1] != 0 and values_per_thread() >= 256 and grid_x <= target_grid:
        c1 = _div_up(target_grid, grid_x)
        c2 = _div_up(values_per_thread(), 16)
        c3 = _div_up(values_per_thread(), 256)
        ctas_per_output = max(min(c1, c2), c3)
        if ctas_per_output > 1:
            input_mult[2] = step_input
            step_input *= ctas_per_output
    if input_mult[2] == 0:
        return 0, 0
    size = arg_size * num_outputs * ctas_per_output
    if input_mult[0] == 0:  # no block-x reduction: one partial per lane
        size *= block_width * output_vec_size
    return size, 4 * grid_x


def _reduced_dims(x, dim):
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(x.dim()))
    if isinstance(dim, int):
        dim = [dim]
    return [d % x.dim() if x.dim() else 0 for d in dim]


def _reduction(arg_size_fn, input_vec=lambda dt: 4, casts=False):
    """A reduction's model: over `dim` (every dimension where the overload has none, such as
    any.default, or where it is None or empty). With casts (sum, mean, prod), an input whose
    dtype is not the output's is first copied to it (make_reduction_from_out_ty), except half
    and bfloat16 summed into float, which the kernel reads as they are."""
    def model(a, outs, card):
        x = a["self"]
        if not isinstance(x, torch.Tensor) or x.device.type != "cuda" or x.dim() == 0:
            return []
        reduced = _reduced_dims(x, a.get("dim"))
        steps = [("out", k) for k in range(len(outs))]
        dtype = x.dtype
        shape, stride = tuple(x.shape), tuple(x.stride())
        out = outs[0] if outs and isinstance(outs[0], torch.Tensor) else None
        if casts and out is not None and out.dtype != x.dtype and not (
                x.dtype in (torch.float16, torch.bfloat16) and out.dtype == torch.float32):
            dtype = out.dtype
            steps.append(("tmp", "cast", x.numel() * out.element_size()))
            stride = torch.empty(shape, dtype=dtype, device="meta").stride()
        buf, sem = reduce_scratch(shape, stride, reduced, x.element_size(),
                                  arg_size_fn(dtype), card, input_vec_size=input_vec(dtype))
        if buf:
            steps += [("tmp", "buffer", buf), ("tmp", "semaphores", sem),
                      ("free", "semaphores"), ("free", "buffer")]
        if len(steps) > len(outs) and steps[len(outs)][1] == "cast":
            steps.append(("free", "cast"))
        return steps if len(steps) > len(outs) else []
    return model


def _sum_vec(dtype):
    return 8 if dtype in (torch.float16, torch.bfloat16) else 4


def _same_size(dtype):
    return torch.empty((), dtype=dtype).element_size()


def _pair_size(dtype):
    return 8 + max(4, _acc_size(dtype) if dtype.is_floating_point else 8)


# ---- attention (cuDNN: aten/src/ATen/native/cudnn/MHA.cpp with cuDNN 9.19) ----

_CUDNN_WORKSPACE_FWD = 256


def _cudnn_attention(a, outs, card):
    # outputs: out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, philox_seed, philox_offset,
    # debug_attn_mask. The seed and offset come first, then out and logsumexp; the plan's
    # workspace is taken and given back after.
    compute_lse = a["compute_log_sumexp"] is not False
    steps = [("out", 6), ("out", 7), ("out", 0), ("out", 1) if compute_lse else ("none", 1)]
    q = a["query"]
    if isinstance(q, torch.Tensor) and q.dim() == 4 and int(q.shape[2]) > 1:
        # one query a sequence (decoding) runs a plan without workspace
        steps += [("tmp", "workspace", _CUDNN_WORKSPACE_FWD), ("free", "workspace")]
    return steps


def _cudnn_attention_backward(a, outs, card):
    # dq, dk, dv, then a workspace holding dQ in fp32 and the rows' dO.O sums:
    # 4 * B * H * Sq * (D + 1) bytes, and the plan's own 256.
    q = a["query"]
    steps = [("out", 0), ("out", 1), ("out", 2)]
    if isinstance(q, torch.Tensor) and q.dim() == 4:
        b, h, sq, d = (int(s) for s in q.shape)
        steps += [("tmp", "workspace", 4 * b * h * sq * (d + 1) + _CUDNN_WORKSPACE_FWD),
                  ("free", "workspace")]
    return steps


# ---- flash attention (aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp) ----

def _round_up(x, m):
    return _div_up(x, m) * m


def _flash_backward(a, outs, card):
    # dq, dk, dv, then softmax_d [B, H, Sq rounded to 128] and dq_accum
    # [B, Sq rounded to 128, H, D rounded to 32] in fp32, both freed when the kernel returns.
    # (Not checked against a real trace: the H200 runs take cuDNN's attention.)
    q = a["query"]
    steps = [("out", 0), ("out", 1), ("out", 2)]
    if isinstance(q, torch.Tensor) and q.dim() == 4:
        b, h, sq, d = (int(s) for s in q.shape)  # SDPA's layout: [B, H, S, D]
        sq_r, d_r = _round_up(sq, 128), _round_up(d, 32)
        steps += [("tmp", "softmax_d", 4 * b * h * sq_r),
                  ("tmp", "dq_accum", 4 * b * sq_r * h * d_r),
                  ("free", "dq_accum"), ("free", "softmax_d")]
    return steps


# ---- dropout (aten/src/ATen/native/cuda/Dropout.cu: the mask is made first) ----

def _dropout(a, outs, card):
    return [("out", 1), ("out", 0)]


# ---- embedding backward (aten/src/ATen/native/cuda/Embedding.cu, EmbeddingBackwardKernel.cu) ----

def _cub_sort_pairs_bytes(n, key_size, value_size):
    """cub::DeviceRadixSort::SortPairs' temporary storage: the alternate key and value buffers
    and the onesweep histograms and tile states (an estimate)."""
    return n * (key_size + value_size) + 18943


def _cub_scan_bytes(n):
    """cub's decoupled look-back temporary (scan, unique_by_key): an estimate."""
    return 1279 if n <= 1 << 20 else 1279 + (n >> 10)


def _embedding_backward(a, outs, card):
    grad, indices = a["grad_output"], a["indices"]
    num_weights = a["num_weights"]
    scale_by_freq = bool(a["scale_grad_by_freq"])
    n = 1
    for s in indices.shape:
        n *= int(s)
    if n <= 3072 and not scale_by_freq:
        return [("out", 0)]  # the direct kernel: grad_weight alone
    isz = indices.element_size()
    stride = int(grad.shape[-1])
    nrows_per_thread = 10
    max_segments = min(n, int(num_weights))
    max_partial = n // nrows_per_thread + max_segments
    acc = 4 if grad.dtype in (torch.float16, torch.bfloat16, torch.float32) else grad.element_size()
    steps = [("tmp", "sorted", n * isz), ("tmp", "orig", n * isz), ("tmp", "range", n * isz),
             ("tmp", "sort_tmp", _cub_sort_pairs_bytes(n, isz, isz)), ("free", "sort_tmp"),
             ("free", "range")]
    if scale_by_freq:
        steps += [("tmp", "count", n * isz)]
    steps += [("out", 0),
              ("tmp", "segment_offsets", n * isz), ("tmp", "num_segments", 8),
              ("tmp", "unique_out", n * isz), ("tmp", "unique_tmp", _cub_scan_bytes(n)),
              ("free", "unique_tmp"), ("free", "unique_out"),
              ("tmp", "partials_per_segment", max_segments * isz),
              ("tmp", "partials_offset", max_segments * isz),
              ("tmp", "scan_tmp", _cub_scan_bytes(max_segments)), ("free", "scan_tmp"),
              ("tmp", "num_partial", 8), ("tmp", "partial_offset", max_partial * isz),
              ("tmp", "grad_per_segment", max_partial * stride * acc),
              ("free", "grad_per_segment"), ("free", "partial_offset"), ("free", "num_partial"),
              ("free", "partials_offset"), ("free", "partials_per_segment"),
              ("free", "num_segments"), ("free", "segment_offsets")]
    if scale_by_freq:
        steps += [("free", "count")]
    steps += [("free", "orig"), ("free", "sorted")]
    return steps


# ---- scans (aten/src/ATen/native/cuda/ScanKernels.cpp: a 1-D scan goes through cub) ----

def _scan(a, outs, card):
    x = a["self"]
    dim = a["dim"]
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        return []
    n = x.numel()
    if n <= 1 or n != int(x.shape[dim % x.dim()]):
        return []
    return [("out", 0), ("tmp", "scan_tmp", _cub_scan_bytes(n)), ("free", "scan_tmp")]


# ---- convolution (cuDNN 9.19 on sm90, as the real H200 traces show it; an estimate elsewhere) ----
#
# What cuDNN's chosen engine takes as workspace, by the case the traces show:
# - an input whose channels are not a multiple of 8 (an image's 3): the input and the filter
#   padded to 8 channels in NHWC, and an NCHW output transposed: pad_x + [y] + pad_w + 16;
# - NCHW tensors (not channels_last) with a spatial filter, a stride, or a small image (under
#   12 x 12): the input, the output and the filter transposed to NHWC: x + y + [w] + 147;
# - channels_last, or NCHW 1x1 convolutions on larger images: a small descriptor (131 B) for
#   spatial or strided filters, none for 1x1;
# - the weight gradient reduces over the batch in fp32 partials (_weight_partials: an estimate
#   fitted to the splits the traces show), or one partial per image for an NCHW 1x1
#   convolution on a large image (a batched GEMM).

_CONV_SMALL_WS = 131
_CONV_PARTIAL_EXTRA = 256


def _channels_last(x, w):
    cl = torch.channels_last
    return (x.dim() == 4 and (
        (x.is_contiguous(memory_format=cl) and not x.is_contiguous())
        or (w.is_contiguous(memory_format=cl) and not w.is_contiguous())))


def _conv_geometry(x, w, stride):
    n, c, h, wd = (int(v) for v in x.shape)
    k, cg, r, s_ = (int(v) for v in w.shape)
    return n, c, h, wd, k, cg, r, s_, int(stride[0]) if stride else 1


def _conv_case(x, w, y, stride):
    """(case, bytes of the transposed or padded tensors) of a 2-D convolution."""
    n, c, h, wd, k, cg, r, s_, st = _conv_geometry(x, w, stride)
    e = x.element_size()
    cl = _channels_last(x, w)
    ybytes = y.numel() * e if y is not None else 0
    if c % 8:
        pad = n * h * wd * 8 * e + k * 8 * r * s_ * e + (0 if cl else ybytes)
        return "pad", pad
    spatial = r * s_ > 1 or st > 1
    if not cl and (spatial or h * wd < 144):
        return "transpose", x.numel() * e + ybytes + (w.numel() * e if r * s_ > 1 else 0)
    return ("small" if spatial else "none"), 0


def _weight_partials(x, w, dy, card, case, per_image):
    """fp32 partial weight gradients: one per image (a batched GEMM), else one per split of
    the batch reduction: the card's multiprocessors over the gradient's 128 x 128 tiles,
    and, for a spatial filter or transposed tensors, no more than one split per 8192 rows of
    the reduction (N x output pixels)."""
    n = int(x.shape[0])
    k, cg, r, s_ = (int(v) for v in w.shape)
    cpad = 8 if cg % 8 else cg
    dw32 = k * cpad * r * s_ * 4
    if per_image:
        return n * dw32
    tiles = _div_up(k, 128) * _div_up(cpad * r * s_, 128)
    splits = max(1, card.sm_count // tiles)
    if r * s_ > 1 or case in ("pad", "transpose"):
        rows = dy.numel() // int(dy.shape[1])
        splits = min(splits, rows // 8192)
    return splits * dw32


def _conv_forward(a, outs, card):
    x, w = a["input"], a["weight"]
    stride, transposed, groups = a["stride"], a["transposed"], a["groups"]
    if (not isinstance(x, torch.Tensor) or x.dim() != 4 or x.device.type != "cuda"
            or transposed or groups != 1):
        return []
    case, moved = _conv_case(x, w, outs[0] if outs else None, stride)
    if case == "none":
        return []
    size = {"pad": moved + 16, "transpose": moved + 147, "small": _CONV_SMALL_WS}[case]
    return [("out", 0), ("tmp", "workspace", size), ("free", "workspace")]


def _conv_backward(a, outs, card):
    dy, x, w = a["grad_output"], a["input"], a["weight"]
    stride, transposed, groups = a["stride"], a["transposed"], a["groups"]
    mask = a["output_mask"]
    if (not isinstance(x, torch.Tensor) or x.dim() != 4 or x.device.type != "cuda"
            or transposed or groups != 1):
        return []
    steps = []
    fmt = torch.channels_last if _channels_last(x, w) else torch.contiguous_format
    copy = not dy.is_contiguous(memory_format=fmt)
    if copy:  # cuDNN takes the gradient in the convolution's memory format
        steps.append(("tmp", "grad_output", dy.numel() * dy.element_size()))
    case, moved = _conv_case(x, w, dy, stride)
    if mask[0]:
        steps.append(("out", 0))
        if case != "none":
            size = {"pad": moved + 16, "transpose": moved + 147, "small": _CONV_SMALL_WS}[case]
            steps += [("tmp", "ws_data", size), ("free", "ws_data")]
    if mask[1]:
        steps.append(("out", 1))
        per_image = not _channels_last(x, w) and case == "none"
        size = _weight_partials(x, w, dy, card, case, per_image) + _CONV_PARTIAL_EXTRA
        if case in ("pad", "transpose"):
            size += moved
        steps += [("tmp", "ws_weight", size), ("free", "ws_weight")]
    if copy:
        steps.append(("free", "grad_output"))
    if len(mask) > 2 and mask[2] and len(outs) > 2:
        steps.append(("out", 2))
        buf, sem = reduce_scratch(tuple(dy.shape), tuple(dy.stride()), [0, 2, 3],
                                  dy.element_size(), _acc_size(dy.dtype), card,
                                  input_vec_size=_sum_vec(dy.dtype))
        if buf:
            steps += [("tmp", "buffer", buf), ("tmp", "semaphores", sem),
                      ("free", "semaphores"), ("free", "buffer")]
    return steps


# ---- batch norm (aten/src/ATen/native/cuda/Normalization.cuh: channels_last kernels) ----

def _bn_grid(reduction, stride):
    """flexible_launch_configs(reduction, stride, coop_flag=true): (grid.x, grid.y)."""
    block_x = min(_last_pow2(stride), 32)
    block_y = min(_last_pow2(_div_up(reduction, 16)), 512 // block_x)
    if block_x * block_y != 512:
        block_x = min(_last_pow2(stride), 512 // block_y)
    grid_x = _div_up(stride, block_x)
    grid_y = min(_div_up(reduction, block_y * 16), 128)
    return grid_x, (1 if grid_y < 8 else grid_y)


def _bn_channels_last(x):
    return (x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
            and not x.is_contiguous())


def _batch_norm(a, outs, card):
    x = a["input"]
    training = a["training"]
    if not isinstance(x, torch.Tensor) or not training or not _bn_channels_last(x):
        return []
    c = int(x.shape[1])
    gx, gy = _bn_grid(x.numel() // c, c)
    if gy <= 1:
        return []
    return [("out", 0), ("out", 1), ("out", 2), ("tmp", "staging", 16 * c * gy),
            ("tmp", "semaphores", 4 * gx), ("free", "semaphores"), ("free", "staging")]


def _batch_norm_backward(a, outs, card):
    # sum_dy and sum_dy_xmu (fp32, one per channel) are reduced first, with grad_weight and
    # grad_bias; grad_input is made from them, then they are freed.
    x = a["input"]
    if not isinstance(x, torch.Tensor) or not _bn_channels_last(x):
        return []
    c = int(x.shape[1])
    gx, gy = _bn_grid(x.numel() // c, c)
    steps = [("tmp", "sum_dy", 4 * c), ("tmp", "sum_dy_xmu", 4 * c), ("out", 1), ("out", 2)]
    if gy > 1:
        steps += [("tmp", "staging", 8 * c * gy), ("tmp", "semaphores", 4 * gx),
                  ("free", "semaphores"), ("free", "staging")]
    return steps + [("out", 0), ("free", "sum_dy"), ("free", "sum_dy_xmu")]


# ---- isin (aten/src/ATen/native/TensorCompare.cpp: few test elements compare by broadcast) ----

def _isin(a, outs, card):
    elements = a["elements"] if "elements" in a else a["element"]
    test = a["test_elements"] if "test_elements" in a else a["test_element"]
    n = elements.numel() if isinstance(elements, torch.Tensor) else 1
    m = test.numel() if isinstance(test, torch.Tensor) else 1
    if n == 0 or m >= int(10.0 * math.pow(n, 0.145)):
        return []  # the sorting path: its buffers are not modelled
    # out, then (elements[..., None] == test).any(-1) copied into it
    return [("out", 0), ("tmp", "eq", n * m), ("tmp", "any", n), ("free", "any"), ("free", "eq")]


# ---- grid sampling (aten/src/ATen/native/cudnn/GridSampler.cpp) ----
#
# F.grid_sample on CUDA runs cuDNN's spatial transformer for a 4-D input, bilinear, zero padding
# and align_corners=True (cond_cudnn_grid_sampler); PyTorch 2.11 has no meta kernel for it.
# The kernel copies an input (and a gradient) with a zero stride, an expanded tensor, to a
# contiguous one first.

def _zero_stride_copy(t):
    if isinstance(t, torch.Tensor) and any(int(st) == 0 and int(sz) > 1
                                           for st, sz in zip(t.stride(), t.shape)):
        return t.numel() * t.element_size()
    return 0


def _cudnn_grid_sampler(a, outs, card):
    copy = _zero_stride_copy(a["self"])
    if not copy:
        return []
    return [("tmp", "input", copy), ("out", 0), ("free", "input")]


def _cudnn_grid_sampler_backward(a, outs, card):
    steps, names = [], []
    for name in ("self", "grad_output"):
        copy = _zero_stride_copy(a[name])
        if copy:
            steps.append(("tmp", name, copy))
            names.append(name)
    if not steps:
        return []
    return steps + [("out", 0), ("out", 1)] + [("free", n) for n in reversed(names)]


def _cudnn_grid_sampler_fake(self, grid):
    """The output, [N, C, H_out, W_out] in the input's dtype, contiguous."""
    return self.new_empty((self.shape[0], self.shape[1], grid.shape[1], grid.shape[2]))


def _cudnn_grid_sampler_backward_fake(self, grid, grad_output):
    """grad_self of the input's sizes, grad_grid of the grid's, both contiguous."""
    return self.new_empty(tuple(self.shape)), grid.new_empty(tuple(grid.shape))


# ---- grouped GEMM (aten/src/ATen/native/cuda/GroupedBlas.cpp, GroupedMMUtils.h) ----
#
# CUDA's _grouped_mm runs bfloat16 on CUTLASS and every other floating dtype on its fallback
# (one mm per group); PyTorch 2.11's meta kernel takes bfloat16 only. Both paths allocate the
# output alone, with its last dimension padded to 16 bytes for TMA
# (create_grouped_gemm_output_tensor).

def _grouped_mm_fake(self, mat2, offs=None, bias=None, out_dtype=None):
    if self.dtype == torch.bfloat16 and mat2.dtype == torch.bfloat16:
        return aten._grouped_mm.default(self, mat2, offs, bias, out_dtype)
    if (self.dtype != mat2.dtype or not self.dtype.is_floating_point
            or self.dim() not in (2, 3) or mat2.dim() not in (2, 3)):
        raise RuntimeError("_grouped_mm: expected floating inputs of one dtype, 2-D or 3-D, "
                           "got %s %s-D and %s %s-D" % (self.dtype, self.dim(), mat2.dtype,
                                                        mat2.dim()))
    dtype = out_dtype or self.dtype
    a2, b2 = self.dim() == 2, mat2.dim() == 2
    if a2 and b2:
        size = [offs.shape[0], self.shape[0], mat2.shape[1]]
    elif a2:
        size = [self.shape[0], mat2.shape[-1]]
    elif b2:
        size = [self.shape[1], mat2.shape[1]]
    else:
        size = [self.shape[0], self.shape[1], mat2.shape[-1]]
    align = 16 // torch.empty((), dtype=dtype).element_size()
    padded = _round_up(int(size[-1]), align)
    stride = [padded, 1] if a2 != b2 else [int(size[1]) * padded, padded, 1]
    return torch.empty_strided(size, stride, dtype=dtype, device=self.device)


# Fake kernels of operators that models run on CUDA where PyTorch 2.11 has no meta kernel, or
# one that refuses what the CUDA kernel runs: the outputs the CUDA kernel returns (shape, dtype,
# strides); the recorder calls one in place of the operator on fake tensors.
FAKE_KERNELS = {
    aten.cudnn_grid_sampler.default: _cudnn_grid_sampler_fake,
    aten.cudnn_grid_sampler_backward.default: _cudnn_grid_sampler_backward_fake,
    aten._grouped_mm.default: _grouped_mm_fake,
}


MODELS = {}


def _register(op_names, model):
    for name in op_names:
        packet, _, overload = name.partition(".")
        op = getattr(aten, packet, None)
        if op is None:
            continue
        ov = getattr(op, overload or "default", None)
        if ov is not None:
            MODELS[ov] = model


_register(["sum.dim_IntList", "sum.default", "nansum.default", "mean.dim", "mean.default",
           "linalg_vector_norm.default", "norm.ScalarOpt_dim", "prod.dim_int", "prod.default"],
          _reduction(_acc_size, input_vec=_sum_vec, casts=True))
_register(["amax.default", "amin.default"], _reduction(_same_size))
_register(["max.dim", "min.dim", "argmax.default", "argmin.default"], _reduction(_pair_size))
_register(["any.dim", "any.dims", "all.dim", "all.dims", "any.default", "all.default"],
          _reduction(lambda dt: 1))
_register(["_scaled_dot_product_cudnn_attention.default"], _cudnn_attention)
_register(["_scaled_dot_product_cudnn_attention_backward.default"], _cudnn_attention_backward)
_register(["_scaled_dot_product_flash_attention_backward.default"], _flash_backward)
_register(["native_dropout.default"], _dropout)
_register(["embedding_dense_backward.default"], _embedding_backward)
_register(["cumsum.default", "cumprod.default"], _scan)
_register(["convolution.default"], _conv_forward)
_register(["convolution_backward.default"], _conv_backward)
_register(["native_batch_norm.default", "_native_batch_norm_legit.default"], _batch_norm)
_register(["native_batch_norm_backward.default"], _batch_norm_backward)
_register(["isin.Tensor_Tensor", "isin.Tensor_Scalar", "isin.Scalar_Tensor"], _isin)
_register(["cudnn_grid_sampler.default"], _cudnn_grid_sampler)
_register(["cudnn_grid_sampler_backward.default"], _cudnn_grid_sampler_backward)
