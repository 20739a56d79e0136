"""memest.trace on random small stacks of layers: it traces, or it raises UnsupportedOp.

Each case builds an nn.Sequential from a seed: layers drawn from what real models contain
(linear, convolutions and transposed ones, norms, activations in and out of place, pooling,
upsampling, dropout, recurrent layers, attention, transformer layers), with sizes drawn too, each
fitting the shape the previous one left. A case passes when memest.trace returns a graph that
the engine accepts (`memest estimate --local` on both runtimes; every other case is traced and
estimated in inference too) or raises UnsupportedOp; any other
exception, or a graph the engine refuses, fails it with the seed and the stack, to replay with
`pytest tests/python/test_tracer_fuzz.py -k 'seed_N'`.
"""
import json
import os
import pathlib
import random
import subprocess

import pytest
import torch
import torch.nn as nn

from memest import tracer

REPO = pathlib.Path(__file__).resolve().parents[2]
CASES = int(os.environ.get("MEMEST_TRACER_FUZZ_CASES", "200"))


def cli_binary():
    return os.environ.get("MEMEST_CLI") or str(REPO / "build" / "bin" / "memest")


class SeqOut(nn.Module):
    """An RNN or attention layer as a Sequential element: its output tensor only."""

    def __init__(self, inner, kind):
        super().__init__()
        self.inner, self.kind = inner, kind

    def forward(self, x):
        if self.kind == "attention":
            return self.inner(x, x, x, need_weights=False)[0]
        return self.inner(x)[0]


def vector_layer(rng, f):
    """A layer for [B, f] and the features it leaves."""
    choice = rng.choice(["linear", "relu", "gelu", "silu", "tanh", "sigmoid", "dropout",
                         "layer_norm", "batch_norm", "hardswish", "relu6", "leaky_relu",
                         "softmax", "identity", "elu"])
    out = rng.choice([4, 8, 12, 16, 32])
    inplace = rng.random() < 0.5
    return {
        "linear": lambda: (nn.Linear(f, out, bias=rng.random() < 0.8), out),
        "relu": lambda: (nn.ReLU(inplace=inplace), f),
        "gelu": lambda: (nn.GELU(approximate=rng.choice(["none", "tanh"])), f),
        "silu": lambda: (nn.SiLU(inplace=inplace), f),
        "tanh": lambda: (nn.Tanh(), f),
        "sigmoid": lambda: (nn.Sigmoid(), f),
        "dropout": lambda: (nn.Dropout(rng.choice([0.0, 0.1, 0.5])), f),
        "layer_norm": lambda: (nn.LayerNorm(f), f),
        "batch_norm": lambda: (nn.BatchNorm1d(f), f),
        "hardswish": lambda: (nn.Hardswish(inplace=inplace), f),
        "relu6": lambda: (nn.ReLU6(inplace=inplace), f),
        "leaky_relu": lambda: (nn.LeakyReLU(0.1, inplace=inplace), f),
        "softmax": lambda: (nn.Softmax(dim=-1), f),
        "identity": lambda: (nn.Identity(), f),
        "elu": lambda: (nn.ELU(), f),
    }[choice]()


def image_layer(rng, c, hw):
    """A layer for [B, c, hw, hw] and the (channels, size) it leaves; size 0 means flattened."""
    choice = rng.choice(["conv", "conv_t", "batch_norm", "group_norm", "relu", "max_pool",
                         "avg_pool", "upsample", "adaptive", "flatten", "dropout2d", "silu"])
    out = rng.choice([2, 4, 6, 8])
    if choice == "conv":
        k = rng.choice([1, 3])
        stride = rng.choice([1, 2]) if hw >= 4 else 1
        conv = nn.Conv2d(c, out, k, stride=stride, padding=k // 2, bias=rng.random() < 0.5)
        return conv, (out, (hw + 2 * (k // 2) - k) // stride + 1)
    if choice == "conv_t" and hw <= 8:
        return nn.ConvTranspose2d(c, out, 2, stride=2), (out, hw * 2)
    if choice == "batch_norm":
        return nn.BatchNorm2d(c), (c, hw)
    if choice == "group_norm" and c % 2 == 0:
        return nn.GroupNorm(2, c), (c, hw)
    if choice in ("max_pool", "avg_pool") and hw >= 2:
        ceil = rng.random() < 0.3
        pool = nn.MaxPool2d(2, ceil_mode=ceil) if choice == "max_pool" else nn.AvgPool2d(2)
        return pool, (c, (hw + (1 if ceil else 0)) // 2 if choice == "max_pool" else hw // 2)
    if choice == "upsample" and hw <= 8:
        return nn.Upsample(scale_factor=2, mode=rng.choice(["nearest", "bilinear"])), (c, hw * 2)
    if choice == "adaptive":
        return nn.AdaptiveAvgPool2d(1), (c, 1)
    if choice == "flatten":
        return nn.Flatten(), (c * hw * hw, 0)
    if choice == "dropout2d":
        return nn.Dropout2d(0.2), (c, hw)
    if choice == "silu":
        return nn.SiLU(inplace=rng.random() < 0.5), (c, hw)
    return nn.ReLU(), (c, hw)


def sequence_layer(rng, d):
    """A layer for [B, T, d] (batch first) and the width it leaves."""
    choice = rng.choice(["encoder", "attention", "lstm", "gru", "linear", "layer_norm", "gelu"])
    if choice == "encoder" and d % 2 == 0:
        return nn.TransformerEncoderLayer(d, 2, dim_feedforward=2 * d, dropout=0.1,
                                          batch_first=True, norm_first=rng.random() < 0.5), d
    if choice == "attention" and d % 2 == 0:
        return SeqOut(nn.MultiheadAttention(d, 2, batch_first=True), "attention"), d
    if choice in ("lstm", "gru"):
        hidden = rng.choice([4, 8, 12])
        cls = nn.LSTM if choice == "lstm" else nn.GRU
        bi = rng.random() < 0.3
        rnn = cls(d, hidden, num_layers=rng.choice([1, 2]), batch_first=True, bidirectional=bi)
        return SeqOut(rnn, choice), hidden * (2 if bi else 1)
    if choice == "linear":
        out = rng.choice([4, 8, 16])
        return nn.Linear(d, out), out
    if choice == "layer_norm":
        return nn.LayerNorm(d), d
    return nn.GELU(), d


def make_case(seed):
    """(module, input, loss, description) for `seed`."""
    rng = random.Random(seed)
    kind = rng.choice(["vector", "image", "sequence"])
    layers = []
    depth = rng.randint(1, 6)
    if kind == "vector":
        f = rng.choice([4, 8, 16])
        x = torch.randn(3, f)
        for _ in range(depth):
            layer, f = vector_layer(rng, f)
            layers.append(layer)
    elif kind == "image":
        c, hw = rng.choice([1, 3]), rng.choice([4, 8])
        x = torch.randn(2, c, hw, hw)
        for _ in range(depth):
            if hw == 0:
                layer, c = vector_layer(rng, c)
            else:
                layer, (c, hw) = image_layer(rng, c, hw)
            layers.append(layer)
    else:
        d = rng.choice([4, 8])
        x = torch.randn(2, 5, d)
        if rng.random() < 0.3:  # token ids through an embedding first
            layers.append(nn.Embedding(20, d))
            x = torch.randint(0, 20, (2, 5))
        for _ in range(depth):
            layer, d = sequence_layer(rng, d)
            layers.append(layer)
    module = nn.Sequential(*layers)
    loss = rng.choice(["sum", "mse"])
    return module, x, loss, f"{kind}: {module}"


def estimate(model, tmp_path, batch, mode="training"):
    path = tmp_path / f"model_{mode}.json"
    tracer.save(model, path)
    for runtime in ("cuda", "cpu-1.13"):
        r = subprocess.run([cli_binary(), "estimate", "--local", "--model", str(path), "--runtime",
                            runtime, "--mode", mode, "--json", "--no-advice", "--batch", str(batch)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"the engine refuses the traced graph on {runtime}: {r.stderr}"
        assert int(json.loads(r.stdout)["peak"]["allocatedBytes"]) > 0


@pytest.mark.parametrize("seed", [pytest.param(s, id=f"seed_{s}") for s in range(CASES)])
def test_a_random_stack_traces_or_is_refused_clearly(seed, tmp_path):
    if not pathlib.Path(cli_binary()).exists():
        pytest.skip(f"memest CLI not built at {cli_binary()}")
    torch.manual_seed(seed)
    module, x, loss, what = make_case(seed)
    try:
        if loss == "mse":
            with torch.no_grad():
                target = module(x).detach()  # the shape the stack gives
            model = tracer.trace(module, x, target=target, loss="mse")
        else:
            model = tracer.trace(module, x, loss="sum")
    except tracer.UnsupportedOp as e:
        assert str(e), what  # refused with a message naming the op
        return
    except Exception as e:  # noqa: BLE001: any other failure is the finding
        pytest.fail(f"seed {seed}: {type(e).__name__}: {e}\n{what}")
    estimate(model, tmp_path, x.shape[0])
    if seed % 2 == 0:  # and in inference (eval, no autograd: 1.13's encoder fast path)
        try:
            model = tracer.trace(module, x, loss=None, training=False)
        except Exception as e:  # noqa: BLE001: it traced in training, so it must here
            pytest.fail(f"seed {seed}, inference: {type(e).__name__}: {e}\n{what}")
        estimate(model, tmp_path, x.shape[0], "inference")
