"""memest.trace on the masks and copies Hugging Face and torchvision models make in forward:
comparisons of token ids and attention masks, RoBERTa's cumsum position ids, OPT's
torch.max(scores, torch.tensor(min)), and torchvision's batch_images (copy_ into a slice of a
zeroed batch). What they cost is checked against PyTorch 1.13 by the conformance suite
(ops/compare_masks, ops/maximum_*, ops/cumsum_positions, ops/copy_into_slice, and the zoo's
hf_roberta, hf_distilbert, hf_opt); these tests pin down what each is recorded as.
"""
import json
import pathlib
import subprocess

import pytest
import torch
import torch.nn as nn

from memest import tracer
from test_tracer_ops import attrs, cli_binary, estimate_both, kinds, ops_of


def estimate_inference(model, tmp_path):
    """The engine takes an inference graph on both runtimes; returns the peaks."""
    if not pathlib.Path(cli_binary()).exists():
        pytest.skip(f"memest CLI not built at {cli_binary()}")
    path = tmp_path / "model.json"
    tracer.save(model, path)
    peaks = {}
    for runtime in ("cuda", "cpu-1.13"):
        r = subprocess.run([cli_binary(), "estimate", "--local", "--model", str(path), "--runtime",
                            runtime, "--mode", "inference", "--json", "--no-advice"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{runtime}: {r.stderr}"
        peaks[runtime] = int(json.loads(r.stdout)["peak"]["allocatedBytes"])
    return peaks


class MaskedEncoder(nn.Module):
    """Token ids and an int attention mask, as an HF encoder takes them."""

    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(20, 8)
        self.wpe = nn.Embedding(20, 8)
        self.q = nn.Linear(8, 8)

    def forward(self, ids, mask):
        m = ids.ne(1).int()  # RoBERTa's create_position_ids_from_input_ids
        pos = (torch.cumsum(m, dim=1).type_as(m) * m).long() + 1
        h = self.wte(ids) + self.wpe(pos)
        scores = self.q(h) @ h.transpose(1, 2)
        scores = scores.masked_fill((mask == 0).view(mask.shape[0], 1, -1), -1e4)  # DistilBERT
        scores = torch.max(scores, torch.tensor(torch.finfo(scores.dtype).min, device=h.device))  # OPT
        return scores.softmax(-1) @ h


def test_masks_are_ops_of_the_graph_and_follow_the_batch(tmp_path):
    ids = torch.randint(0, 20, (3, 6))
    model = tracer.trace(MaskedEncoder(), (ids, torch.ones(3, 6, dtype=torch.int64)), loss="sum")
    ks = kinds(model)
    assert ks[:3] == ["ne", "to", "cumsum"]
    (ne,) = ops_of(model, "ne")
    assert ne["inputs"] == ["ids"] and attrs(ne) == {"scalar": 1.0}
    (eq,) = ops_of(model, "eq")
    assert eq["inputs"] == ["mask"] and attrs(eq) == {"scalar": 0.0}
    (mx,) = ops_of(model, "maximum")
    # torch.tensor(...) in forward is a tensor of the forward (a 0-dim full), not module state
    (const,) = [op for op in ops_of(model, "full") if op["outputs"][0] == mx["inputs"][1]]
    assert attrs(const) == {"shape": [], "dtype": "float32"}
    assert not [t for t in model["ops"]["tensors"] if t["name"].startswith("const.")]
    assert model["ops"]["tracedBatch"] == 3
    estimate_both(model, 5, tmp_path)


class BatchImages(nn.Module):
    """torchvision's GeneralizedRCNNTransform.batch_images: each image copied into a slice of a
    zeroed batch padded to a multiple of 4."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, images):
        batch = images.new_full((images.shape[0], 3, 12, 12), 0)
        for i in range(batch.shape[0]):
            batch[i, :, :images.shape[2], :images.shape[3]].copy_(images[i])
        return self.conv(batch)


@pytest.mark.filterwarnings("ignore:tracedBatch left out")  # one copy_ per image
def test_copy_into_a_slice_of_a_fresh_batch_allocates_nothing(tmp_path):
    model = tracer.trace(BatchImages(), torch.randn(2, 3, 10, 10), loss="sum")
    copies = ops_of(model, "copy_")
    assert len(copies) == 2
    (full,) = ops_of(model, "full")
    assert attrs(full)["shape"] == [2, 3, 12, 12]
    # the convolution reads the batch the copies wrote into
    (conv,) = ops_of(model, "conv2d")
    assert conv["inputs"][0] == full["outputs"][0]
    assert not [t for t in model["ops"]["tensors"] if t["name"].startswith("const.")]
    estimate_both(model, 2, tmp_path)


def test_copy_of_a_tensor_that_requires_grad_into_a_view_is_refused():
    class Scatter(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            out = x.new_zeros(x.shape[0], 8)
            out[:, :4].copy_(self.lin(x))
            return out

    with pytest.raises(tracer.UnsupportedOp, match="CopySlices"):
        tracer.trace(Scatter(), torch.randn(3, 4), loss="sum")
    # without autograd (inference) the copy is an op like any other
    model = tracer.trace(Scatter(), torch.randn(3, 4), loss=None, training=False)
    assert "copy_" in kinds(model)


class Postprocess(nn.Module):
    """SSD's per-class filtering: a score threshold (a bool mask), topk, then nms."""

    def forward(self, scores, boxes):
        keep = scores > 0.2
        s, b = scores[keep], boxes[keep]
        s, idx = s.topk(min(6, s.numel()))
        return s[torchvision_ops().nms(b[idx], s, 0.5)]


def torchvision_ops():
    return pytest.importorskip("torchvision").ops


def _boxes(n):
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(n, 2, generator=g) * 24
    return torch.cat([xy, xy + 4 + torch.rand(n, 2, generator=g) * 8], 1)


def test_detection_postprocessing_records_the_counts_it_saw(tmp_path):
    scores = torch.rand(20, generator=torch.Generator().manual_seed(1))
    model = tracer.trace(Postprocess(), (scores, _boxes(20)), batch_dim=-1, loss=None,
                         training=False)
    assert model.path == "real"  # nonzero has no meta kernel
    ks = kinds(model)
    # x[mask] is aten's nonzero, the column of positions, then index with it (twice here)
    assert ks[:3] == ["gt", "nonzero", "squeeze"] and ks.count("index") == 4
    # each x[mask] runs its own nonzero
    assert [attrs(op)["count"] for op in ops_of(model, "nonzero")] == [int((scores > 0.2).sum())] * 2
    (nms,) = ops_of(model, "nms")
    kept = torchvision_ops().nms(_boxes(20)[scores > 0.2][scores[scores > 0.2].topk(6)[1]],
                                 scores[scores > 0.2].topk(6)[0], 0.5)
    assert attrs(nms) == {"iou_threshold": 0.5, "count": len(kept)}
    assert "topk" in ks
    peaks = estimate_inference(model, tmp_path)
    assert peaks["cuda"] > 0 and peaks["cpu-1.13"] > 0


class PoolLevels(nn.Module):
    """MultiScaleRoIAlign's pattern: roi_align per level, written into a zeroed result."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x, rois, level_idx):
        feats = self.conv(x)
        out = torch.zeros(rois.shape[0], 4, 2, 2)
        out[level_idx] = torchvision_ops().roi_align(feats, rois[level_idx], (2, 2), 1.0, 2)
        return out


def test_roi_align_written_into_a_zeroed_result_trains(tmp_path):
    rois = torch.cat([torch.zeros(5, 1), _boxes(5) / 4], 1)
    model = tracer.trace(PoolLevels(), (torch.randn(1, 3, 8, 8), rois, torch.tensor([0, 2, 3])),
                         batch_dim=-1, loss="sum")
    (roi,) = ops_of(model, "roi_align")
    assert attrs(roi) == {"output_size": [2, 2], "spatial_scale": 1.0, "sampling_ratio": 2}
    (put,) = ops_of(model, "index_put_")
    assert put["inputs"][2] == roi["outputs"][0]
    # the loss reads the result the write made (its gradient reaches roi_align and the conv)
    assert model["ops"]["ops"][-1]["inputs"] == put["outputs"]
    estimate_both(model, 1, tmp_path)
