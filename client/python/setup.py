"""Build step of the memest package: generates the gRPC stubs from the proto.

The stubs (memest/v1/memest_pb2.py and memest_pb2_grpc.py) are generated from
proto/memest/v1/memest.proto, the service's only contract, every time the package is built,
so they can never drift from it. Generation needs `protoc` and gRPC's Python plugin (Debian:
protobuf-compiler and protobuf-compiler-grpc) or, failing those, the grpcio-tools package.

Environment:
  MEMEST_PROTO_DIR      directory holding memest/v1/memest.proto (default: ../../proto)
  PROTOC                protoc to run (default: protoc on PATH)
  GRPC_PYTHON_PLUGIN    gRPC's Python plugin (default: grpc_python_plugin on PATH)
"""

import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_FILE = os.path.join("memest", "v1", "memest.proto")
STUBS = ("memest_pb2.py", "memest_pb2_grpc.py")


class StubError(RuntimeError):
    pass


def proto_dir():
    candidates = [os.environ.get("MEMEST_PROTO_DIR"), os.path.join(HERE, "..", "..", "proto")]
    for candidate in candidates:
        if candidate and os.path.isfile(os.path.join(candidate, PROTO_FILE)):
            return os.path.abspath(candidate)
    raise StubError(
        "memest: cannot find %s: build from a memest checkout (client/python inside the repo) "
        "or set MEMEST_PROTO_DIR to the repo's proto/ directory" % PROTO_FILE)


def protoc_command():
    """The argv prefix that runs protoc with gRPC's Python plugin."""
    protoc = shutil.which(os.environ.get("PROTOC") or "protoc")
    plugin = shutil.which(os.environ.get("GRPC_PYTHON_PLUGIN") or "grpc_python_plugin")
    if protoc and plugin:
        return [protoc, "--plugin=protoc-gen-grpc_python=" + plugin]
    try:
        import grpc_tools.protoc  # noqa: F401  (pip's grpcio-tools bundles both)
    except ImportError:
        missing = " and ".join(
            name for name, path in (("protoc", protoc), ("grpc_python_plugin", plugin)) if not path)
        raise StubError(
            "memest: generating the gRPC stubs needs %s on PATH (Debian: apt-get install "
            "protobuf-compiler protobuf-compiler-grpc) or the grpcio-tools package; or set PROTOC "
            "and GRPC_PYTHON_PLUGIN" % missing) from None
    return [sys.executable, "-m", "grpc_tools.protoc"]


def generate_stubs(out_dir):
    """Writes memest/v1/memest_pb2.py and memest_pb2_grpc.py under out_dir."""
    source = proto_dir()
    command = protoc_command() + [
        "-I", source, "--python_out=" + out_dir, "--grpc_python_out=" + out_dir,
        os.path.join(source, PROTO_FILE)]
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            universal_newlines=True)
    if result.returncode != 0:
        raise StubError("memest: protoc failed (%s):\n%s" % (" ".join(command), result.stdout))
    for stub in STUBS:
        if not os.path.isfile(os.path.join(out_dir, "memest", "v1", stub)):
            raise StubError("memest: protoc did not write memest/v1/%s" % stub)


class BuildPyWithStubs(build_py):
    """build_py, then the stubs generated straight into the build tree."""

    def run(self):
        super().run()
        try:
            generate_stubs(os.path.abspath(self.build_lib))
        except StubError as error:
            sys.exit(str(error))


setup(cmdclass={"build_py": BuildPyWithStubs})
