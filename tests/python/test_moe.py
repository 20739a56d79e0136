"""Mixture-of-experts models from their configs (Mixtral, Qwen2-MoE), through the Python client
and against real transformers 4.47 on PyTorch 1.13's CPU: the zoo's small MoE models, whose
routers route as memest's expert_load says (zoo_models.route_experts), measured, traced and
estimated by `memest --hf-config`.
"""
import pathlib
import sys

import pytest

import memest

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = REPO / "tests" / "data" / "hf_configs"
EXACT = ("saved_for_backward", "end_of_step.")


def _run(name):
    """hf_config_check's run_one for the zoo model `name`, and the suite's run module."""
    sys.path.insert(0, str(REPO / "tests" / "conformance"))
    import hf_config_check
    import run as suite
    return hf_config_check.run_one(name, suite.find_memest(None), suite.onednn_isa(), None), suite


def _offsets(name):
    result, suite = _run(name)  # puts tests/conformance on the path first
    import hf_config_check
    return hf_config_check.offsets(result), suite


def test_qwen2_moe_is_off_by_what_dense_qwen2_is():
    """Qwen2-MoE with balanced routing (4 experts, 2 per token, a shared expert): memest's offset
    from the measurement is its dense Qwen2's (transformers 4.47's own differences from the
    transformers 5 memest follows, docs/hf-config.md), to the byte for saved and end-of-step
    bytes, and within the suite's peak tolerance: the MoE layers add nothing to it."""
    pytest.importorskip("transformers")
    moe, suite = _offsets("qwen2_moe")
    dense, _ = _offsets("qwen2")
    assert set(moe) == set(dense)
    for key, (offset, measured) in moe.items():
        if key[2].startswith(EXACT):
            assert offset == dense[key][0], (key, offset, dense[key])
        else:
            assert abs(offset - dense[key][0]) <= suite.PEAK_TOLERANCE * measured, key


def test_mixtral_moe_blocks_hold_what_the_trace_holds():
    """Mixtral with its worst routing (every token to the last two of four experts): each
    block_sparse_moe saves and outputs what the traced real model does, byte for byte (the trace
    itself is the measurement's, saved bytes exact). The rest of transformers 4.47's Mixtral
    differs from transformers 5's (per-layer rotary caches), which memest follows."""
    pytest.importorskip("transformers")
    result, _ = _run("mixtral")
    checked = 0
    for m in result["modes"]:
        for st in m["steps"]:
            sums = {}
            for scope, d in st["layers"].items():
                if ".block_sparse_moe" not in scope:
                    continue
                block = scope[:scope.index(".block_sparse_moe")]
                for field in ("savedBytes", "outputBytes"):
                    hf, traced = d.get(field, [0, 0])
                    s = sums.setdefault((block, field), [0, 0])
                    s[0] += hf
                    s[1] += traced
            for key, (hf, traced) in sums.items():
                assert hf == traced, (m["mode"], st["step"], key, hf, traced)
                checked += 1
    assert checked > 0


@pytest.mark.parametrize("cls, config, kwargs", [
    ("MixtralForCausalLM", "MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2)),
    ("Qwen2MoeForCausalLM", "Qwen2MoeConfig",
     dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
          shared_expert_intermediate_size=64, mlp_only_layers=[1])),
])
def test_a_moe_config_has_the_models_parameters(client, cls, config, kwargs):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    cfg = getattr(transformers, config)(vocab_size=512, hidden_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2,
                                        intermediate_size=128, max_position_embeddings=64, **kwargs)
    model = getattr(transformers, cls)(cfg)
    result = client.estimate(hf_config=cfg, seq=16, advice=False)
    assert result.parameter_count == sum(p.numel() for p in model.parameters())


def test_the_expert_load_is_a_setting_of_the_run(client):
    kwargs = dict(hf_config=str(CONFIGS / "mixtral-8x7b.json"), seq=1024, precision="bf16-pure",
                  mode="inference", advice=False)
    default = client.estimate(**kwargs)
    worst = client.estimate(expert_load="worst", **kwargs)
    balanced = client.estimate(expert_load="balanced", **kwargs)
    assert default.response == worst.response
    assert default.parameter_count == 46_702_792_704
    assert balanced.peak.allocated_bytes < worst.peak.allocated_bytes
    with pytest.raises(memest.InvalidArgument, match=r"config\.expert_load"):
        client.estimate(hf_config=str(CONFIGS / "llama-2-7b.json"), seq=128, expert_load="balanced",
                        advice=False)
    with pytest.raises(memest.InvalidArgument, match="expert_load"):
        client.estimate(expert_load="even", **kwargs)
