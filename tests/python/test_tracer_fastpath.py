"""memest.trace on nn.TransformerEncoderLayer in inference: PyTorch 1.13 runs its fast path
(torch._transformer_encoder_layer_fwd), which the meta device never takes, and the trace
records the fast path's ops instead of the layer's Python path (memest/_trace_fastpath.py).
What they cost is checked against PyTorch 1.13 by the model zoo (transformer_encoder and
transformer_encoder_prenorm in inference); these tests pin down what is recorded and when.
"""
import json
import pathlib
import subprocess

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from memest import tracer
from test_tracer_ops import attrs, cli_binary, kinds, ops_of

pytestmark = pytest.mark.skipif(hasattr(F, "scaled_dot_product_attention"),
                                reason="PyTorch 1.13's fast path; 2.x records the Python path")


def layer(activation="relu", norm_first=False):
    torch.manual_seed(0)
    return nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, activation=activation,
                                      batch_first=True, norm_first=norm_first)


def peak(model, tmp_path, runtime, batch):
    if not pathlib.Path(cli_binary()).exists():
        pytest.skip(f"memest CLI not built at {cli_binary()}")
    path = tmp_path / f"model_{runtime}_{batch}.json"
    tracer.save(model, path)
    r = subprocess.run([cli_binary(), "estimate", "--local", "--model", str(path), "--runtime",
                        runtime, "--mode", "inference", "--batch", str(batch), "--json",
                        "--no-advice"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{runtime}: {r.stderr}"
    return int(json.loads(r.stdout)["peak"]["allocatedBytes"])


@pytest.mark.parametrize("activation,norm_first", [("relu", False), ("gelu", True)])
def test_inference_records_the_fast_path(activation, norm_first, tmp_path):
    model = tracer.trace(layer(activation, norm_first), torch.randn(3, 5, 16), loss=None,
                         training=False)
    k = kinds(model)
    # one packed q/k/v buffer, the scores soft-maxed in place, the context written into q
    assert k.count("contiguous") == 2 and k.count("bmm") == 1 and "dropout" not in k
    assert attrs(ops_of(model, "softmax")[0])["inplace"] == 1
    assert ops_of(model, "bmm_into")[0]["inputs"][0] == ops_of(model, "reshape")[1]["outputs"][0]
    assert attrs(ops_of(model, activation)[0])["inplace"] == 1
    assert k.count("layer_norm") == 2 and k.count("add_") == 2
    assert k[0] == ("layer_norm" if norm_first else "linear")
    # the packed buffer is held until the output projection has run, as the C++ code holds it
    held = {h["tensor"]: h["untilOp"] for h in model["ops"].get("held", [])}
    packed = ops_of(model, "contiguous")[0]["outputs"][0]
    out_proj = next(i for i, op in enumerate(model["ops"]["ops"])
                    if op["kind"] == "linear" and i > k.index("bmm_into"))
    assert held.get(packed) == out_proj, held
    # the shapes carry -1 where the batch is: the graph rescales, on either runtime
    for runtime in ("cpu-1.13", "cuda"):
        assert peak(model, tmp_path, runtime, 7) > peak(model, tmp_path, runtime, 3)


def test_training_and_a_padding_mask_keep_the_python_path():
    x = torch.randn(3, 5, 16)
    trained = tracer.trace(layer(), x)
    assert "bmm_into" not in kinds(trained) and "dropout" in kinds(trained)

    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer()

        def forward(self, x):
            return self.layer(x, src_key_padding_mask=torch.zeros(x.shape[:2], dtype=torch.bool))

    masked = tracer.trace(Masked(), x, loss=None, training=False)
    assert "bmm_into" not in kinds(masked)


def test_odd_heads_keep_the_python_path():
    odd = nn.TransformerEncoderLayer(15, 3, 32, batch_first=True)
    model = tracer.trace(odd, torch.randn(2, 4, 15), loss=None, training=False)
    assert "bmm_into" not in kinds(model)


@pytest.mark.parametrize("need_weights,average", [(False, True), (True, True), (True, False)])
def test_self_attention_in_inference_records_the_fast_path(need_weights, average, tmp_path):
    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

        def forward(self, x):
            out, weights = self.attn(x, x, x, need_weights=need_weights,
                                     average_attn_weights=average)
            return out if weights is None else out + weights.sum()

    model = tracer.trace(SelfAttention(), torch.randn(3, 5, 16), loss=None, training=False)
    k = kinds(model)
    assert "bmm_into" in k and "baddbmm" not in k
    averaged = need_weights and average
    assert ("sum" in k[:k.index("div_")]) if averaged else ("div_" not in k)
    if averaged:  # the scores are held until they are summed over the heads
        held = {h["tensor"]: h["untilOp"] for h in model["ops"].get("held", [])}
        scores = ops_of(model, "softmax")[0]["outputs"][0]  # soft-maxed in place
        assert held.get(scores) == k.index("sum"), held
    for runtime in ("cpu-1.13", "cuda"):
        assert peak(model, tmp_path, runtime, 7) > peak(model, tmp_path, runtime, 3)


def test_attention_with_dropout_or_across_sequences_keeps_the_python_path():
    attn = nn.MultiheadAttention(16, 2, dropout=0.1, batch_first=True)
    x = torch.randn(3, 5, 16)

    class Call(nn.Module):
        def __init__(self, attn, cross):
            super().__init__()
            self.attn, self.cross = attn, cross

        def forward(self, x):
            return self.attn(x, x * 2.0 if self.cross else x, x, need_weights=False)[0]

    for module in (Call(attn, False), Call(nn.MultiheadAttention(16, 2, batch_first=True), True)):
        assert "bmm_into" not in kinds(tracer.trace(module, x, loss=None, training=False))


def test_the_fast_path_under_autocast_is_refused_naming_it(tmp_path):
    """Under autocast PyTorch takes the layer's Python path: a graph recorded with the fast
    path is refused with --precision bf16 or fp16, and estimated in a -pure precision."""
    if not pathlib.Path(cli_binary()).exists():
        pytest.skip(f"memest CLI not built at {cli_binary()}")
    path = tmp_path / "encoder.json"
    tracer.save(tracer.trace(layer(), torch.randn(3, 5, 16), loss=None, training=False), path)

    def run(precision):
        return subprocess.run([cli_binary(), "estimate", "--local", "--model", str(path),
                               "--mode", "inference", "--precision", precision, "--json",
                               "--no-advice"], capture_output=True, text=True, timeout=300)
    for precision in ("bf16", "fp16"):
        r = run(precision)
        assert r.returncode == 3 and "fast path" in r.stderr and "autocast" in r.stderr, r.stderr
    assert run("bf16-pure").returncode == 0
