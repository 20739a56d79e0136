"""memest.trace on what real models contain: each test is a bug the model zoo
(tests/conformance/zoo.py) met in torchvision or Hugging Face models, reduced to a few layers,
traced, estimated by the real `memest` CLI (local engine, cpu-1.13 runtime) and checked against
PyTorch itself where a number is at stake.
"""
import json
import math
import subprocess

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from memest import _aten_map, tracer
from test_tracer import cli_binary, estimate, measure_saved

ROLE_PARAMETER = "TENSOR_ROLE_PARAMETER"
ROLE_BUFFER = "TENSOR_ROLE_BUFFER"


def _attr(op, name):
    v = op["attrs"][name]
    return v.get("i", v.get("f", v.get("ints", {}).get("values")))


# ------------------------------------------------------------------ dropout and failures

def test_dropout_at_bernoullis_default_p_traces():
    """nn.Dropout(0.5): PyTorch leaves p out of bernoulli_'s args when it is the schema's
    default, which crashed the tracer with an IndexError (VGG, Inception)."""
    module = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.Linear(16, 4))
    ops = tracer.trace(module, torch.randn(3, 8))["ops"]["ops"]
    drop = [op for op in ops if op["kind"] == "dropout"]
    assert len(drop) == 1 and _attr(drop[0], "p") == pytest.approx(0.5)
    assert drop[0]["scope"] == "1"


def test_any_failure_mapping_an_op_is_an_unsupported_op(monkeypatch):
    def broken(tr, args, kwargs, out):
        return {}["no such argument"]

    monkeypatch.setitem(_aten_map.HANDLERS, "relu.default", broken)
    module = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    with pytest.raises(tracer.UnsupportedOp) as err:
        tracer.trace(module, torch.randn(2, 8))
    assert err.value.op == "aten.relu.default" and err.value.scope == "1"
    assert "KeyError" in err.value.detail


# ------------------------------------------------------------------ tied weights

class TiedLM(nn.Module):
    """GPT-2's tie: the head's weight is the token embedding's (one Parameter)."""

    def __init__(self, vocab=64, d=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.mix = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.mix(self.embed(ids))))


def test_tied_weights_stay_tied(tmp_path):
    torch.manual_seed(0)
    module = TiedLM()
    ids = torch.randint(0, 64, (2, 8))
    model = tracer.trace(module, ids)
    params = [t["name"] for t in model["ops"]["tensors"] if t["role"] == ROLE_PARAMETER]
    assert params == ["embed.weight", "mix.weight", "mix.bias"]
    readers = [op["kind"] for op in model["ops"]["ops"] if "embed.weight" in op["inputs"]]
    assert readers == ["embedding", "linear"]
    result = estimate(model, 2, tmp_path)
    assert int(result["parameterCount"]) == sum(p.numel() for p in module.parameters())
    assert int(result["savedForBackwardBytes"]) == measure_saved(module, ids, "cross_entropy")


# ------------------------------------------------------------------ the batch

class ClassToken(nn.Module):
    """ViT's class token: a [1, 1, D] parameter expanded to the batch and put before the patches."""

    def __init__(self, d=16):
        super().__init__()
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.proj = nn.Linear(8, d)
        self.head = nn.Linear(d, 4)

    def forward(self, x):
        h = self.proj(x)
        h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], dim=1)
        return self.head(torch.tanh(h)[:, 0])


def test_a_parameter_expanded_to_the_batch_rescales(tmp_path):
    """torchvision's vit_b_16 traced, but the engine refused the graph: the expand's shape had -1
    in the batch dim, which keeps the parameter's 1."""
    torch.manual_seed(0)
    module = ClassToken()
    model = tracer.trace(module, torch.randn(2, 5, 8))
    expand = [op for op in model["ops"]["ops"] if op["kind"] == "expand"]
    assert len(expand) == 1 and _attr(expand[0], "shape") == [2, 1, 16]
    assert _attr(expand[0], "batch_dim") == 0
    at_traced = estimate(model, 2, tmp_path)
    assert int(at_traced["savedForBackwardBytes"]) == measure_saved(module, torch.randn(2, 5, 8), "cross_entropy")
    rescaled = estimate(model, 6, tmp_path)
    direct = estimate(tracer.trace(module, torch.randn(6, 5, 8)), 6, tmp_path)
    for key in ("savedForBackwardBytes", "peak", "endOfStep", "breakdown"):
        assert rescaled[key] == direct[key], key


def _cli(*args):
    return subprocess.run([cli_binary(), "estimate", "--local", "--no-advice", "--json", *args],
                          capture_output=True, text=True, timeout=120)


def test_a_graph_without_traced_batch_is_estimated_at_its_own_batch_only(tmp_path):
    """`memest estimate --model F --batch N` used to ignore N silently when the graph has no
    traced batch; now it refuses N, and without --batch takes the graph's own."""
    model = tracer.trace(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), torch.randn(4, 8))
    del model["ops"]["tracedBatch"]
    path = tmp_path / "fixed.json"
    tracer.save(model, path)
    refused = _cli("--model", str(path), "--batch", "8")
    assert refused.returncode == 3, refused.stderr
    assert "config.batch_size" in refused.stderr and "written at batch 4" in refused.stderr
    own = _cli("--model", str(path))
    at_four = _cli("--model", str(path), "--batch", "4")
    assert own.returncode == 0 and at_four.returncode == 0, own.stderr + at_four.stderr
    assert json.loads(own.stdout)["peak"] == json.loads(at_four.stdout)["peak"]
    accum = _cli("--model", str(path), "--grad-accum", "2")
    assert accum.returncode == 0, accum.stderr


# ------------------------------------------------------------------ tensors made from buffers

class CachedTables(nn.Module):
    """Rotary-style tables in a buffer, cut to the sequence (`self.cos[:t]`), and a causal mask
    built in forward that masked_fill saves for backward."""

    def __init__(self, d=16, max_len=32):
        super().__init__()
        self.register_buffer("cos", torch.randn(max_len, d))
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        t = x.shape[1]
        h = self.fc(x) * self.cos[:t]
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = (h @ h.transpose(1, 2) / math.sqrt(h.shape[-1])).masked_fill(mask, float("-inf"))
        return att.softmax(dim=-1) @ h


def test_tensors_made_from_buffers_are_views_and_activations(tmp_path):
    """They used to become buffers of their own ("const.N"): the cut table counted twice, the mask
    counted as model state instead of an activation that masked_fill saves."""
    torch.manual_seed(0)
    module = CachedTables()
    x = torch.randn(2, 8, 16)
    model = tracer.trace(module, x, loss="sum")
    g = model["ops"]
    leaves = {t["name"]: t["role"] for t in g["tensors"] if t["role"] in (ROLE_PARAMETER, ROLE_BUFFER)}
    assert leaves == {"cos": ROLE_BUFFER, "fc.weight": ROLE_PARAMETER, "fc.bias": ROLE_PARAMETER}
    assert [op["kind"] for op in g["ops"] if "cos" in op["inputs"]] == ["slice"]
    full = [op for op in g["ops"] if op["kind"] == "full"]
    assert len(full) == 1 and _attr(full[0], "shape") == [8, 8] and full[0]["attrs"]["dtype"]["s"] == "bool"
    result = estimate(model, 2, tmp_path)
    state = sum(t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers()))
    assert int(result["endOfStep"]["parameters"]) == state
    assert int(result["savedForBackwardBytes"]) == measure_saved(module, x, "sum")


def test_a_mask_made_at_the_batch_size_rescales(tmp_path):
    """HF's encoders build [B, 1, 1, T] masks from a ones [B, T]: a tensor made in forward whose
    shape follows the batch."""

    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x):
            keep = torch.ones(x.shape[0], x.shape[1])
            bias = (1.0 - keep[:, None, :]) * -1e4
            return self.fc(x) + bias.transpose(1, 2)

    torch.manual_seed(0)
    module = Masked()
    model = tracer.trace(module, torch.randn(2, 8, 16), loss="sum")
    assert model["ops"]["tracedBatch"] == 2
    rescaled = estimate(model, 5, tmp_path)
    direct = estimate(tracer.trace(module, torch.randn(5, 8, 16), loss="sum"), 5, tmp_path)
    for key in ("savedForBackwardBytes", "peak", "endOfStep"):
        assert rescaled[key] == direct[key], key


# ------------------------------------------------------------------ inputs that require grad

class InputGrad(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16))

    def forward(self, x):
        return torch.sigmoid(x) + self.w  # sigmoid keeps its output only for x's gradient


def test_an_input_that_requires_grad_keeps_requiring_it(tmp_path):
    """Float inputs used to be detached: an input that requires grad (an adversarial step,
    embeddings fed in) got no gradient, and what autograd keeps for it was missing."""
    torch.manual_seed(0)
    module = InputGrad()
    x = torch.randn(4, 16, requires_grad=True)
    model = tracer.trace(module, x, loss="sum")
    decl = {t["name"]: t for t in model["ops"]["tensors"]}
    assert decl["x"].get("requiresGrad") is True
    assert not x.grad_fn and x.grad is None  # the caller's tensor is untouched
    result = estimate(model, 4, tmp_path)
    assert int(result["savedForBackwardBytes"]) == measure_saved(module, x, "sum")
    plain = tracer.trace(module, x.detach(), loss="sum")
    assert "requiresGrad" not in {k for t in plain["ops"]["tensors"] for k in t}
    assert int(estimate(plain, 4, tmp_path)["savedForBackwardBytes"]) == measure_saved(module, x.detach(), "sum")
    assert int(result["savedForBackwardBytes"]) > int(estimate(plain, 4, tmp_path)["savedForBackwardBytes"])
