"""memest.trace's record of what the module's Python code holds (held tensors and outputs).

The bounds against real PyTorch's allocations are the conformance suite's (tests/conformance,
group "lifetimes", run through the tracer with --via-tracer); these check the record itself.
"""
import math
import weakref

import pytest
import torch
import torch.nn as nn

from memest import tracer


class HeldDot(nn.Module):
    """A hand-written attention: `dot` stays referenced until forward returns."""

    def __init__(self, d=16):
        super().__init__()
        self.d = d
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x):
        q, k, v = self.qkv(x).split(self.d, dim=-1)
        dot = q @ k.transpose(-2, -1)
        att = torch.softmax(dot / math.sqrt(self.d), dim=-1)
        return att @ v


def _op_index(g, predicate):
    return [i for i, op in enumerate(g["ops"]) if predicate(op)]


@pytest.mark.parametrize("training", [True, False])
def test_a_local_is_held_until_its_function_returns(training):
    model = tracer.trace(HeldDot(), torch.randn(2, 8, 16), loss="sum" if training else None,
                         training=training)
    g = model["ops"]
    # dot's last reader is the division; its local lives through softmax and att @ v, whose
    # last op makes the output.
    div = _op_index(g, lambda op: op["kind"] == "div")[0]
    dot = g["ops"][div]["inputs"][0]
    out = g["outputs"][0]
    last = _op_index(g, lambda op: out in op["outputs"])[0]
    assert {"tensor": dot, "untilOp": last} in g["held"]
    assert g["ops"][last - 1]["kind"] in ("bmm", "matmul")  # att @ v
    assert all(h["tensor"] != out for h in g["held"])
    softmax = _op_index(g, lambda op: op["kind"] == "softmax")[0]
    assert {"tensor": g["ops"][softmax]["outputs"][0], "untilOp": last} in g["held"]  # att


class Released(nn.Module):
    """Lets go of every intermediate at once: nothing is held."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test_temporaries_are_not_held():
    g = tracer.trace(Released(), torch.randn(3, 8), loss="sum")["ops"]
    assert "held" not in g
    assert g["outputs"] == [g["ops"][-2]["outputs"][0]]  # fc2's output; the loss's sum follows


EVENTS = []


class Probe(nn.Module):
    """Records when its intermediate dies relative to its own code."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        weakref.finalize(h, EVENTS.append, "h died")
        a = torch.relu(h)
        del h
        EVENTS.append("after del")
        return a


@pytest.mark.parametrize("training", [True, False])
def test_the_tracer_keeps_no_recorded_tensor_alive(training):
    """The tracer watches tensors without holding them, and autograd's saves are packed into
    nothing while it records: h dies at `del h`, in every recording (meta, and batch B + 1)."""
    EVENTS.clear()
    tracer.trace(Probe(), torch.randn(2, 8), loss="sum" if training else None, training=training)
    assert len(EVENTS) >= 4
    assert EVENTS == ["h died", "after del"] * (len(EVENTS) // 2)


class Dict(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        h = self.fc(x)
        return {"logits": h, "hidden": [x, torch.tanh(h)]}


def test_outputs_are_what_the_module_returns():
    g = tracer.trace(Dict(), torch.randn(2, 8), loss="sum")["ops"]
    made = {op["kind"]: op["outputs"][0] for op in g["ops"]}
    assert g["outputs"] == [made["linear"], "x", made["tanh"]]


def test_torchvision_resnet_holds_the_stem_output_while_layer1_runs():
    torchvision = pytest.importorskip("torchvision")
    module = torchvision.models.resnet18(weights=None, num_classes=10)
    g = tracer.trace(module, torch.randn(2, 3, 32, 32), loss=None, training=False)["ops"]
    pool = _op_index(g, lambda op: op["kind"] == "max_pool2d")[0]
    stem = g["ops"][pool]["outputs"][0]
    layer1 = _op_index(g, lambda op: op.get("scope", "").startswith("layer1."))
    held = {h["tensor"]: h["untilOp"] for h in g["held"]}
    assert held[stem] == layer1[-1]
