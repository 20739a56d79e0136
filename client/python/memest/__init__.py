"""memest: predict the GPU memory of a PyTorch training or inference step.

    import memest
    server = memest.serve()                    # a local memest-server for this session
    with memest.Client(server) as client:
        result = client.estimate(preset="gpt2-small", seq=1024, batch_size=8,
                                 precision="bf16", device="a100-80gb")
    result                                     # summary; result.plot(), result.to_dataframe()

memest.aio.Client is the same client for asyncio (a notebook's running loop). memest.v1 holds
the generated protocol messages.
"""

from memest import v1
from memest.client import Client
from memest.errors import (DeadlineExceeded, FailedPrecondition, Internal, InvalidArgument,
                           MemestError, NotFound, ResourceExhausted, Unavailable)
from memest.results import (Advice, DeviceInfo, Estimate, Fit, LayerRow, MemoryByCategory,
                            Peak, PresetInfo, PresetParam, format_bytes)
from memest.server import Server, ServerError, serve
from memest import aio  # noqa: E402  (after Client: aio reuses its helpers)

__version__ = "0.1.0"

__all__ = [
    "Advice", "Client", "DeadlineExceeded", "DeviceInfo", "Estimate", "FailedPrecondition",
    "Fit", "Internal", "InvalidArgument", "LayerRow", "MemestError", "MemoryByCategory",
    "NotFound", "Peak", "PresetInfo", "PresetParam", "ResourceExhausted", "Server",
    "ServerError", "Unavailable", "aio", "format_bytes", "serve", "v1",
]
