"""memest.trace on the masks and copies Hugging Face and torchvision models make in forward:
comparisons of token ids and attention masks, RoBERTa's cumsum position ids, OPT's
torch.max(scores, torch.tensor(min)), and torchvision's batch_images (copy_ into a slice of a
zeroed batch). What they cost is checked against PyTorch 1.13 by the conformance suite
(ops/compare_masks, ops/maximum_*, ops/cumsum_positions, ops/copy_into_slice, and the zoo's
hf_roberta, hf_distilbert, hf_opt); these tests pin down what each is recorded as.
"""
import pytest
import torch
import torch.nn as nn

from memest import tracer
from test_tracer_ops import attrs, estimate_both, kinds, ops_of


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
