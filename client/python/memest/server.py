"""memest.serve(): a local memest-server that lives as long as this interpreter.

    server = memest.serve()            # finds memest-server, binds a free port
    client = memest.Client(server)     # or memest.Client(server.address)

The binary is the `binary` argument, else $MEMEST_SERVER, else memest-server on PATH, else
build/bin/memest-server of a memest checkout above this package or the working directory.
"""

import atexit
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from memest.errors import MemestError, Unavailable
from memest.tls import channel as tls_channel

SERVICE_NAME = "memest.v1.MemoryEstimator"
_LISTENING = "memest-server listening on "


class ServerError(MemestError):
    """memest-server could not be found or started."""


def find_binary(binary=None):
    """The path of the memest-server to run (see the module docstring); ServerError if none."""
    if binary:
        if not os.access(binary, os.X_OK):
            raise ServerError("memest-server: %s is not an executable file" % binary)
        return str(binary)
    from_env = os.environ.get("MEMEST_SERVER")
    if from_env:
        if not os.access(from_env, os.X_OK):
            raise ServerError("memest-server: MEMEST_SERVER=%s is not an executable file"
                              % from_env)
        return from_env
    on_path = shutil.which("memest-server")
    if on_path:
        return on_path
    for start in (Path(__file__).resolve().parent, Path.cwd()):
        for directory in (start, *start.parents):
            candidate = directory / "build" / "bin" / "memest-server"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    raise ServerError("memest-server: not found; pass binary=, set MEMEST_SERVER, put it on PATH "
                      "or build it (bash scripts/build.sh writes build/bin/memest-server)")


def wait_until_serving(address, timeout, tls=None):
    """Waits until the gRPC health service at `address` reports memest as SERVING (`tls` as
    memest.Client's, for a server started with --tls-cert)."""
    deadline = time.monotonic() + timeout
    with tls_channel(address, tls, ()) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        request = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
        last = "no answer"
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Unavailable("memest-server at %s: not serving after %.0f s (%s)"
                                  % (address, timeout, last))
            try:
                response = check(request, timeout=min(left, 1.0), wait_for_ready=True)
                if response.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = "health: not serving"
            except grpc.RpcError as error:
                last = "health: %s" % (error.details() or error.code())
            time.sleep(0.05)


class Server:
    """A running memest-server child process. str(server) is its address."""

    def __init__(self, process, address, log):
        self.process = process
        self.address = address
        self._log = log
        atexit.register(self.stop)

    def stop(self, timeout=10.0):
        """SIGTERM, wait up to `timeout` seconds, then SIGKILL. Idempotent."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for stream in (self.process.stdout, self._log):
            if stream is not None and not stream.closed:
                stream.close()
        atexit.unregister(self.stop)

    @property
    def running(self):
        return self.process.poll() is None

    def log(self):
        """What the server wrote to stderr so far (its log)."""
        if self._log.closed:
            return ""
        self._log.flush()
        with open(self._log.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def __str__(self):
        return self.address

    def __repr__(self):
        state = "running" if self.running else "stopped"
        return "memest.Server(%r, pid=%d, %s)" % (self.address, self.process.pid, state)


def _read_listening_line(process, timeout):
    """The address from the server's 'memest-server listening on HOST:PORT' line, or None."""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        buffered = b""
        while b"\n" not in buffered:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                return None
            chunk = os.read(process.stdout.fileno(), 4096)
            if not chunk:
                return None
            buffered += chunk
    line = buffered.split(b"\n", 1)[0].decode("utf-8", errors="replace").strip()
    return line[len(_LISTENING):] if line.startswith(_LISTENING) else None


def serve(binary=None, address="127.0.0.1:0", *, args=(), timeout=30.0, tls=None):
    """Starts memest-server on `address` (port 0: a free port) and returns a Server.

    Waits until it listens and its health service reports SERVING; it is stopped (SIGTERM)
    when the interpreter exits, or by Server.stop(). `args` are extra server flags, e.g.
    ["--max-ops", "1000"]; with TLS flags, `tls` is how to reach it (as memest.Client's). The
    server's log goes to a temporary file (Server.log()).
    Raises ServerError when the binary is missing or the server does not start.
    """
    path = find_binary(binary)
    log = tempfile.NamedTemporaryFile(mode="w+", prefix="memest-server-", suffix=".log")
    command = [path, "--address", address, *args]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=log)
    server = Server(process, address, log)
    bound = _read_listening_line(process, timeout)
    if bound is None:
        log_text = server.log()
        server.stop()
        raise ServerError("memest-server did not start (%s, exit status %s):\n%s"
                          % (" ".join(command), process.returncode, log_text.strip()))
    server.address = bound
    try:
        wait_until_serving(bound, timeout, tls)
    except MemestError:
        server.stop()
        raise
    return server
