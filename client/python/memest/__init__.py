"""memest: predict the GPU memory of a PyTorch training or inference step.

    import memest
    server = memest.serve()                    # a local memest-server for this session
    with memest.Client(server) as client:
        result = client.estimate(preset="gpt2-small", seq=1024, batch_size=8,
                                 precision="bf16", device="a100-80gb")
    result                                     # summary; result.plot(), result.to_dataframe()

memest.aio.Client is the same client for asyncio (a notebook's running loop). memest.v1 holds
the generated protocol messages. memest.trace(module, example_inputs) turns a torch.nn.Module
into a model description the server estimates (torch is imported only when it is used).
"""

from memest import v1
from memest.client import Client
from memest.errors import (Cancelled, DeadlineExceeded, FailedPrecondition, Internal,
                           InvalidArgument, MemestError, NotFound, ResourceExhausted,
                           Unauthenticated, Unavailable)
from memest.results import (Advice, DeviceInfo, Estimate, Fit, LayerRow, MemoryByCategory,
                            Peak, PresetInfo, PresetParam, Serving, format_bytes)
from memest.planning import Plan
from memest.server import Server, ServerError, serve
from memest.tls import Tls
from memest.validation import Comparison, OpTiming, PhaseComparison, Progress, Validation
from memest import aio  # noqa: E402  (after Client: aio reuses its helpers)

__version__ = "0.1.0"

_TRACER_NAMES = ("trace", "save", "TracedModel", "UnsupportedOp")


def __getattr__(name):
    # The tracer needs torch; importing memest must not.
    if name in _TRACER_NAMES:
        from memest import tracer
        return getattr(tracer, name)
    raise AttributeError(f"module 'memest' has no attribute {name!r}")


__all__ = [
    "Advice", "Cancelled", "Client", "Comparison", "DeadlineExceeded", "DeviceInfo", "Estimate",
    "FailedPrecondition", "Fit", "Internal", "InvalidArgument", "LayerRow", "MemestError",
    "MemoryByCategory", "NotFound", "OpTiming", "Peak", "PhaseComparison", "Plan", "PresetInfo",
    "PresetParam", "Progress", "ResourceExhausted", "Server", "ServerError", "Serving",
    "Tls", "TracedModel", "Unauthenticated", "Unavailable", "UnsupportedOp", "Validation", "aio", "format_bytes", "save",
    "serve", "trace", "v1",
]
