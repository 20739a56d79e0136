"""memest.trace against real PyTorch (Debian's 1.13, CPU).

Each model is traced, estimated by the real `memest` CLI on its local engine with the cpu-1.13
runtime, and checked against PyTorch itself: the parameter count, and the bytes autograd saves
for backward (distinct storages packed by saved_tensors_hooks and still alive at the end of
forward + loss, parameters and buffers excluded, as tests/conformance/measure.py measures).
"""
import copy
import json
import math
import os
import pathlib
import subprocess

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef

from memest import tracer

REPO = pathlib.Path(__file__).resolve().parents[2]


def cli_binary():
    return os.environ.get("MEMEST_CLI") or str(REPO / "build" / "bin" / "memest")


# ------------------------------------------------------------------------------- models

class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 10))

    def forward(self, x):
        return self.net(x)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.MaxPool2d(2))
        self.head = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


class Attention(nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.h, C // self.h).transpose(1, 2)
        k = k.view(B, T, self.h, C // self.h).transpose(1, 2)
        v = v.view(B, T, self.h, C // self.h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.h))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.ln1 = nn.LayerNorm(c)
        self.attn = Attention(c, h)
        self.ln2 = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.act = nn.GELU()
        self.out = nn.Linear(4 * c, c)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(self.act(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab=50, c=32, h=4, layers=2):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.blocks = nn.ModuleList([Block(c, h) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(c)
        self.head = nn.Linear(c, vocab, bias=False)

    def forward(self, idx):
        x = self.wte(idx)
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


class Swish(nn.Module):
    """x * sigmoid(x) written in forward, and broadcasting ([C] and [B, 1, C] against [B, T, C])."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(24, 48)
        self.scale = nn.Parameter(torch.ones(48))
        self.fc2 = nn.Linear(48, 5)

    def forward(self, x):
        h = self.fc1(x)
        a = h * torch.sigmoid(h)
        a = a * self.scale + a.mean(dim=1, keepdim=True)
        return self.fc2(a)


class Einsum(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 16) * 0.1)
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        s = torch.einsum("bqd,bkd->bqk", x, x)
        y = torch.einsum("bqk,bkd->bqd", torch.softmax(s, dim=-1), x)
        y = torch.einsum("bqd,de->bqe", y, self.w)
        return self.fc(y)


class MHA(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(16, 4, batch_first=True)
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc(self.mha(x, x, x, need_weights=False)[0])


class CausalMask(nn.Module):
    """A causal mask cut from a buffer, filled with -inf."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mask", torch.tril(torch.ones(8, 8)).view(1, 8, 8))
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        T = x.shape[1]
        a = (x @ x.transpose(1, 2)).masked_fill(self.mask[:, :T, :T] == 0, float("-inf"))
        return self.fc(torch.softmax(a, -1) @ x)


class CausalSdpa(nn.Module):
    """F.scaled_dot_product_attention (PyTorch 2.x): causal self-attention, and one with a float
    mask. PyTorch runs its fused kernel (flash on the CPU), which keeps a logsumexp, not the
    [T, T] scores; memest.trace records the call as one op."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.out = nn.Linear(16, 16)
        self.register_buffer("bias", torch.zeros(6, 6))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 2, 8).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = F.scaled_dot_product_attention(y, k, v, attn_mask=self.bias[:t, :t])
        return self.out(y.transpose(1, 2).reshape(b, t, 16))


class CheckpointedBlocks(nn.Module):
    """Blocks run under torch.utils.checkpoint in forward (reentrant: the default in 1.13)."""

    def __init__(self, reentrant=True):
        super().__init__()
        self.reentrant = reentrant
        self.embed = nn.Linear(12, 16)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(16, 48), nn.GELU(), nn.Linear(48, 16)) for _ in range(3))
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = x + torch.utils.checkpoint.checkpoint(block, x, use_reentrant=self.reentrant)
        return self.head(x)


# name -> (model class, example input at batch B, loss)
CASES = {
    "mlp": (MLP, lambda b: torch.randn(b, 32), "cross_entropy"),
    "convnet": (ConvNet, lambda b: torch.randn(b, 3, 16, 16), "cross_entropy"),
    "gpt_block": (TinyGPT, lambda b: torch.randint(0, 50, (b, 16)), "cross_entropy"),
    "swish_broadcast": (Swish, lambda b: torch.randn(b, 7, 24), "mse"),
    "einsum": (Einsum, lambda b: torch.randn(b, 8, 16), "sum"),
    "multihead_attention": (MHA, lambda b: torch.randn(b, 5, 16), "sum"),
    "causal_mask": (CausalMask, lambda b: torch.randn(b, 8, 8), "mse"),
    "checkpointed_blocks": (CheckpointedBlocks, lambda b: torch.randn(b, 10, 12), "cross_entropy"),
}
if hasattr(F, "scaled_dot_product_attention"):  # PyTorch 2.x
    CASES["sdpa_fused"] = (CausalSdpa, lambda b: torch.randn(b, 6, 16), "sum")


def make(name, seed=0):
    cls, inputs, loss = CASES[name]
    torch.manual_seed(seed)
    return cls(), inputs, loss


# ------------------------------------------------------------------------------- helpers

def _is_wrapped_number(t):
    return (t.dim() == 0 and t.dtype in (torch.float64, torch.int64) and t.grad_fn is None
            and not t.requires_grad)


def measure_saved(module, x, loss):
    """Bytes real PyTorch keeps for backward after forward + loss: distinct storages packed by
    autograd and still alive, parameters and buffers excluded."""
    m = copy.deepcopy(module).train()
    skip = {t.storage().data_ptr() for t in list(m.parameters()) + list(m.buffers())}
    saved = {}

    def pack(t):
        if _is_wrapped_number(t):
            return t
        st = t.storage()
        if st.data_ptr() in skip or st.nbytes() == 0:
            return t
        saved[st.data_ptr()] = (StorageWeakRef(st), st.nbytes())
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = m(x)
        if loss == "cross_entropy":
            tgt = torch.randint(0, out.shape[-1], out.shape[:-1])
            if out.dim() > 2:
                result = F.cross_entropy(out.reshape(-1, out.shape[-1]), tgt.reshape(-1))
            else:
                result = F.cross_entropy(out, tgt)
        elif loss == "mse":
            result = F.mse_loss(out, torch.randn(out.shape))
        else:
            result = out.sum()
    del out
    total = sum(nb for ref, nb in saved.values() if not ref.expired())
    del result
    return total


def estimate(model, batch, tmp_path):
    if not pathlib.Path(cli_binary()).exists():
        pytest.skip(f"memest CLI not built at {cli_binary()}")
    path = tmp_path / f"model_{batch}_{len(list(tmp_path.iterdir()))}.json"
    tracer.save(model, path)
    r = subprocess.run([cli_binary(), "estimate", "--local", "--model", str(path), "--runtime",
                        "cpu-1.13", "--json", "--no-advice", "--optimizer", "sgd",
                        "--optimizer-impl", "for-loop", "--batch", str(batch)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"memest estimate failed:\n{r.stderr}\n{path.read_text()[:2000]}"
    return json.loads(r.stdout)


# ------------------------------------------------------------------------------- tests

@pytest.mark.parametrize("name", sorted(CASES))
def test_trace_matches_pytorch(name, tmp_path):
    module, inputs, loss = make(name)
    batch = 4
    model = tracer.trace(module, inputs(batch), loss=loss)
    assert model.path in ("meta", "real")
    result = estimate(model, batch, tmp_path)
    assert int(result["parameterCount"]) == sum(p.numel() for p in module.parameters())
    assert int(result["savedForBackwardBytes"]) == measure_saved(module, inputs(batch), loss)
    g = model["ops"]
    assert g["tracedBatch"] == batch
    assert g["loss"] in {o for op in g["ops"] for o in op["outputs"]}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rescaled_trace_equals_trace_at_that_batch(name, tmp_path):
    module, inputs, loss = make(name)
    small = estimate(tracer.trace(module, inputs(2), loss=loss), 8, tmp_path)
    direct = estimate(tracer.trace(module, inputs(8), loss=loss), 8, tmp_path)
    for key in ("savedForBackwardBytes", "parameterCount", "breakdown", "peak", "endOfStep"):
        assert small[key] == direct[key], key
    assert int(small["savedForBackwardBytes"]) == measure_saved(module, inputs(8), loss)


def test_meta_device_is_used_and_module_untouched():
    module, inputs, _ = make("convnet")
    before = {k: v.clone() for k, v in module.state_dict().items()}
    model = tracer.trace(module, inputs(2))
    assert model.path == "meta"
    for k, v in module.state_dict().items():
        assert v.device.type == "cpu" and torch.equal(v, before[k]), k


def test_real_tensors_when_meta_fails(monkeypatch):
    module, inputs, _ = make("mlp")
    meta = tracer.trace(module, inputs(3))
    record = tracer._record

    def no_meta(*args, device, **kw):
        if device == "meta":
            raise tracer._MetaUnsupported("no meta kernel (simulated)")
        return record(*args, device=device, **kw)

    monkeypatch.setattr(tracer, "_record", no_meta)
    real = tracer.trace(module, inputs(3))
    assert real.path == "real" and real.notes
    assert json.dumps(real, sort_keys=True) == json.dumps(meta, sort_keys=True)


def test_roles_scopes_blocks_and_batch_positions():
    module, inputs, _ = make("gpt_block")
    g = tracer.trace(module, inputs(2))["ops"]
    decl = {t["name"]: t for t in g["tensors"]}
    for name, p in module.named_parameters():
        assert decl[name]["role"] == "TENSOR_ROLE_PARAMETER" and decl[name]["shape"] == list(p.shape)
    assert decl["idx"]["role"] == "TENSOR_ROLE_INPUT" and decl["idx"]["dtype"] == "int64"
    assert decl["target"]["role"] == "TENSOR_ROLE_TARGET" and decl["target"]["shape"] == [2, 16]
    assert g["blocks"] == ["blocks.0", "blocks.1"]
    scopes = {op.get("scope") for op in g["ops"]}
    assert {"blocks.1.attn", "blocks.1.attn.qkv", "blocks.0.ln2", "loss"} <= scopes
    kinds = {op["kind"] for op in g["ops"]}
    # nn.Linear's t + addmm is recorded as memest's linear, F.cross_entropy's log_softmax +
    # nll_loss as its cross_entropy (one op reading the target: the loss phase starts there)
    assert {"embedding", "layer_norm", "linear", "bmm", "softmax", "gelu", "add",
            "cross_entropy"} <= kinds
    assert not {"addmm", "log_softmax", "nll_loss"} & kinds
    for op in g["ops"]:
        if op["kind"] in ("view", "reshape") and op.get("scope", "").startswith("blocks"):
            shape = op["attrs"]["shape"]["ints"]["values"]
            assert shape.count(-1) == 1 and shape[0] == -1, op


def test_batchnorm_buffers_and_dropout_pattern():
    module, inputs, _ = make("convnet")
    g = tracer.trace(module, inputs(2))["ops"]
    roles = {t["name"]: t["role"] for t in g["tensors"]}
    for name in ("features.1.running_mean", "features.1.running_var",
                 "features.1.num_batches_tracked"):
        assert roles[name] == "TENSOR_ROLE_BUFFER"
    bn = [op for op in g["ops"] if op["kind"] == "batch_norm"]
    assert len(bn) == 1 and bn[0]["inputs"][3:] == ["features.1.running_mean",
                                                    "features.1.running_var"]
    conv = [op for op in g["ops"] if op["kind"] == "conv2d"][0]
    assert conv["attrs"]["padding"] == {"ints": {"values": [1, 1]}}
    pool = [op for op in g["ops"] if op["kind"] == "max_pool2d"][0]
    assert len(pool["outputs"]) == 2

    module, inputs, _ = make("mlp")
    ops = tracer.trace(module, inputs(2))["ops"]["ops"]
    drop = [op for op in ops if op["kind"] == "dropout"]
    assert len(drop) == 1 and drop[0]["attrs"]["p"]["f"] == pytest.approx(0.1)
    assert drop[0]["scope"] == "net.2"
    assert not any(op["kind"] == "mul" for op in ops)


class _Cumprod(nn.Module):
    def forward(self, x):
        return torch.cumprod(x, dim=1)


class _WithUnknown(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.inner = _Cumprod()

    def forward(self, x):
        return self.inner(self.fc(x))


def test_unknown_op_is_refused_by_name():
    with pytest.raises(tracer.UnsupportedOp) as err:
        tracer.trace(_WithUnknown(), torch.randn(2, 8))
    assert err.value.op == "aten.cumprod.default"
    assert err.value.scope == "inner"
    assert "aten.cumprod.default" in str(err.value) and "inner" in str(err.value)


def test_save_writes_the_proto_json(tmp_path):
    module, inputs, loss = make("swish_broadcast")
    model = tracer.trace(module, inputs(2), loss=loss)
    path = tmp_path / "swish.json"
    tracer.save(model, path)
    assert json.loads(path.read_text()) == dict(model)


def test_torchvision_resnet18_matches_pytorch(tmp_path):
    """torchvision's resnet18 (conv, batch_norm, relu_, max_pool2d, adaptive_avg_pool2d,
    flatten, linear, add_), traced whole: the engine's parameter count and saved-for-backward
    bytes equal real PyTorch's."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    module = torchvision.models.resnet18(weights=None, num_classes=10)
    x = torch.randn(2, 3, 64, 64)
    model = tracer.trace(module, x, loss="cross_entropy")
    result = estimate(model, 2, tmp_path)
    assert int(result["parameterCount"]) == sum(p.numel() for p in module.parameters())
    assert int(result["savedForBackwardBytes"]) == measure_saved(module, x, "cross_entropy")
    g = model["ops"]
    assert g["tracedBatch"] == 2
    assert len(g.get("blocks", [])) >= 2  # layer1.0 .. : the residual blocks


def test_checkpoint_calls_become_regions(tmp_path):
    """Each torch.utils.checkpoint call is one region of the block's ops; the estimate
    checkpoints them (keeping less than the same model run without checkpoint) and refuses a
    policy on top."""
    module, inputs, loss = make("checkpointed_blocks")
    model = tracer.trace(module, inputs(4), loss=loss)
    regions = model["ops"]["checkpoints"]
    assert len(regions) == 3
    ops = model["ops"]["ops"]
    for i, r in enumerate(regions):
        assert "nonReentrant" not in r
        scopes = {ops[j].get("scope", "") for j in range(r["firstOp"], r["lastOp"] + 1)}
        assert all(s.startswith(f"blocks.{i}") for s in scopes), scopes
    checkpointed = estimate(model, 4, tmp_path)
    plain = dict(model["ops"])
    del plain["checkpoints"]
    unchecked = estimate({"ops": plain}, 4, tmp_path)
    assert int(checkpointed["savedForBackwardBytes"]) < int(unchecked["savedForBackwardBytes"])
    assert any("checkpointing in the model's code" in n for n in checkpointed["notes"])
    path = tmp_path / "ckpt.json"
    tracer.save(model, path)
    r = subprocess.run([cli_binary(), "estimate", "--local", "--model", str(path), "--batch", "4",
                        "--checkpoint", "every-block", "--no-advice"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3 and "checkpoints in its own code" in r.stderr, r.stderr


def test_non_reentrant_checkpoint_is_marked():
    _, inputs, loss = CASES["checkpointed_blocks"]
    model = tracer.trace(CheckpointedBlocks(reentrant=False), inputs(2), loss=loss)
    regions = model["ops"]["checkpoints"]
    assert len(regions) == 3 and all(r.get("nonReentrant") for r in regions)
    # The patches are gone after the trace.
    assert "apply" not in torch.utils.checkpoint.CheckpointFunction.__dict__
