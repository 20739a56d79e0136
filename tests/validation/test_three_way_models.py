"""The PyTorch models of three_way.py against memest's presets, on the CPU (PyTorch 1.13 or 2.x).

- Each configuration's model, built on the meta device, has exactly memest's parameter count
  (`memest estimate --local --json`) and memest's parameter + buffer bytes (the `parameters`
  category under `--runtime cpu-1.13`, which counts tensors' exact bytes): the tied weights, the
  causal masks, BatchNorm's running statistics and BERT's id buffers included.
- Without the memest binary, the counts the presets document are checked instead.
- A small version of each model family runs three_way.py's training step on the CPU, so the
  step code itself is exercised under the PyTorch installed here.

    /usr/bin/python3 -m pytest tests/validation
"""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import three_way  # noqa: E402
import torch_models  # noqa: E402

MEMEST = os.environ.get("MEMEST_BIN", os.path.join(three_way.REPO, "build", "bin", "memest"))
needs_memest = pytest.mark.skipif(not os.access(MEMEST, os.X_OK),
                                  reason=f"{MEMEST} not built (ninja -C build memest)")


def memest_json(*args):
    out = subprocess.run([MEMEST] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, timeout=120)
    assert out.returncode in (0, 2), out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def presets():
    return memest_json("presets", "--local", "--json")["presets"]


@needs_memest
@pytest.mark.parametrize("config", three_way.CONFIGS, ids=lambda c: c.name)
def test_model_matches_memest_preset(config, presets):
    values = three_way.preset_values(presets, config)
    model = torch_models.build_model(config.preset, values, "meta")
    estimate = memest_json("estimate", "--local", "--json", "--no-advice", *config.memest_flags())
    assert torch_models.parameter_count(model) == int(estimate["parameterCount"])
    # Exact tensor bytes: fp32 parameters, bool masks, int64 buffers; tied weights once.
    exact = memest_json("estimate", "--local", "--json", "--no-advice", "--runtime", "cpu-1.13",
                        "--preset", config.preset, "--batch", "1",
                        *sum((["--param", f"{k}={v}"] for k, v in config.overrides().items()), []))
    assert torch_models.state_bytes(model) == int(exact["endOfStep"]["parameters"])


@needs_memest
def test_every_configuration_fits_an_h100(presets):
    for config in three_way.CONFIGS:
        estimate = memest_json("estimate", "--local", "--json", "--no-advice",
                               "--device", three_way.FIT_DEVICE, *config.memest_flags())
        assert estimate["fit"]["fits"], config.name


# The counts the presets document (engine/models/presets.cc), with their default parameters.
DOCUMENTED = {
    "gpt2-small": ({"seq": 1024, "layers": 12, "d_model": 768, "heads": 12, "vocab": 50257}, 124439808),
    "gpt2-medium": ({"seq": 1024, "layers": 24, "d_model": 1024, "heads": 16, "vocab": 50257}, 354823168),
    "bert-base": ({"seq": 512, "layers": 12, "d_model": 768, "heads": 12, "vocab": 30522}, 109514298),
    "resnet18": ({"image": 224, "classes": 1000}, 11689512),
    "resnet50": ({"image": 224, "classes": 1000}, 25557032),
    "mlp": ({"layers": 3, "width": 1024, "input": 784, "classes": 10}, 2913290),
}


@pytest.mark.parametrize("preset", sorted(DOCUMENTED))
def test_documented_parameter_counts(preset):
    values, count = DOCUMENTED[preset]
    assert torch_models.parameter_count(torch_models.build_model(preset, values, "meta")) == count


def test_tied_weights_stay_tied():
    values, _ = DOCUMENTED["gpt2-small"]
    small = dict(values, layers=1, d_model=32, heads=2, vocab=100)
    gpt = torch_models.build_model("gpt2-small", small, "cpu")
    gpt.to(torch.device("cpu"))
    assert gpt.lm_head.weight is gpt.wte.weight
    bert = torch_models.build_model("bert-base", dict(small, seq=16), "cpu")
    assert bert.decoder.weight is bert.word_embeddings.weight and bert.decoder.bias is bert.bias


# Small versions of each family: the training step of three_way.py, twice, on the CPU.
SMALL = [
    ("gpt2-small", {"seq": 16, "layers": 2, "d_model": 32, "heads": 4, "vocab": 97}, "adamw"),
    ("bert-base", {"seq": 16, "layers": 2, "d_model": 32, "heads": 4, "vocab": 97}, "adamw"),
    ("resnet18", {"image": 32, "classes": 10}, "momentum"),
    ("resnet50", {"image": 32, "classes": 10}, "momentum"),
    ("mlp", {"layers": 2, "width": 32, "input": 20, "classes": 5}, "adamw"),
]


@pytest.mark.parametrize("preset,values,optimizer", SMALL, ids=[s[0] for s in SMALL])
def test_training_step_runs_on_cpu(preset, values, optimizer):
    torch.manual_seed(0)
    device = torch.device("cpu")
    model = torch_models.build_model(preset, values, "cpu")
    model.train()
    opt = torch_models.make_optimizer(optimizer, model.parameters())
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(2):
        loss = torch_models.train_step(model, opt, preset, values, 2, device, None)
        assert math.isfinite(loss)
    assert all(p.grad is None for p in model.parameters())  # zero_grad(set_to_none=True)
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert len(opt.state) == len(list(model.parameters()))
