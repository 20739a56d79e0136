"""Handlers (see _aten_map.py) for comparisons, extrema, cumsum, stack and copy_.

Comparisons (eq, ne, lt, le, gt, ge) make bool tensors no gradient flows through: attention
masks (`mask == 0`, `input_ids.ne(pad)`) that masked_fill or where then reads. maximum /
minimum keep both operands for backward. copy_ writes into its destination in place: most often
a slice of a tensor the forward just made (torchvision's batch_images pads each image into a
zeroed batch), so it allocates nothing.
"""
import math
import sys

import torch

_FLIPPED = {"eq": "eq", "ne": "ne", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}


def _finite(v):
    """memest's attributes are finite; a comparison's or fill's value never changes memory."""
    if v != v:
        return 0.0
    if math.isinf(v):
        return math.copysign(sys.float_info.max, v)
    return v


def _compare(kind):
    def h(tr, args, kwargs, out):
        a, b = args[0], args[1]
        sa, sb = tr.scalar_of(a), tr.scalar_of(b)
        if sb is not None and sa is None:
            tr.emit(kind, [a], [out], {"scalar": _finite(sb)})
        elif sa is not None and sb is None:  # 0 < x as x > 0
            tr.emit(_FLIPPED[kind], [b], [out], {"scalar": _finite(sa)})
        elif sa is None and sb is None:
            tr.emit(kind, [a, b], [out], {})
        else:
            tr.unsupported(f"{kind} of two numbers")
    return h


def _extremum(kind):
    """maximum / minimum (torch.max(a, b) and torch.min(a, b) of two tensors): both operands are
    tensors of the graph, a 0-dim constant too (autograd keeps it)."""
    def h(tr, args, kwargs, out):
        a, b = args[0], args[1]
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            tr.unsupported(f"{kind} with a number")
        tr.emit(kind, [a, b], [out], {})
    return h


def _cumsum(tr, args, kwargs, out):
    x = args[0]
    dim = int(args[1] if len(args) > 1 else kwargs["dim"])
    dtype = kwargs.get("dtype")
    default = x.dtype if x.is_floating_point() else torch.int64
    if dtype is not None and dtype != default:
        tr.unsupported("cumsum with a dtype other than its default")
    tr.emit("cumsum", [x], [out], {"dim": dim})


def _stack(tr, args, kwargs, out):
    """torch.stack(xs, dim): each x unsqueezed (a view), then cat: one new tensor, whose backward
    hands each input a view of the gradient (stack_tensors_backward: unbind)."""
    xs = list(args[0])
    dim = int(args[1] if len(args) > 1 else kwargs.get("dim", 0))
    if dim < 0:
        dim += xs[0].dim() + 1
    views = []
    for x in xs:
        name = tr.fresh_name("stack_unsqueeze")
        shape = list(x.shape[:dim]) + [1] + list(x.shape[dim:])
        tr.emit("unsqueeze", [x], [name], {"dim": dim}, out_shapes={name: (shape, x.dtype)})
        views.append(name)
    tr.emit("cat", views, [out], {"dim": dim})


def _copy_(tr, args, kwargs, out):
    """dst.copy_(src): in place on dst. Into a view with a gradient to carry (autograd's
    CopySlices, which makes a gradient of the whole base in backward) it is refused: the graph
    would have the base's readers take no gradient through the copy."""
    dst, src = args[0], args[1]
    if not isinstance(src, torch.Tensor):
        tr.unsupported("copy_ of a number")
    base = dst._base
    if base is not None and torch.is_grad_enabled() and (src.requires_grad or dst.requires_grad):
        tr.unsupported("copy_ into a view with autograd on (CopySlices)")
    tr.emit("copy_", [dst, src], [out], {})
    # What the forward made without reading the graph now holds the graph's values: an op
    # that reads it is an op of the graph.
    for t in (dst, base):
        if t is not None:
            tr.statics.forget(id(t))


HANDLERS = {
    "eq.Scalar": _compare("eq"), "eq.Tensor": _compare("eq"),
    "ne.Scalar": _compare("ne"), "ne.Tensor": _compare("ne"),
    "lt.Scalar": _compare("lt"), "lt.Tensor": _compare("lt"),
    "le.Scalar": _compare("le"), "le.Tensor": _compare("le"),
    "gt.Scalar": _compare("gt"), "gt.Tensor": _compare("gt"),
    "ge.Scalar": _compare("ge"), "ge.Tensor": _compare("ge"),
    "maximum.default": _extremum("maximum"),
    "minimum.default": _extremum("minimum"),
    "cumsum.default": _cumsum,
    "stack.default": _stack,
    "copy_.default": _copy_,
}
