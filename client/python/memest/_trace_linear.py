"""F.linear's bias, added in place as PyTorch adds it outside a trace.

at::linear (aten/src/ATen/native/Linear.cpp, 1.13 and 2.x alike) on an input that is neither
2-D (addmm) nor contiguous (the flattened addmm path), such as a batch-first nn.LSTM / nn.GRU
output or a transposed activation, runs `output = at::matmul(input, weight.t())` and then adds
the bias in place, `output.add_(bias)`, unless the bias is "tensor-subclass-like", for which it
uses the out-of-place `at::add` (composite compliance). isTensorSubclassLike
(ATen/TensorSubclassLikeUtils.h) answers true for every tensor while a Python dispatch mode is
active, so the trace sees add.Tensor: a second output-sized tensor that the real run never makes
(measured on 1.13's CPU: the profiler shows aten::add_ and no allocation for it).

`bias_added_in_place(tracer)` wraps F.linear while recording and keeps the bias of each call in
progress (tracer.linear_bias); `bias_add(...)` records the add.Tensor(output, bias) such a call
makes as memest's add_ (in place on the matmul's output).
"""
import contextlib

import torch.nn.functional as F

try:
    from . import _aten_map
except ImportError:  # loaded on its own, outside the memest package
    import _aten_map


@contextlib.contextmanager
def bias_added_in_place(tracer):
    tracer.linear_bias = []
    original = F.linear

    def linear(input, weight, bias=None):
        tracer.linear_bias.append(bias)
        try:
            return original(input, weight, bias)
        finally:
            tracer.linear_bias.pop()

    F.linear = linear
    try:
        yield
    finally:
        F.linear = original


def bias_add(tracer, key, args, kwargs, out):
    """True when the op is the bias add of an F.linear call in progress (then recorded as add_)."""
    stack = getattr(tracer, "linear_bias", None)
    if key != "add.Tensor" or not stack or stack[-1] is None or len(args) != 2:
        return False
    if args[1] is not stack[-1] or _aten_map._arg(args, kwargs, 2, "alpha", 1) != 1:
        return False
    tracer.emit("add_", [args[0], args[1]], [out], {})
    return True
