"""Errors: every failed call raises a MemestError subclass named after its gRPC status.

str(error) is the server's message, which names the field that was wrong, e.g.
"config.batch_size: must be positive, got -1". Requests the client refuses before sending
(an unknown word for `precision`, a model file that is not a memest.v1.Model) raise
InvalidArgument too, with the argument's name in front.
"""

import grpc


class MemestError(Exception):
    """A call to memest failed. `code` is the grpc.StatusCode, `details` the server's message."""

    code = grpc.StatusCode.UNKNOWN

    def __init__(self, details, code=None):
        super().__init__(details)
        self.details = details
        if code is not None:
            self.code = code

    def __str__(self):
        return self.details


class InvalidArgument(MemestError, ValueError):
    """A malformed request; the message names the field."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(MemestError, LookupError):
    """An unknown preset, device or op kind."""

    code = grpc.StatusCode.NOT_FOUND


class ResourceExhausted(MemestError):
    """A request larger than the service accepts (too many ops, too large a message)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(MemestError):
    """A well-formed request that cannot be answered as asked."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(MemestError, ConnectionError):
    """No server answered at the address (not started, stopped, wrong port)."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(MemestError, TimeoutError):
    """The call took longer than its deadline."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Internal(MemestError):
    """A bug in memest."""

    code = grpc.StatusCode.INTERNAL


class Cancelled(MemestError):
    """The call was cancelled."""

    code = grpc.StatusCode.CANCELLED


class Unauthenticated(MemestError):
    """The server asks for its bearer token (memest-server --auth-token-file): Client(token=)."""

    code = grpc.StatusCode.UNAUTHENTICATED


_BY_CODE = {cls.code: cls for cls in (InvalidArgument, NotFound, ResourceExhausted,
                                      FailedPrecondition, Unavailable, DeadlineExceeded,
                                      Internal, Cancelled, Unauthenticated)}


REQUEST_ID = "x-request-id"


def call_metadata(metadata, request_id):
    """`metadata` with x-request-id when a request_id is given (the server keeps it when it is 1 to
    64 characters of [A-Za-z0-9._:-], else makes its own)."""
    if request_id is None:
        return metadata
    return tuple(metadata) + ((REQUEST_ID, str(request_id)),)


def request_id_of(metadata):
    """The x-request-id of a reply's initial metadata ("" without one)."""
    for key, value in metadata or ():
        if key == REQUEST_ID:
            return value
    return ""


def token_metadata(token):
    """The call metadata that carries `token` to a memest-server started with
    --auth-token-file ('authorization: Bearer <token>'); () without one."""
    if token is None:
        return ()
    token = str(token).strip()
    if not token or any(not (0x21 <= ord(c) <= 0x7e) for c in token):
        raise ValueError("token: printable ASCII without spaces, as the server's token file holds")
    return (("authorization", "Bearer " + token),)


def from_status(code, details):
    """The MemestError for a grpc.StatusCode (or its number, as a SweepResult carries it) and the
    server's message."""
    if not isinstance(code, grpc.StatusCode):
        code = _BY_NUMBER.get(code, grpc.StatusCode.UNKNOWN)
    return _BY_CODE.get(code, MemestError)(details or str(code), code)


_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


def from_rpc_error(error):
    """The MemestError for a grpc.RpcError (sync or aio)."""
    return from_status(error.code(), error.details())
