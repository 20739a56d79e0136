"""Fixtures of the Python client's tests: one real memest-server on port 0 for the session.

The binary is $MEMEST_SERVER, else build/bin/memest-server of this checkout (scripts/test.sh
sets MEMEST_SERVER from BUILD_DIR).
"""

import os
import pathlib
import socket

import matplotlib
import pytest

matplotlib.use("Agg")

import memest  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]


def server_binary():
    return os.environ.get("MEMEST_SERVER") or str(REPO / "build" / "bin" / "memest-server")


@pytest.fixture(scope="session")
def server():
    running = memest.serve(binary=server_binary(), args=["--log-level", "warn"])
    yield running
    running.stop()


@pytest.fixture
def client(server):
    with memest.Client(server, timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def gpt2(server):
    """gpt2-small, batch 2, seq 128, on an A100 80 GB."""
    with memest.Client(server, timeout=60) as c:
        return c.estimate(preset="gpt2-small", batch_size=2, seq=128, device="a100-80gb")


@pytest.fixture
def closed_port():
    """A local port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlp_model():
    """examples/mlp.json: a 784-4096-4096-10 MLP in the proto JSON mapping."""
    return {
        "layers": {
            "inputShape": [784],
            "inputDtype": "float32",
            "layers": [
                {"kind": "linear", "name": "fc1", "attrs": {"out_features": {"i": 4096}}},
                {"kind": "relu", "name": "act1"},
                {"kind": "linear", "name": "fc2", "attrs": {"out_features": {"i": 4096}}},
                {"kind": "relu", "name": "act2"},
                {"kind": "dropout", "name": "drop", "attrs": {"p": {"f": 0.1}}},
                {"kind": "linear", "name": "head", "attrs": {"out_features": {"i": 10}}},
            ],
            "loss": "cross_entropy",
        }
    }
