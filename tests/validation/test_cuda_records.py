"""memest against real models' steps recorded on a GPU, without the GPU.

tests/data/cuda/h200-torch2.11 holds what tests/validation/cuda_record.py measured on an NVIDIA
H200 under PyTorch 2.11 (CUDA 13.0, cuDNN 9.19): per case, the steady-state step's per-phase peaks
and the model as memest.trace traced it there. Each case is estimated again here
(tests/validation/cuda_compare.py) and the step's peak of allocated memory must lie in its band:
at most MAX_OVER above PyTorch's and at least the case's floor below it. A floor below zero is an
under-prediction we know of, with its cause; it may only rise.

    /usr/bin/python3 -m pytest tests/validation/test_cuda_records.py
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuda_compare  # noqa: E402

RECORDS = os.path.join(cuda_compare.REPO, "tests", "data", "cuda", "h200-torch2.11")
MEMEST = os.environ.get("MEMEST_BIN", os.path.join(cuda_compare.REPO, "build", "bin", "memest"))

# Where memest may say less than PyTorch allocated, and why (fractions of PyTorch's peak).
DEFAULT_FLOOR = -0.0025  # the parameters' blocks: ~1 MiB the allocator counts that memest does not
FLOORS = {
    # At the backward's peak, 15 MiB (ViT: 10 MiB) that no op's rule accounts for yet; the bias
    # gradients' row sums, which were most of it, are modelled.
    "transformer_encoder [training]": -0.0075,
    # The same requests to within 1 MiB; 43 MiB of blocks the allocator, warm from the first
    # step, hands out whole, where memest replays the steady step on an empty allocator.
    "bert-base-sdpa [training]": -0.0090,
    "vit_b_16 [training]": -0.0040,
    # 23 MiB already in the forward, not yet traced to an op.
    "llama-sdpa-bf16 [training]": -0.0050,
    # cuDNN's RNN workspace (187 MB here, about the reserve's size), which memest does not model.
    "lstm_lm [inference]": -0.10,
}
# Where memest says more, and why.
MAX_OVER = 0.01
CEILINGS = {
    # In eval mode under no_grad the tracer records nn.TransformerEncoderLayer's fast path as
    # 1.13 runs it, [B*H, T, T] scores and all; 2.x runs a fused SDPA kernel inside it on CUDA.
    "transformer_encoder [inference]": 0.21,
}

needs_memest = pytest.mark.skipif(not os.access(MEMEST, os.X_OK),
                                  reason=f"{MEMEST} not built (ninja -C build memest)")


@pytest.fixture(scope="module")
def compared():
    return cuda_compare.compare_dir(RECORDS, MEMEST)


@needs_memest
def test_every_record_is_estimated(compared):
    assert len(compared) == 15
    for name, _, rows, detail in compared:
        assert rows is not None, f"{name}: {detail}"


@needs_memest
def test_each_peak_lies_in_its_band(compared):
    out = []
    for name, _, rows, _ in compared:
        _, measured, estimated, _, _ = rows[-1]  # the step's peak
        error = (estimated - measured) / measured
        floor, ceiling = FLOORS.get(name, DEFAULT_FLOOR), CEILINGS.get(name, MAX_OVER)
        if not floor <= error <= ceiling:
            out.append(f"{name}: memest {estimated:,} B against PyTorch's {measured:,} B "
                       f"({100 * error:+.2f}%), outside [{100 * floor:+.2f}%, {100 * ceiling:+.2f}%]")
    assert not out, "\n".join(out)


def test_the_bands_name_recorded_cases():
    names = {f"{n.split('.')[0]} [{n.split('.')[1]}]" for n in os.listdir(RECORDS)
             if n.endswith(".json")}
    assert set(FLOORS) <= names and set(CEILINGS) <= names
