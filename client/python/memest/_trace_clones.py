"""Which clones the traced program asked for.

The dispatch mode below autograd sees every aten.clone, including the one autograd makes itself:
an in-place op whose derivative needs the tensor as it was before (x.silu_(), F.hardswish(x,
inplace=True), a.mul_(b) when b requires grad) runs `original_self = self.clone()` in its
autograd kernel (gen_variable_type.py) before it writes. memest's rules for those in-place ops
already keep that copy, so recording the clone too would count it twice.

`user_clones(tracer)` wraps torch.Tensor.clone and torch.clone while recording and counts the
calls in progress (`tracer.user_clone`). A clone that arrives while no Python call is in
progress is the C++ side's own: the tracer holds it back (tracer.defer) and records it only if
an op of the graph reads it. Autograd's copy is never read by an op (it is saved, and saved
tensors are packed into nothing while tracing), so it drops out; a C++ composite's internal
clone that the composite goes on to read is recorded there.
"""
import contextlib

import torch


@contextlib.contextmanager
def user_clones(tracer):
    tracer.user_clone = 0
    method, function = torch.Tensor.clone, torch.clone

    def counted(fn):
        def clone(*args, **kwargs):
            tracer.user_clone += 1
            try:
                return fn(*args, **kwargs)
            finally:
                tracer.user_clone -= 1
        return clone

    torch.Tensor.clone = counted(method)
    torch.clone = counted(function)
    try:
        yield
    finally:
        torch.Tensor.clone, torch.clone = method, function
