"""How each aten op the tracer sees maps onto memest's op vocabulary (engine/rules/op_rules.h).

Each handler takes the recording tracer `tr`, the op's positional and keyword arguments and
its result, and records zero or more memest ops through `tr.emit(...)`, or makes the result an
alias of an input (`tr.alias(...)`) for ops that allocate nothing and have no memest kind.
Handlers are keyed by "<packet>.<overload>" (e.g. "addmm.default"), as aten names them in
PyTorch 1.13 and 2.x. An op with no handler is refused by the tracer (UnsupportedOp), unless
none of its tensor inputs belongs to the graph (a constant, or bookkeeping on a buffer).
"""
import math
import sys

import torch

try:
    from . import _aten_compare, _aten_select
except ImportError:  # loaded on its own, outside the memest package
    import _aten_compare
    import _aten_select

_INT64_MAX = 2 ** 63 - 1

DTYPE_NAMES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "bool",
}


def _arg(args, kwargs, i, name, default=None):
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


def _ints(v, n=None):
    if isinstance(v, int):
        return [v] * (n or 1)
    return [int(x) for x in v]


def _outs(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


# ---------------------------------------------------------------- views and copies

def _alias(tr, args, kwargs, out):
    tr.alias(out, args[0])


def _t(tr, args, kwargs, out):
    if args[0].dim() < 2:
        tr.alias(out, args[0])
    else:
        tr.emit("transpose", [args[0]], [out], {"dim0": 0, "dim1": 1})


def _transpose(tr, args, kwargs, out):
    tr.emit("transpose", [args[0]], [out], {"dim0": int(args[1]), "dim1": int(args[2])})


def _permute(tr, args, kwargs, out):
    tr.emit("permute", [args[0]], [out], {"dims": _ints(args[1])})


def _view(tr, args, kwargs, out):
    # Shapes are written as the op produced them; the tracer puts -1 in the batch position.
    tr.emit("view", [args[0]], [out], {"shape": list(out.shape)}, shape_attr="shape")


def _reshape(tr, args, kwargs, out):
    tr.emit("reshape", [args[0]], [out], {"shape": list(out.shape)}, shape_attr="shape")


def _expand(tr, args, kwargs, out):
    tr.emit("expand", [args[0]], [out], {"shape": list(out.shape)}, shape_attr="shape")


def _unsqueeze(tr, args, kwargs, out):
    tr.emit("unsqueeze", [args[0]], [out], {"dim": int(args[1])})


def _squeeze_dim(tr, args, kwargs, out):
    x, dim = args[0], int(args[1])
    if x.dim() == 0 or x.shape[dim] != 1:  # squeeze of a dim that is not 1 returns a view as is
        tr.alias(out, x)
    else:
        tr.emit("squeeze", [x], [out], {"dim": dim})


def _squeeze(tr, args, kwargs, out):
    tr.emit("squeeze", [args[0]], [out], {})


def _slice(tr, args, kwargs, out):
    x = args[0]
    dim = int(_arg(args, kwargs, 1, "dim", 0))
    start = _arg(args, kwargs, 2, "start", None)
    end = _arg(args, kwargs, 3, "end", None)
    step = int(_arg(args, kwargs, 4, "step", 1))
    n = x.shape[dim]
    start = 0 if start is None else int(start)
    end = n if end is None else int(end)
    if start < 0:
        start += n
    if end < 0:
        end += n
    start = min(max(start, 0), n)
    attrs = {"dim": dim, "start": start}
    if end < n:  # to the end of the dim: left out, so a batch dim can rescale
        attrs["end"] = max(end, start)
    if step != 1:
        attrs["step"] = step
    tr.emit("slice", [x], [out], attrs)


def _select(tr, args, kwargs, out):
    x, dim, index = args[0], int(args[1]), int(args[2])
    if index < 0:
        index += x.shape[dim]
    mid = tr.fresh_name("select")
    tr.emit("slice", [x], [mid], {"dim": dim, "start": index, "end": index + 1},
            out_shapes={mid: (list(x.shape[:dim]) + [1] + list(x.shape[dim + 1:]), x.dtype)})
    tr.emit("squeeze", [mid], [out], {"dim": dim})


def _split(tr, args, kwargs, out):
    x = args[0]
    dim = int(_arg(args, kwargs, 2, "dim", 0))
    outs = _outs(out)
    tr.emit("split", [x], outs, {"dim": dim, "sizes": [int(o.shape[dim]) for o in outs]})


def _unbind(tr, args, kwargs, out):
    x = args[0]
    dim = int(_arg(args, kwargs, 1, "dim", 0))
    outs = _outs(out)
    mids = [tr.fresh_name("unbind") for _ in outs]
    shape = list(x.shape)
    shape[dim] = 1
    tr.emit("split", [x], mids, {"dim": dim, "sizes": [1] * len(outs)},
            out_shapes={m: (shape, x.dtype) for m in mids})
    for m, o in zip(mids, outs):
        tr.emit("squeeze", [m], [o], {"dim": dim})


def _pad(tr, args, kwargs, out):
    value = tr.scalar_of(_arg(args, kwargs, 2, "value", 0))
    attrs = {"pad": _ints(args[1])}
    if value:
        attrs["value"] = value if math.isfinite(value) else 0.0  # memest takes finite values
    tr.emit("pad", [args[0]], [out], attrs)


def _roll(tr, args, kwargs, out):
    shifts = _ints(_arg(args, kwargs, 1, "shifts"))
    dims = _ints(_arg(args, kwargs, 2, "dims", []))
    tr.emit("roll", [args[0]], [out], {"shifts": shifts, "dims": dims} if dims else {"shifts": shifts})


def _as_strided_(tr, args, kwargs, out):
    """as_strided_ that keeps the sizes (1.13's adaptive_avg_pool2d to 1x1 restrides its mean
    for a channels-last input): the same storage, the same bytes."""
    x, size = args[0], [int(v) for v in args[1]]
    recorded = tr._shapes.get(tr._names.get(id(x)))  # x's sizes before the call restrided it
    if recorded is None or size != recorded[0]:
        tr.unsupported("as_strided_ to other sizes")
    tr.alias(out, x)


def _cat(tr, args, kwargs, out):
    dim = int(_arg(args, kwargs, 1, "dim", 0))
    ts = [t for t in args[0] if t.numel() > 0 or t.dim() > 1]  # legacy empty [0] tensors
    tr.emit("cat", ts, [out], {"dim": dim})


def _clone(tr, args, kwargs, out):
    """x.contiguous() of a non-contiguous x is clone(memory_format=contiguous_format); an
    explicit x.clone() (memory_format=preserve) copies even a contiguous x."""
    x, fmt = args[0], kwargs.get("memory_format")
    if fmt == torch.contiguous_format and not x.is_contiguous():
        tr.emit("contiguous", [x], [out], {})
    elif fmt in (None, torch.preserve_format, torch.contiguous_format):
        if getattr(tr, "user_clone", 1) == 0:
            # No Python code asked for it: autograd's copy of an in-place op's input, which the
            # op's rule keeps already (_trace_clones.py). Recorded only if an op reads it.
            name, shape = tr.fresh_name("clone"), (list(out.shape), out.dtype)
            src = tr._names.get(id(x)) or x  # its name where it has one: nothing kept alive

            def record():
                tr.emit("clone", [src], [name], {}, out_shapes={name: shape})
                return name
            tr.defer(out, record)
            return
        tr.emit("clone", [x], [out], {})
    else:
        tr.unsupported("clone to %s" % fmt)


def _fill_(tr, args, kwargs, out):
    value = tr.scalar_of(args[1]) if len(args) > 1 else 0.0
    if value is None:
        tr.unsupported("fill_ with a tensor of the graph")
    tr.emit("fill_", [args[0]], [out], {"value": value} if value and math.isfinite(value) else {})


def _norm(tr, args, kwargs, out):
    """norm.ScalarOpt_dim(x, p, dim, keepdim) and linalg_vector_norm(x, ord, dim, keepdim)."""
    p = _arg(args, kwargs, 1, "ord" if "ord" in kwargs else "p", 2)
    dims = _arg(args, kwargs, 2, "dim", None)
    keepdim = bool(_arg(args, kwargs, 3, "keepdim", False))
    if p is None or float(p) != 2.0 or kwargs.get("dtype") is not None:
        tr.unsupported("a norm other than the 2-norm")
    attrs = {}
    if dims is not None and len(_ints(dims)) > 0:
        attrs["dim"] = _ints(dims)
    if keepdim:
        attrs["keepdim"] = 1
    tr.emit("norm", [args[0]], [out], attrs)


def _clamp(which):
    def h(tr, args, kwargs, out):
        if which == "both":
            bounds = {"min": _arg(args, kwargs, 1, "min"), "max": _arg(args, kwargs, 2, "max")}
        else:
            bounds = {which: args[1]}
        attrs = {}
        for k, v in bounds.items():
            if v is None:
                continue
            value = tr.scalar_of(v)
            if value is None or not math.isfinite(value):
                tr.unsupported("clamp with a tensor or infinite bound")
            attrs[k] = value
        if not attrs:
            tr.unsupported("clamp without bounds")
        tr.emit("clamp", [args[0]], [out], attrs)
    return h


def _to_copy(tr, args, kwargs, out):
    tr.emit("to", [args[0]], [out], {"dtype": DTYPE_NAMES[out.dtype]})


# ---------------------------------------------------------------- linear algebra

def _addmm(tr, args, kwargs, out):
    if kwargs.get("beta", 1) != 1 or kwargs.get("alpha", 1) != 1:
        tr.unsupported("addmm with beta/alpha")
    tr.emit("addmm", list(args[:3]), [out], {})


def _mm(tr, args, kwargs, out):
    tr.emit("matmul", list(args[:2]), [out], {})


def _bmm(tr, args, kwargs, out):
    tr.emit("bmm", list(args[:2]), [out], {})


def _baddbmm(tr, args, kwargs, out):
    attrs = {}
    for k in ("beta", "alpha"):
        v = kwargs.get(k, 1)
        if tr.scalar_of(v) is None:
            tr.unsupported("baddbmm with a tensor %s" % k)
        if float(v) != 1.0:
            attrs[k] = float(v)
    tr.emit("baddbmm", list(args[:3]), [out], attrs)


def _linear(tr, args, kwargs, out):  # 2.x may keep linear whole under some modes
    ins = [args[0], args[1]] + ([args[2]] if len(args) > 2 and args[2] is not None else [])
    tr.emit("linear", ins, [out], {})


def _convolution(tr, args, kwargs, out):
    x, w, b = args[0], args[1], args[2]
    stride, padding, dilation, transposed, output_padding, groups = args[3:9]
    kinds = {3: "conv1d", 4: "conv2d"}
    if x.dim() not in kinds:
        tr.unsupported("convolution of a %d-d input" % x.dim())
    ins = [x, w] + ([b] if b is not None else [])
    attrs = {"stride": _ints(stride), "padding": _ints(padding), "dilation": _ints(dilation),
             "groups": int(groups)}
    kind = kinds[x.dim()]
    if transposed:
        kind = kind.replace("conv", "conv_transpose")
        attrs["output_padding"] = _ints(output_padding)
    tr.emit(kind, ins, [out], attrs)


# ---------------------------------------------------------------- pooling

def _max_pool2d(tr, args, kwargs, out):
    x = args[0]
    kernel = _ints(_arg(args, kwargs, 1, "kernel_size"), 2)
    stride = _arg(args, kwargs, 2, "stride", None)
    padding = _ints(_arg(args, kwargs, 3, "padding", 0), 2)
    dilation = _ints(_arg(args, kwargs, 4, "dilation", 1), 2)
    ceil_mode = _arg(args, kwargs, 5, "ceil_mode", False)
    attrs = {"kernel_size": kernel, "padding": padding}
    if stride:
        attrs["stride"] = _ints(stride, 2)
    if any(d != 1 for d in dilation):
        attrs["dilation"] = dilation
    if ceil_mode:
        attrs["ceil_mode"] = 1
    tr.emit("max_pool2d", [x], _outs(out), attrs)


def _avg_pool2d(tr, args, kwargs, out):
    x = args[0]
    kernel = _ints(_arg(args, kwargs, 1, "kernel_size"), 2)
    stride = _arg(args, kwargs, 2, "stride", None)
    padding = _ints(_arg(args, kwargs, 3, "padding", 0), 2)
    ceil_mode = _arg(args, kwargs, 4, "ceil_mode", False)
    # count_include_pad and divisor_override change the values only
    attrs = {"kernel_size": kernel, "padding": padding}
    if stride:
        attrs["stride"] = _ints(stride, 2)
    if ceil_mode:
        attrs["ceil_mode"] = 1
    tr.emit("avg_pool2d", [x], [out], attrs)


def _adaptive_avg_pool2d(tr, args, kwargs, out):
    tr.emit("adaptive_avg_pool2d", [args[0]], [out], {"output_size": _ints(args[1], 2)})


def _upsample(kind):
    """upsample_{nearest,bilinear}2d, .vec (output_size or scale factors) and .default: the
    output size is read off the result."""
    def h(tr, args, kwargs, out):
        attrs = {"output_size": [int(out.shape[-2]), int(out.shape[-1])]}
        if kind == "upsample_bilinear2d":
            ac = args[2] if len(args) > 2 else kwargs.get("align_corners", False)
            if ac:
                attrs["align_corners"] = 1
        tr.emit(kind, [args[0]], [out], attrs)
    return h


# ---------------------------------------------------------------- normalisation

def _layer_norm(tr, args, kwargs, out):
    x, shape, w, b = args[0], args[1], args[2], args[3]
    if w is None and b is not None:
        tr.unsupported("layer_norm with a bias and no weight")
    ins = [x] + [t for t in (w, b) if t is not None]
    outs = _outs(out)
    tr.emit("layer_norm", ins, [outs[0]], {"normalized_ndim": len(shape)})
    tr.internal(outs[1:])


def _batch_norm(tr, args, kwargs, out):
    x, w, b, rm, rv = args[:5]
    if w is None and (b is not None or rm is not None):
        tr.unsupported("batch_norm without affine weight")
    ins = [x] + [t for t in (w, b, rm, rv) if t is not None]
    outs = _outs(out)
    tr.emit("batch_norm", ins, [outs[0]], {})
    tr.internal(outs[1:])


def _group_norm(tr, args, kwargs, out):
    x, w, b = args[0], args[1], args[2]
    groups = int(args[6])
    if w is None and b is not None:
        tr.unsupported("group_norm with a bias and no weight")
    ins = [x] + [t for t in (w, b) if t is not None]
    outs = _outs(out)
    tr.emit("group_norm", ins, [outs[0]], {"num_groups": groups})
    tr.internal(outs[1:])


# ---------------------------------------------------------------- pointwise

def _unary(kind):
    def h(tr, args, kwargs, out):
        tr.emit(kind, [args[0]], [out], {})
    return h


def _inplace(kind):
    def h(tr, args, kwargs, out):
        tr.emit(kind, [args[0]], [out], {"inplace": 1})
    return h


def _hardtanh(inplace):
    def h(tr, args, kwargs, out):
        lo = float(_arg(args, kwargs, 1, "min_val", -1.0))
        hi = float(_arg(args, kwargs, 2, "max_val", 1.0))
        attrs = {"min_val": lo, "max_val": hi}
        if inplace:
            attrs["inplace"] = 1
        tr.emit("hardtanh", [args[0]], [out], attrs)
    return h


def _gelu(tr, args, kwargs, out):
    approx = _arg(args, kwargs, 1, "approximate", "none")
    tr.emit("gelu", [args[0]], [out], {"approximate": approx} if approx != "none" else {})


def _pow(tr, args, kwargs, out):
    tr.emit("pow", [args[0]], [out], {"exponent": float(args[1])})


def _softmax(kind):
    def h(tr, args, kwargs, out):
        attrs = {"dim": int(args[1])}
        if len(args) > 2 and args[2]:
            attrs["half_to_float"] = 1
        tr.emit(kind, [args[0]], [out], attrs)
    return h


def _safe_softmax(tr, args, kwargs, out):
    """PyTorch 2.5+: softmax whose fully masked (all -inf) rows come out 0 (SDPA's math path)."""
    dtype = args[2] if len(args) > 2 else kwargs.get("dtype")
    if dtype is not None and dtype != args[0].dtype:
        tr.unsupported("_safe_softmax with a dtype other than its input's")
    tr.emit("softmax", [args[0]], [out], {"dim": int(args[1]), "safe": 1})


def _native_dropout(tr, args, kwargs, out):
    x, p, train = args[0], float(args[1]), args[2]
    outs = _outs(out)
    if train is False:
        tr.alias(outs[0], x)
    else:
        tr.emit("dropout", [x], [outs[0]], {"p": p})
    tr.internal(outs[1:])


def _binary(kind):
    def h(tr, args, kwargs, out):
        a, b = args[0], args[1]
        alpha = _arg(args, kwargs, 2, "alpha", 1)
        if kwargs.get("rounding_mode") is not None:
            tr.unsupported("%s with rounding_mode" % kind)
        if alpha != 1:
            tr.unsupported("%s with alpha=%s" % (kind, alpha))
        sa, sb = tr.scalar_of(a), tr.scalar_of(b)
        if sb is not None and sa is None:
            tr.emit(kind, [a], [out], {"scalar": sb})
        elif sa is not None and sb is None and kind in ("add", "mul"):
            tr.emit(kind, [b], [out], {"scalar": sa})
        elif sa is None and sb is None:
            tr.emit(kind, [a, b], [out], {})
        else:
            tr.unsupported("%s of a scalar and a tensor in this order" % kind)
    return h


def _inplace_binary(kind):
    def h(tr, args, kwargs, out):
        a, b = args[0], args[1]
        if _arg(args, kwargs, 2, "alpha", 1) != 1:
            tr.unsupported("%s with alpha" % kind)
        sb = tr.scalar_of(b)
        if sb is not None:
            tr.emit(kind, [a], [out], {"scalar": sb})
        else:
            tr.emit(kind, [a, b], [out], {})
    return h


def _rsub(tr, args, kwargs, out):
    # s - x (aten.rsub.Scalar): recorded as neg(x) + s; both save nothing for backward.
    x, s = args[0], tr.scalar_of(args[1])
    if s is None or _arg(args, kwargs, 2, "alpha", 1) != 1:
        tr.unsupported("rsub")
    mid = tr.fresh_name("rsub_neg")
    tr.emit("neg", [x], [mid], {}, out_shapes={mid: (list(x.shape), x.dtype)})
    tr.emit("add", [mid], [out], {"scalar": s})


def _masked_fill(tr, args, kwargs, out):
    x, mask, value = args[0], args[1], args[2]
    v = tr.scalar_of(value)
    if v is None:
        tr.unsupported("masked_fill with a tensor value")
    if v != v or v in (float("inf"), float("-inf")):
        # memest takes finite fill values only; the value never changes memory (-inf in a
        # causal mask is written as the most negative double).
        v = 0.0 if v != v else math.copysign(sys.float_info.max, v)
    tr.emit("masked_fill", [x, mask], [out], {"value": v})


def _where(tr, args, kwargs, out):
    c, a, b = args[0], args[1], args[2]
    if tr.scalar_of(a) is not None or tr.scalar_of(b) is not None:
        tr.unsupported("where with a scalar operand")
    tr.emit("where", [c, a, b], [out], {})


# ---------------------------------------------------------------- reductions

def _host_value(tr, args, kwargs, out):
    """.item() / bool() of a tensor (aten._local_scalar_dense): a Python number, no tensor; on
    meta tensors it cannot run, and the trace goes on real ones."""


def _reduce(kind):
    def h(tr, args, kwargs, out):
        x = args[0]
        dims = _arg(args, kwargs, 1, "dim", None)
        keepdim = _arg(args, kwargs, 2, "keepdim", False)
        dtype = kwargs.get("dtype")
        if isinstance(dims, torch.dtype):  # sum.default(x, dtype)
            dtype, dims = dims, None
        if dtype is not None and dtype != x.dtype:
            tr.unsupported("%s with dtype" % kind)
        attrs = {}
        if dims is not None and len(_ints(dims)) > 0:
            attrs["dim"] = _ints(dims)
            if keepdim:
                attrs["keepdim"] = 1
        tr.emit(kind, [x], [out], attrs)
    return h


# ---------------------------------------------------------------- losses, embeddings

_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}  # at::Reduction


def _nll_loss(tr, args, kwargs, out):
    """nll_loss_forward and nll_loss2d_forward (logits [N, C, H, W], as F.cross_entropy of a
    4-D input runs it; memest's nll_loss takes any rank)."""
    x, target, weight = args[0], args[1], args[2]
    reduction = int(_arg(args, kwargs, 3, "reduction", 1))
    if weight is not None:
        tr.unsupported("nll_loss with class weights")
    outs = _outs(out)
    attrs = {"reduction": _REDUCTIONS[reduction]} if reduction != 1 else {}
    tr.emit("nll_loss", [x, target], [outs[0]], attrs)
    tr.internal(outs[1:])


def _mse_loss(tr, args, kwargs, out):
    reduction = int(args[2]) if len(args) > 2 else 1
    if reduction != 1:
        tr.unsupported("mse_loss with reduction other than mean")
    tr.emit("mse_loss", [args[0], args[1]], [out], {})


def _embedding(tr, args, kwargs, out):
    tr.emit("embedding", [args[0], args[1]], [out], {})


def _arange(tr, args, kwargs, out):
    """arange(end), arange(start, end), arange(start, end, step) of int64. With a step other
    than 1 (F.embedding_bag's offsets for a 2-D input) it is recorded only when an op reads it:
    embedding_bag takes it as its bag size instead."""
    nums = [a for a in args if isinstance(a, (int, float))]
    if not 1 <= len(nums) <= 3 or out.dtype != torch.int64 or \
            any(float(v) != int(v) for v in nums):
        tr.unsupported("arange other than of int64 with integer bounds")
    nums = [int(v) for v in nums]
    start, end, step = ([0] + nums + [1])[-3:] if len(nums) == 1 else (nums + [1])[:3]
    attrs = {"end": end}
    if start:
        attrs["start"] = start
    if step != 1:
        attrs["step"] = step
        name = tr.fresh_name("arange")
        n = len(range(start, end, step))

        def record():
            tr.emit("arange", [], [name], attrs, out_shapes={name: ([n], torch.int64)})
            return name
        tr.defer(out, record, info=(start, end, step))
        return
    tr.emit("arange", [], [out], attrs)


def is_stepped_arange(key, args):
    """True for an arange with a step other than 1 (what F.embedding_bag makes as offsets):
    _arange holds it back for embedding_bag rather than letting it be a static tensor."""
    return (key == "arange.start_step" and len(args) >= 3 and isinstance(args[2], (int, float))
            and args[2] != 1)


_BAG_MODES = ("sum", "mean", "max")


def _embedding_bag(tr, args, kwargs, out):
    """_embedding_bag / _embedding_bag_forward_only: bags by offsets, or (F.embedding_bag of a
    2-D input) fixed-size bags whose offsets an arange made."""
    w, idx, offsets = args[0], args[1], args[2]
    scale = _arg(args, kwargs, 3, "scale_grad_by_freq", False)
    mode = int(_arg(args, kwargs, 4, "mode", 0))
    sparse = _arg(args, kwargs, 5, "sparse", False)
    psw = _arg(args, kwargs, 6, "per_sample_weights", None)
    last = bool(_arg(args, kwargs, 7, "include_last_offset", False))
    pad = _arg(args, kwargs, 8, "padding_idx", -1)
    if scale or sparse or (pad is not None and pad >= 0):
        tr.unsupported("embedding_bag with scale_grad_by_freq, sparse or padding_idx")
    attrs = {"mode": _BAG_MODES[mode]}
    ins = [w, idx]
    made = tr.deferred_info(offsets)  # (start, end, step) of an arange not recorded yet
    if (made is not None and made[0] == 0 and made[1] == idx.numel() and not last
            and idx.numel() % made[2] == 0):
        attrs["bag_size"] = made[2]
    else:
        ins.append(offsets)
        if last:
            attrs["include_last_offset"] = 1
    if psw is not None:
        ins.append(psw)
    outs = _outs(out)
    tr.emit("embedding_bag", ins, [outs[0]], attrs)
    tr.internal(outs[1:])


HANDLERS = {
    # ops that allocate nothing: the result is its input under another name
    "detach.default": _alias,
    "alias.default": _alias,
    "lift_fresh.default": _alias,
    "_unsafe_view.default": _view,
    "view.default": _view,
    "_reshape_alias.default": _view,
    "reshape.default": _reshape,
    "t.default": _t,
    "transpose.int": _transpose,
    "permute.default": _permute,
    "expand.default": _expand,
    "unsqueeze.default": _unsqueeze,
    "squeeze.dim": _squeeze_dim,
    "squeeze.default": _squeeze,
    "slice.Tensor": _slice,
    "select.int": _select,
    "split.Tensor": _split,
    "split_with_sizes.default": _split,
    "unbind.int": _unbind,
    "cat.default": _cat,
    "constant_pad_nd.default": _pad,
    "roll.default": _roll,
    "as_strided_.default": _as_strided_,
    "zero_.default": _fill_,
    "fill_.Scalar": _fill_,
    "fill_.Tensor": _fill_,
    "norm.ScalarOpt_dim": _norm,
    "linalg_vector_norm.default": _norm,
    "clamp.default": _clamp("both"),
    "clamp_min.default": _clamp("min"),
    "clamp_max.default": _clamp("max"),
    "clone.default": _clone,
    "_to_copy.default": _to_copy,
    "addmm.default": _addmm,
    "mm.default": _mm,
    "bmm.default": _bmm,
    "baddbmm.default": _baddbmm,
    "linear.default": _linear,
    "convolution.default": _convolution,
    "upsample_nearest2d.vec": _upsample("upsample_nearest2d"),
    "upsample_nearest2d.default": _upsample("upsample_nearest2d"),
    "upsample_bilinear2d.vec": _upsample("upsample_bilinear2d"),
    "upsample_bilinear2d.default": _upsample("upsample_bilinear2d"),
    "max_pool2d_with_indices.default": _max_pool2d,
    "avg_pool2d.default": _avg_pool2d,
    "_adaptive_avg_pool2d.default": _adaptive_avg_pool2d,
    "adaptive_avg_pool2d.default": _adaptive_avg_pool2d,
    "native_layer_norm.default": _layer_norm,
    "native_batch_norm.default": _batch_norm,
    "_native_batch_norm_legit.default": _batch_norm,
    "_native_batch_norm_legit_functional.default": _batch_norm,
    "native_group_norm.default": _group_norm,
    "relu.default": _unary("relu"),
    "relu_.default": _inplace("relu"),
    "silu_.default": _inplace("silu"),
    "sigmoid_.default": _inplace("sigmoid"),
    "tanh_.default": _inplace("tanh"),
    "hardswish.default": _unary("hardswish"),
    "hardswish_.default": _inplace("hardswish"),
    "hardsigmoid.default": _unary("hardsigmoid"),
    "hardsigmoid_.default": _inplace("hardsigmoid"),
    "hardtanh.default": _hardtanh(False),
    "hardtanh_.default": _hardtanh(True),
    "gelu.default": _gelu,
    "silu.default": _unary("silu"),
    "sigmoid.default": _unary("sigmoid"),
    "tanh.default": _unary("tanh"),
    "exp.default": _unary("exp"),
    "rsqrt.default": _unary("rsqrt"),
    "sqrt.default": _unary("sqrt"),
    "neg.default": _unary("neg"),
    "log1p.default": _unary("log1p"),
    "pow.Tensor_Scalar": _pow,
    "_softmax.default": _softmax("softmax"),
    "_log_softmax.default": _softmax("log_softmax"),
    "_safe_softmax.default": _safe_softmax,
    "native_dropout.default": _native_dropout,
    "add.Tensor": _binary("add"),
    "add.Scalar": _binary("add"),
    "sub.Tensor": _binary("sub"),
    "sub.Scalar": _binary("sub"),
    "mul.Tensor": _binary("mul"),
    "mul.Scalar": _binary("mul"),
    "div.Tensor": _binary("div"),
    "div.Scalar": _binary("div"),
    "rsub.Scalar": _rsub,
    "add_.Tensor": _inplace_binary("add_"),
    "add_.Scalar": _inplace_binary("add_"),
    "mul_.Tensor": _inplace_binary("mul_"),
    "mul_.Scalar": _inplace_binary("mul_"),
    "div_.Tensor": _inplace_binary("div_"),
    "masked_fill.Scalar": _masked_fill,
    "masked_fill.Tensor": _masked_fill,
    "where.self": _where,
    "sum.default": _reduce("sum"),
    "sum.dim_IntList": _reduce("sum"),
    "mean.default": _reduce("mean"),
    "mean.dim": _reduce("mean"),
    # The checks models branch on (`if mask.all():`): a bool, then a Python value.
    "all.default": _reduce("all"),
    "all.dim": _reduce("all"),
    "all.dims": _reduce("all"),
    "any.default": _reduce("any"),
    "any.dim": _reduce("any"),
    "any.dims": _reduce("any"),
    "_local_scalar_dense.default": _host_value,
    "nll_loss_forward.default": _nll_loss,
    "nll_loss2d_forward.default": _nll_loss,
    "mse_loss.default": _mse_loss,
    "embedding.default": _embedding,
    "_embedding_bag.default": _embedding_bag,
    "_embedding_bag_forward_only.default": _embedding_bag,
    "arange.default": _arange,
    "arange.start": _arange,
    "arange.start_step": _arange,
}

# Comparisons, extrema, cumsum, stack and copy_ (_aten_compare.py); indexing, selection and
# torchvision's detection ops (_aten_select.py).
HANDLERS.update(_aten_compare.HANDLERS)
HANDLERS.update(_aten_select.HANDLERS)

# Factory ops: their results are constants (no graph inputs) until an op of the graph reads them.
FACTORIES = {
    "empty.memory_format", "empty_like.default", "zeros.default", "ones.default",
    "full.default", "zeros_like.default", "ones_like.default", "full_like.default",
    "empty_strided.default", "scalar_tensor.default", "new_empty.default", "new_zeros.default",
    "new_ones.default", "new_full.default", "lift_fresh_copy.default", "tensor.default",
}
