"""Conformance cases for the ops detection models run (torchvision's SSD and Faster R-CNN
postprocessing, the zoo's ssdlite320_mobilenet_v3_large and fasterrcnn_mobilenet_v3_large_320_fpn):
nonzero and the index of its positions (what x[mask] runs), index with two index tensors,
index_put_, topk, sort, the whole-tensor max, log2, floor, bitwise_and / bitwise_or, stack, and
torchvision's nms and roi_align. Registered into cases.CASES (cases.py imports this module).

What a mask or nms keeps is the data's: those cases derive it from parameters and buffers (made
once, the same in every pass), never from the inputs, so the recorded counts are the measured ones.
"""
import torch

from cases import SGD, case, lift, loss_of, op_case
from measure import Config

INFER = Config(mode="inference")
SHAPE = [8, 16]


def _boxes(n, seed=0):
    """n boxes (x1, y1, x2, y2) in a 32 x 32 image, overlapping enough for nms to drop some."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * 24
    wh = 4 + torch.rand(n, 2, generator=g) * 8
    return torch.cat([xy, xy + wh], 1)


@case("detection", "nonzero_index", configs=[SGD, INFER])
def _(r, b):
    # x[mask] as aten runs it: mask.nonzero() [count, 1], its column, index with it
    x = lift(r, r.input("x", [b, 64]))
    mask = r.compare("gt", r.param("s", [64]), 0.0)
    pos = r.squeeze(r.nonzero(mask), 1)
    return loss_of(r, r.exp(r.index(x, pos, dim=1)))


@case("detection", "index_two_indices", configs=[SGD, INFER])
def _(r, b):
    # RPN's objectness[batch_idx, top_n_idx]: arange(B)[:, None] and the indices [B, k] of a
    # topk of scores that take no gradient (torchvision detaches the objectness it ranks)
    x = lift(r, r.input("x", [b, 64]))
    _, top = r.topk(r.input("s", [b, 64]), 8)
    rows = r.view(r.arange(b), [b, 1])
    return loss_of(r, r.index_many(x, [rows, top]))


op_case("topk", SHAPE, lambda r, x: r.topk(x, 4)[0])
op_case("sort_descending", SHAPE, lambda r, x: r.sort(x, 1, descending=True)[0])
op_case("max_all", SHAPE, lambda r, x: r.exp(r.max_all(x)))
op_case("log2", SHAPE, lambda r, x: r.log2(r.exp(x)))
op_case("floor", SHAPE, lambda r, x: r.mul(x, r.floor(r.mul(x, 4.0))))
op_case("stack", SHAPE, lambda r, x: r.stack([x, r.exp(x)], 1))


@case("detection", "bitwise_masks")
def _(r, b):
    x = lift(r, r.input("x", [b, 8, 16]))
    both = r.bitwise("bitwise_and", r.compare("gt", x, -0.1), r.compare("lt", x, 0.1))
    either = r.bitwise("bitwise_or", both, r.compare("ge", x, 0.15))
    return loss_of(r, r.where(either, x, r.exp(x)))


@case("detection", "index_put_values", configs=[SGD, INFER])
def _(r, b):
    # MultiScaleRoIAlign's result[idx_in_level] = per-level output: values written into a
    # zeroed tensor at index positions (here along dim 1), then read
    v = lift(r, r.input("v", [b, 6, 16]))
    idx = r.buffer("idx", [6], "int64", value=torch.tensor([0, 2, 3, 7, 9, 12]))
    out = r.index_put_(r.full([b, 16, 16]), idx, r.exp(v), dim=1)
    return loss_of(r, r.mul(out, out))


@case("detection", "nms_keep_mask", configs=[SGD, INFER])
def _(r, b):
    # torchvision's batched_nms (vanilla): nms per class, keep_mask[indices] = True, then
    # where(keep_mask) and the scores of what is kept
    x = lift(r, r.input("x", [b, 48]))
    boxes = r.buffer("boxes", [48, 4], value=_boxes(48))
    scores = r.sigmoid(r.param("s", [48]))
    keep = r.nms(boxes, scores, 0.3)
    mask = r.index_put_(r.full([48], "bool"), keep, r.full([], "bool", value=True))
    pos = r.squeeze(r.nonzero(mask), 1)
    return loss_of(r, r.mul(r.index(x, pos, dim=1), r.index(scores, pos)))


@case("detection", "roi_align", configs=[SGD, INFER])
def _(r, b):
    feat = lift(r, r.input("feat", [b, 8, 16, 16]))
    rois = r.buffer("rois", [6, 5], value=torch.cat([torch.tensor([[0.0]] * 6), _boxes(6, 1)], 1))
    return loss_of(r, r.roi_align(feat, rois, (4, 4), spatial_scale=0.5, sampling_ratio=2))
