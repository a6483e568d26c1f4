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
"""

import math

import torch

aten = torch.ops.aten


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


def _reduction(arg_size_fn, dim_pos=1, input_vec=lambda dt: 4, casts=False):
    """A reduction's model. With casts (sum, mean, prod), an input whose dtype is not the
    output's is first copied to it (make_reduction_from_out_ty), except half and bfloat16
    summed into float, which the kernel reads as they are."""
    def model(args, kwargs, outs, card):
        x = args[0]
        if not isinstance(x, torch.Tensor) or x.device.type != "cuda" or x.dim() == 0:
            return []
        dim = kwargs.get("dim", args[dim_pos] if len(args) > dim_pos else None)
        if isinstance(dim, bool):  # e.g. any.default has no dim
            dim = None
        reduced = _reduced_dims(x, dim)
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


def _cudnn_attention(args, kwargs, outs, card):
    # outputs: out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, philox_seed, philox_offset,
    # debug_attn_mask. The seed and offset come first, then out and logsumexp; the plan's
    # workspace is taken and given back after.
    compute_lse = args[4] if len(args) > 4 else kwargs.get("compute_log_sumexp", True)
    steps = [("out", 6), ("out", 7), ("out", 0), ("out", 1) if compute_lse else ("none", 1)]
    q = args[0]
    if isinstance(q, torch.Tensor) and q.dim() == 4 and int(q.shape[2]) > 1:
        # one query a sequence (decoding) runs a plan without workspace
        steps += [("tmp", "workspace", _CUDNN_WORKSPACE_FWD), ("free", "workspace")]
    return steps


def _cudnn_attention_backward(args, kwargs, outs, card):
    # dq, dk, dv, then a workspace holding dQ in fp32 and the rows' dO.O sums:
    # 4 * B * H * Sq * (D + 1) bytes, and the plan's own 256.
    q = args[1] if len(args) > 1 else None
    steps = [("out", 0), ("out", 1), ("out", 2)]
    if isinstance(q, torch.Tensor) and q.dim() == 4:
        b, h, sq, d = (int(s) for s in q.shape)
        steps += [("tmp", "workspace", 4 * b * h * sq * (d + 1) + _CUDNN_WORKSPACE_FWD),
                  ("free", "workspace")]
    return steps


# ---- flash attention (aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp) ----

def _round_up(x, m):
    return _div_up(x, m) * m


def _flash_backward(args, kwargs, outs, card):
    # dq, dk, dv, then softmax_d [B, H, Sq rounded to 128] and dq_accum
    # [B, Sq rounded to 128, H, D rounded to 32] in fp32, both freed when the kernel returns.
    q = args[1] if len(args) > 1 else None
    steps = [("out", 0), ("out", 1), ("out", 2)]
    if isinstance(q, torch.Tensor) and q.dim() == 4:
        b, sq, h, d = (int(s) for s in q.shape)  # flash's layout: [B, S, H, D]
        sq_r, d_r = _round_up(sq, 128), _round_up(d, 32)
        steps += [("tmp", "softmax_d", 4 * b * h * sq_r), ("tmp", "dq_accum", 4 * b * sq_r * h * d_r),
                  ("free", "dq_accum"), ("free", "softmax_d")]
    return steps


# ---- dropout (aten/src/ATen/native/cuda/Dropout.cu: the mask is made first) ----

def _dropout(args, kwargs, outs, card):
    return [("out", 1), ("out", 0)]


# ---- embedding backward (aten/src/ATen/native/cuda/Embedding.cu, EmbeddingBackwardKernel.cu) ----

def _cub_sort_pairs_bytes(n, key_size, value_size):
    """cub::DeviceRadixSort::SortPairs' temporary storage: the alternate key and value buffers
    and the onesweep histograms and tile states (an estimate)."""
    return n * (key_size + value_size) + 18943


def _cub_scan_bytes(n):
    """cub's decoupled look-back temporary (scan, unique_by_key): an estimate."""
    return 1279 if n <= 1 << 20 else 1279 + (n >> 10)


def _embedding_backward(args, kwargs, outs, card):
    grad, indices = args[0], args[1]
    num_weights = args[2] if len(args) > 2 else kwargs.get("num_weights")
    scale_by_freq = args[4] if len(args) > 4 else kwargs.get("scale_grad_by_freq", False)
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

def _scan(args, kwargs, outs, card):
    x = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        return []
    n = x.numel()
    if n <= 1 or n != int(x.shape[dim % x.dim()]):
        return []
    return [("out", 0), ("tmp", "scan_tmp", _cub_scan_bytes(n)), ("free", "scan_tmp")]


# ---- isin (aten/src/ATen/native/TensorCompare.cpp: few test elements compare by broadcast) ----

def _isin(args, kwargs, outs, card):
    elements, test = args[0], args[1]
    n = elements.numel() if isinstance(elements, torch.Tensor) else 1
    m = test.numel() if isinstance(test, torch.Tensor) else 1
    if n == 0 or m >= int(10.0 * math.pow(n, 0.145)):
        return []  # the sorting path: its buffers are not modelled
    # out, then (elements[..., None] == test).any(-1) copied into it
    return [("out", 0), ("tmp", "eq", n * m), ("tmp", "any", n), ("free", "any"), ("free", "eq")]


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
_register(["_flash_attention_backward.default"], _flash_backward)
_register(["native_dropout.default"], _dropout)
_register(["embedding_dense_backward.default"], _embedding_backward)
_register(["cumsum.default", "cumprod.default"], _scan)
_register(["isin.Tensor_Tensor", "isin.Tensor_Scalar", "isin.Scalar_Tensor"], _isin)
