"""memest.trace on the ops real models contain (issue 10, section 1): what each is recorded as,
and that the engine takes the graph on both runtimes.

The memory these ops cost is checked against real PyTorch by the conformance suite
(tests/conformance/cases.py, by hand and through the tracer); these tests pin down the
recording itself: one op for nn.LSTM / nn.GRU, torchvision's stochastic depth and in-place
dropout, the offsets F.embedding_bag makes, constants built in forward, and whole torchvision
models that contain them.
"""
import json
import os
import pathlib
import subprocess

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from memest import tracer

REPO = pathlib.Path(__file__).resolve().parents[2]


def cli_binary():
    return os.environ.get("MEMEST_CLI") or str(REPO / "build" / "bin" / "memest")


def attrs(op):
    """An op's attributes as Python values (from the proto JSON mapping)."""
    out = {}
    for k, v in op.get("attrs", {}).items():
        (tag, value), = v.items()
        out[k] = value["values"] if tag == "ints" else value
    return out


def kinds(model):
    return [op["kind"] for op in model["ops"]["ops"]]


def ops_of(model, kind):
    return [op for op in model["ops"]["ops"] if op["kind"] == kind]


def estimate_both(model, batch, tmp_path):
    """The peak the local engine estimates on each runtime (it must accept the graph)."""
    if not pathlib.Path(cli_binary()).exists():
        pytest.skip(f"memest CLI not built at {cli_binary()}")
    path = tmp_path / "model.json"
    tracer.save(model, path)
    peaks = {}
    for runtime in ("cuda", "cpu-1.13"):
        r = subprocess.run([cli_binary(), "estimate", "--local", "--model", str(path), "--runtime",
                            runtime, "--json", "--no-advice", "--batch", str(batch)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{runtime}: {r.stderr}"
        peaks[runtime] = json.loads(r.stdout)
    return peaks


class LanguageModel(nn.Module):
    def __init__(self, cell, **kw):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.rnn = cell(16, 24, batch_first=True, **kw)
        self.head = nn.Linear(24 * (2 if kw.get("bidirectional") else 1), 50)

    def forward(self, idx):
        return self.head(self.rnn(self.emb(idx))[0])


def test_lstm_is_one_op_that_makes_its_zero_state(tmp_path):
    model = tracer.trace(LanguageModel(nn.LSTM, num_layers=2, dropout=0.1), torch.randint(0, 50, (3, 7)))
    (op,) = ops_of(model, "lstm")
    # the input, then w_ih, w_hh, b_ih, b_hh per layer; nn.LSTM's torch.zeros states are left
    # out (the engine's op makes them), and dropout between the layers is an attribute
    assert len(op["inputs"]) == 1 + 2 * 4
    assert op["inputs"][1:5] == ["rnn.weight_ih_l0", "rnn.weight_hh_l0", "rnn.bias_ih_l0", "rnn.bias_hh_l0"]
    assert attrs(op) == {"num_layers": 2, "batch_first": 1, "dropout": 0.1}
    assert len(op["outputs"]) == 3
    assert "sigmoid" not in kinds(model) and "addmm" not in kinds(model)
    assert model["ops"]["tracedBatch"] == 3
    estimate_both(model, 5, tmp_path)


def test_linear_adds_its_bias_in_place_on_a_non_contiguous_input(tmp_path):
    # at::linear on a batch-first LSTM's output (a transposed view) runs matmul, then
    # output.add_(bias); under the trace's dispatch mode it would run an out-of-place add
    model = tracer.trace(LanguageModel(nn.LSTM), torch.randint(0, 50, (3, 7)))
    (add,) = ops_of(model, "add_")
    assert add["inputs"][1] == "head.bias"
    assert "add" not in kinds(model)
    # a contiguous input takes the fused addmm path: no add at all
    flat = tracer.trace(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4)), torch.randn(2, 3, 8))
    assert "add_" not in kinds(flat) and "add" not in kinds(flat)
    estimate_both(model, 5, tmp_path)


def test_gru_reads_a_state_the_graph_made(tmp_path):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.h0 = nn.Linear(8, 2 * 16)
            self.rnn = nn.GRU(8, 16, bidirectional=True)

        def forward(self, x):
            h0 = self.h0(x[0]).view(x.shape[1], 2, 16).transpose(0, 1).contiguous()
            return self.rnn(x, h0)[0]

    model = tracer.trace(M(), torch.randn(6, 3, 8), batch_dim=1, loss="sum")
    (op,) = ops_of(model, "gru")
    assert len(op["inputs"]) == 1 + 2 * 4 + 1  # the state is the last input
    assert attrs(op) == {"bidirectional": 1}
    estimate_both(model, 4, tmp_path)


def test_stochastic_depth_and_inplace_dropout_are_one_op_each(tmp_path):
    from torchvision.ops import StochasticDepth

    block = nn.Sequential(nn.Linear(8, 8), StochasticDepth(0.25, "row"), nn.Dropout(0.2, inplace=True),
                          nn.Linear(8, 4))
    model = tracer.trace(block, torch.randn(5, 8))
    (sd,) = ops_of(model, "stochastic_depth")
    assert attrs(sd) == {"p": 0.25, "mode": "row"}
    (dropout,) = ops_of(model, "dropout")
    assert attrs(dropout)["inplace"] == 1 and abs(attrs(dropout)["p"] - 0.2) < 1e-9
    assert not any(t["name"].startswith("const.") for t in model["ops"]["tensors"])
    estimate_both(model, 7, tmp_path)


def test_embedding_bag_of_2d_indices_takes_its_bag_size(tmp_path):
    bag = nn.EmbeddingBag(30, 8, mode="mean")
    model = tracer.trace(nn.Sequential(bag, nn.Linear(8, 3)), torch.randint(0, 30, (4, 5)))
    (op,) = ops_of(model, "embedding_bag")
    assert attrs(op) == {"mode": "mean", "bag_size": 5}
    assert len(op["inputs"]) == 2 and "arange" not in kinds(model)  # the offsets arange is folded
    assert model["ops"]["tracedBatch"] == 4
    estimate_both(model, 6, tmp_path)


def test_arange_with_a_step_is_recorded_where_it_is_read(tmp_path):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.pos = nn.Embedding(20, 8)

        def forward(self, x):
            return x + self.pos(torch.arange(1, 17, 2))

    model = tracer.trace(M(), torch.randn(2, 8, 8), loss="sum")
    (op,) = ops_of(model, "arange")
    assert attrs(op) == {"start": 1, "end": 17, "step": 2}
    estimate_both(model, 2, tmp_path)


def test_a_mask_built_in_forward_from_zeros_is_a_tensor_of_the_forward(tmp_path):
    class Masked(nn.Module):  # Swin's shifted-window mask: x.new_zeros, then slices filled
        def forward(self, x):
            mask = x.new_zeros((4, 4))
            mask[:2, :2] = 1
            mask[2:, 2:] = 2
            return x + mask.masked_fill(mask != 0, -100.0)

    model = tracer.trace(Masked(), torch.randn(3, 4, 4), loss="sum")
    # made where add reads it (a fresh allocation of the forward), not a parameter-like buffer
    assert kinds(model) == ["full", "add", "sum"]
    (full,) = ops_of(model, "full")
    assert attrs(full) == {"shape": [4, 4], "dtype": "float32"}
    assert not [t for t in model["ops"]["tensors"] if t["name"].startswith("const.")]
    estimate_both(model, 3, tmp_path)


def test_unet_up_path(tmp_path):
    class Up(nn.Module):
        def __init__(self):
            super().__init__()
            self.down = nn.Conv2d(3, 8, 3, stride=2, padding=1)
            self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
            self.up2 = nn.ConvTranspose2d(4, 4, 3, stride=2, padding=1, output_padding=1, groups=2)
            self.act = nn.ReLU6(inplace=True)

        def forward(self, x):
            h = self.act(self.up(self.down(x)))
            h = F.interpolate(h, scale_factor=2, mode="nearest") + self.up2(h)
            return F.interpolate(F.hardswish(h), size=(5, 7), mode="bilinear", align_corners=False)

    model = tracer.trace(Up(), torch.randn(2, 3, 8, 8), loss="sum")
    ups = ops_of(model, "conv_transpose2d")
    assert [attrs(op)["output_padding"] for op in ups] == [[0, 0], [1, 1]]
    assert attrs(ups[1])["groups"] == 2
    assert [op["kind"] for op in model["ops"]["ops"] if op["kind"].startswith("upsample")] == \
        ["upsample_nearest2d", "upsample_bilinear2d"]
    assert attrs(ops_of(model, "hardtanh")[0]) == {"min_val": 0.0, "max_val": 6.0, "inplace": 1}
    estimate_both(model, 3, tmp_path)


@pytest.mark.parametrize("name,resolution", [
    ("mobilenet_v3_small", 32),   # hardswish_, hardsigmoid, in-place dropout
    ("efficientnet_b0", 32),      # silu_, stochastic depth
    ("convnext_tiny", 32),        # permute + layer_norm, stochastic depth, channels-last pooling
    ("swin_t", 64),               # pad, roll, window mask, relative position index, strided slices
    ("swin_v2_t", 64),            # clone + zero_ of a bias, F.normalize (norm, clamp_min), clamp
])
def test_torchvision_models_trace_and_estimate(name, resolution, tmp_path):
    import torchvision

    module = getattr(torchvision.models, name)()
    model = tracer.trace(module, torch.randn(2, 3, resolution, resolution))
    assert model["ops"]["tracedBatch"] == 2
    estimate_both(model, 3, tmp_path)


def test_autograd_copy_of_an_in_place_input_is_left_to_the_rule(tmp_path):
    """silu_ on a tensor that requires grad: autograd's own original_self = self.clone() is not
    an op of the graph (the in-place rule keeps that copy); a clone the module asks for is."""
    class InPlace(nn.Module):
        def __init__(self, explicit):
            super().__init__()
            self.b = nn.Parameter(torch.zeros(16))
            self.explicit = explicit

        def forward(self, x):
            h = x + self.b
            kept = h.clone() if self.explicit else None
            out = F.silu(h, inplace=True)
            return out + kept if kept is not None else out

    model = tracer.trace(InPlace(False), torch.randn(4, 8, 16), loss="sum")
    assert kinds(model) == ["add", "silu", "sum"]
    model = tracer.trace(InPlace(True), torch.randn(4, 8, 16), loss="sum")
    assert kinds(model) == ["add", "clone", "silu", "add", "sum"]
    estimate_both(model, 4, tmp_path)


class PackedCheck(nn.Module):
    """Transformers 5's find_packed_sequence_indices: `if (mask[:, -1] == 0).all():` on a tensor
    the forward made, a branch on data (GPT-2 with use_cache=False)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.head = nn.Linear(16, 50)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1]).expand(idx.shape[0], -1)
        packed = (pos.diff(dim=-1) != 1) if pos.shape[1] > 1 else pos
        h = self.emb(idx)
        if packed.any() or (h[:, -1] == 0).all():
            h = h * 2
        return self.head(h)


def test_a_branch_on_all_or_any_traces_on_real_tensors(tmp_path):
    model = tracer.trace(PackedCheck(), torch.randint(0, 50, (3, 7)))
    # bool() of a meta tensor cannot run: the trace went on real tensors, and the checks are
    # bool reductions of the graph (their value went to Python: no op for it)
    assert model.path == "real"
    (check,) = ops_of(model, "all")
    (eq,) = ops_of(model, "eq")
    assert check["inputs"] == eq["outputs"]
    # any() of the positions (made without reading the graph) is not part of it
    assert "any" not in kinds(model)
    estimate_both(model, 3, tmp_path)


def test_megatron_permutation_ops_are_the_engines(tmp_path):
    # Megatron-LM's MoE routing and (un)permutation (moe_utils.py): zeros.scatter(1, top, probs),
    # zeros.int().scatter(1, top, 1).bool(), argsort of the bool map, % num_tokens,
    # index_select, and scatter_add_ of an expanded index (here also torch.scatter_add out of
    # place, which aten runs as a clone added into in place)
    class Permute(nn.Module):
        def __init__(self):
            super().__init__()
            self.router = nn.Linear(8, 4, bias=False)

        def forward(self, x):
            n = x.shape[0] * x.shape[1]
            flat = x.view(n, 8)
            scores, top = torch.topk(self.router(flat), 2, dim=1)
            probs = torch.zeros(n, 4).scatter(1, top, torch.softmax(scores, -1))
            routing_map = torch.zeros(n, 4).int().scatter(1, top, 1).bool()
            flat_sorted = routing_map.T.contiguous().reshape(-1).argsort(descending=True)[:2 * n]
            sorted_indices = flat_sorted % n
            permuted = flat.index_select(0, sorted_indices)
            permuted = permuted * probs.T.contiguous().reshape(-1)[flat_sorted].unsqueeze(-1)
            where = sorted_indices.unsqueeze(1).expand(-1, 8)
            out = torch.zeros(n, 8).scatter_add_(0, where, permuted)
            return torch.scatter_add(out, 0, where, permuted).view(x.shape)

    model = tracer.trace(Permute(), torch.randn(2, 6, 8), loss="sum")
    scatters = ops_of(model, "scatter")
    assert [len(op["inputs"]) for op in scatters] == [3, 2]
    assert attrs(scatters[0]) == {"dim": 1} and attrs(scatters[1]) == {"dim": 1, "value": 1.0}
    (sort,) = ops_of(model, "sort")
    assert attrs(sort) == {"dim": -1, "descending": 1}
    (rem,) = ops_of(model, "remainder")
    assert attrs(rem) == {"other": 12.0}
    (sel,) = ops_of(model, "index_select")
    assert sel["inputs"][1] == rem["outputs"][0]
    first, second = ops_of(model, "scatter_add_")
    clone = ops_of(model, "clone")[-1]
    assert clone["inputs"] == first["outputs"] and second["inputs"][0] == clone["outputs"][0]
    estimate_both(model, 2, tmp_path)
