"""Handlers (see _aten_map.py) for indexing and selection: index and index_put_ (integer index
tensors for consecutive dims, or one 1-D bool mask), index_add_, index_select, scatter_, scatter
and scatter_add(_) (Megatron-LM's MoE routing and unpermutation), remainder by a number,
nonzero, topk, sort, max, min, and torchvision's
nms and roi_align, with the element-wise ops detection models run on boxes (log2, floor,
bitwise_and / bitwise_or).

How many elements a mask, nonzero or nms keeps is the data's: the traced graph carries the count
the run saw (attrs.count), so such a graph is valid for inputs like the example's.
"""
import torch


def _arg(args, kwargs, i, name, default=None):
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


def _index_tensors(tr, indices):
    """(dim, [index tensors or names]) of aten's index list: Nones, then integer index tensors
    for consecutive dims, or one 1-D bool mask (recorded as nonzero, as aten runs it: the
    mask's count is read off it, unrecorded)."""
    indices = list(indices)
    while indices and indices[-1] is None:
        indices.pop()
    d = 0
    while d < len(indices) and indices[d] is None:
        d += 1
    ts = indices[d:]
    if not ts or any(t is None for t in ts):
        tr.unsupported("index tensors with a slice between them")
    if any(t.dtype in (torch.bool, torch.uint8) for t in ts):
        if len(ts) != 1 or ts[0].dim() != 1:
            tr.unsupported("indexing with a bool mask of more than one dim, or with other indices")
        return d, [_mask_positions(tr, ts[0])]
    if any(t.dtype not in (torch.int64, torch.int32) for t in ts):
        tr.unsupported("indexing with a %s index" % ts[0].dtype)
    return d, ts


def _mask_positions(tr, mask):
    """mask.nonzero() [count, 1], then its column as a [count] view: what aten's index makes of
    a bool mask (expandTensors)."""
    if mask.device.type == "meta":
        tr.unsupported("a bool mask on the meta device")
    tr.paused += 1
    try:
        count = int(mask.sum())
    finally:
        tr.paused -= 1
    nz, pos = tr.fresh_name("mask_nonzero"), tr.fresh_name("mask_positions")
    tr.emit("nonzero", [mask], [nz], {"count": count}, out_shapes={nz: ([count, 1], torch.int64)})
    tr.emit("squeeze", [nz], [pos], {"dim": 1}, out_shapes={pos: ([count], torch.int64)})
    return pos


def _index(tr, args, kwargs, out):
    d, ts = _index_tensors(tr, args[1])
    tr.emit("index", [args[0]] + ts, [out], {"dim": d} if d else {})


def _index_put_(tr, args, kwargs, out):
    x, values = args[0], args[2]
    accumulate = bool(_arg(args, kwargs, 3, "accumulate", False))
    d, ts = _index_tensors(tr, args[1])
    if len(ts) != 1:
        tr.unsupported("index_put_ with more than one index tensor")
    if not isinstance(values, torch.Tensor):
        tr.unsupported("index_put_ of a number")
    attrs = {"dim": d} if d else {}
    if accumulate:
        attrs["accumulate"] = 1
    tr.emit("index_put_", [x, ts[0], values], [out], attrs)


def _nonzero(tr, args, kwargs, out):
    tr.emit("nonzero", [args[0]], [out], {"count": int(out.shape[0])})


def _topk(tr, args, kwargs, out):
    k = int(_arg(args, kwargs, 1, "k"))
    attrs = {"k": k, "dim": int(_arg(args, kwargs, 2, "dim", -1))}
    if not _arg(args, kwargs, 3, "largest", True):
        attrs["largest"] = 0
    if not _arg(args, kwargs, 4, "sorted", True):
        attrs["sorted"] = 0
    tr.emit("topk", [args[0]], list(out), attrs)


def _sort(tr, args, kwargs, out):
    """sort.default(x, dim=-1, descending=False) and sort.stable(x, *, stable, dim, descending)."""
    if len(args) > 1 and not isinstance(args[1], bool) and args[1] is not None:
        dim, desc = args[1], _arg(args, kwargs, 2, "descending", False)
    else:
        dim, desc = kwargs.get("dim", -1), kwargs.get("descending", False)
    attrs = {"dim": int(dim)}
    if desc:
        attrs["descending"] = 1
    tr.emit("sort", [args[0]], list(out), attrs)


def _max(tr, args, kwargs, out):
    tr.emit("max", [args[0]], [out], {})


def _min(tr, args, kwargs, out):
    tr.emit("min", [args[0]], [out], {})


def _index_add_(tr, args, kwargs, out):
    # x.index_add_(dim, index, source, alpha=1) (MoE layers gather their experts' outputs so)
    x, dim, index, source = args[0], int(args[1]), args[2], args[3]
    if _arg(args, kwargs, 4, "alpha", 1) != 1:
        tr.unsupported("index_add_ with alpha")
    tr.emit("index_add_", [x, index, source], [out], {"dim": dim} if dim else {})


def _scatter_value(tr, args, kwargs, out):
    # x.scatter_(dim, index, value) with a number
    x, dim, index = args[0], int(args[1]), args[2]
    if _arg(args, kwargs, 4, "reduce") is not None:
        tr.unsupported("scatter_ with reduce")
    tr.emit("scatter_", [x, index], [out], {"dim": dim, "value": float(args[3])})


def _index_select(tr, args, kwargs, out):
    # x.index_select(dim, index)
    x, dim, index = args[0], int(args[1]), args[2]
    tr.emit("index_select", [x, index], [out], {"dim": dim} if dim else {})


def _scatter_out_of_place(tr, args, kwargs, out):
    """x.scatter(dim, index, src) (scatter.src) or x.scatter(dim, index, value) (scatter.value):
    a new tensor of x's shape."""
    x, dim, index, src = args[0], int(args[1]), args[2], args[3]
    if isinstance(src, torch.Tensor):
        tr.emit("scatter", [x, index, src], [out], {"dim": dim})
    else:
        tr.emit("scatter", [x, index], [out], {"dim": dim, "value": float(src)})


def _scatter_add_(tr, args, kwargs, out):
    # x.scatter_add_(dim, index, src), in place
    x, dim, index, src = args[0], int(args[1]), args[2], args[3]
    tr.emit("scatter_add_", [x, index, src], [out], {"dim": dim} if dim else {})


def _scatter_add(tr, args, kwargs, out):
    """torch.scatter_add(x, dim, index, src), out of place: aten clones x (the result's
    storage) and adds into the clone in place; recorded so, self's gradient passing through."""
    x, dim, index, src = args[0], int(args[1]), args[2], args[3]
    copy = tr.fresh_name("scatter_add_self")
    tr.emit("clone", [x], [copy], {}, out_shapes={copy: (list(x.shape), x.dtype)})
    tr.emit("scatter_add_", [copy, index, src], [out], {"dim": dim} if dim else {})


def _remainder(tr, args, kwargs, out):
    # x % number (remainder.Scalar): elementwise, x's dtype
    tr.emit("remainder", [args[0]], [out], {"other": float(args[1])})


def _unary(kind):
    def h(tr, args, kwargs, out):
        tr.emit(kind, [args[0]], [out], {})
    return h


def _bitwise(kind):
    def h(tr, args, kwargs, out):
        a, b = args[0], args[1]
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            tr.unsupported(f"{kind} with a number")
        tr.emit(kind, [a, b], [out], {})
    return h


def _nms(tr, args, kwargs, out):
    """torchvision.ops.nms(boxes, scores, iou_threshold): the indices kept."""
    boxes, scores, iou = args[0], args[1], float(args[2])
    tr.emit("nms", [boxes, scores], [out], {"iou_threshold": iou, "count": int(out.shape[0])})


def _roi_align(tr, args, kwargs, out):
    """torchvision.ops.roi_align(input, rois, spatial_scale, pooled_height, pooled_width,
    sampling_ratio, aligned)."""
    x, rois, scale, ph, pw, ratio, aligned = args[:7]
    attrs = {"output_size": [int(ph), int(pw)], "spatial_scale": float(scale),
             "sampling_ratio": int(ratio)}
    if aligned:
        attrs["aligned"] = 1
    tr.emit("roi_align", [x, rois], [out], attrs)


HANDLERS = {
    "index.Tensor": _index,
    "index_put_.default": _index_put_,
    "nonzero.default": _nonzero,
    "topk.default": _topk,
    "sort.default": _sort,
    "sort.stable": _sort,
    "max.default": _max,
    "min.default": _min,
    "index_add_.default": _index_add_,
    "scatter_.value": _scatter_value,
    "index_select.default": _index_select,
    "scatter.src": _scatter_out_of_place,
    "scatter.value": _scatter_out_of_place,
    "scatter_add_.default": _scatter_add_,
    "scatter_add.default": _scatter_add,
    "remainder.Scalar": _remainder,
    "log2.default": _unary("log2"),
    "floor.default": _unary("floor"),
    "bitwise_and.Tensor": _bitwise("bitwise_and"),
    "bitwise_or.Tensor": _bitwise("bitwise_or"),
    "nms.default": _nms,
    "roi_align.default": _roi_align,
}
