"""LoRA through the Python client (lora= takes a peft LoraConfig, a dict of its fields, or an
adapter_config.json), and against real PEFT: what LoRA adds to a model's step in memest is what
PEFT 0.13.2 adds on PyTorch 1.13's CPU, byte for byte.
"""
import json
import pathlib
import sys

import pytest

import memest

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = REPO / "tests" / "data" / "hf_configs"
LLAMA = str(CONFIGS / "llama-2-7b.json")


def test_a_lora_config_its_dict_and_its_file_agree(client, tmp_path):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"],
                             lora_dropout=0.05)
    kwargs = dict(hf_config=LLAMA, seq=512, precision="bf16-pure", advice=False)
    from_config = client.estimate(lora=config, **kwargs)
    from_dict = client.estimate(lora={"r": 16, "lora_alpha": 32, "lora_dropout": 0.05,
                                      "target_modules": ["q_proj", "v_proj"]}, **kwargs)
    saved = {k: sorted(v) if isinstance(v, set) else v for k, v in config.to_dict().items()}
    (tmp_path / "adapter_config.json").write_text(json.dumps(saved, default=str))
    from_dir = client.estimate(lora=str(tmp_path), **kwargs)
    assert from_config.response == from_dict.response == from_dir.response
    # PEFT's print_trainable_parameters for Llama-2-7B with r=16 on q_proj and v_proj.
    assert from_config.trainable_parameter_count == 8_388_608
    assert any("LoRA as PEFT" in note for note in from_config.notes)


@pytest.mark.parametrize("lora, message", [
    ({"r": 8, "target_modules": ["q_proj"], "bias": "all"}, "lora.bias"),
    ({"r": 8, "target_modules": r".*\.q_proj"}, "lora.target_modules"),
    ({"target_modules": ["q_proj"]}, "lora.r"),
    (42, "lora: expected a peft LoraConfig"),
])
def test_what_memest_does_not_model_is_refused_by_name(client, lora, message):
    with pytest.raises(memest.InvalidArgument, match=message.replace(".", r"\.")):
        client.estimate(hf_config=LLAMA, seq=128, lora=lora, advice=False)


def test_a_target_that_matches_nothing_is_named(client):
    with pytest.raises(memest.InvalidArgument,
                       match=r"config\.lora\.target_modules\[1\]: 'wq' matches no module"):
        client.estimate(hf_config=LLAMA, seq=128, lora={"r": 8, "target_modules": ["q_proj", "wq"]},
                        advice=False)


# ------------------------------------------------------------------ against real PEFT

EXACT = ("saved_for_backward", "end_of_step.")


@pytest.mark.parametrize("name, lora", [
    ("llama", {"r": 8, "target_modules": ["q_proj", "v_proj"]}),
    ("llama", {"r": 4, "target_modules": "all-linear", "lora_dropout": 0.1}),
    ("llama", {"r": 8, "target_modules": ["q_proj", "down_proj"], "modules_to_save": ["lm_head"]}),
    ("gpt2", {"r": 8, "target_modules": ["c_attn"], "lora_dropout": 0.1, "fan_in_fan_out": True}),
    ("llama", {"r": 8, "target_modules": ["q_proj", "v_proj"], "use_dora": True}),
    ("llama", {"r": 4, "target_modules": "all-linear", "lora_dropout": 0.1, "use_dora": True}),
])
def test_lora_adds_what_peft_adds(name, lora):
    """The zoo's small model measured by real PyTorch with and without PEFT's adapters, and
    estimated by `memest --hf-config` with and without --lora-config: memest's offset from the
    measurement (which transformers 4.47's own differences from the transformers 5 memest
    follows make, docs/hf-config.md) does not move: saved and end-of-step bytes to the byte;
    peaks within the suite's 1% (they move by tens of bytes, and by one hidden state up in the
    loss phase: transformers 5 keeps the last hidden state while the loss is computed, the
    zoo's loop computes it after forward returns, which a frozen lm_head, saving nothing,
    shows)."""
    pytest.importorskip("peft")
    sys.path.insert(0, str(REPO / "tests" / "conformance"))
    import hf_config_check
    import run as suite

    memest_bin = suite.find_memest(None)
    isa = suite.onednn_isa()
    base = hf_config_check.offsets(hf_config_check.run_one(name, memest_bin, isa, None))
    adapted = hf_config_check.offsets(hf_config_check.run_one(name, memest_bin, isa, None, lora))
    assert set(base) == set(adapted)
    for key, (offset, measured) in adapted.items():
        moved = offset - base[key][0]
        if key[2].startswith(EXACT):
            assert moved == 0, (key, offset, base[key])
        else:
            assert abs(moved) <= suite.PEAK_TOLERANCE * measured, (key, offset, base[key])


# ------------------------------------------------------------------ QLoRA's 4-bit base

class _BitsAndBytesConfig:
    """What transformers 4.47's BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
    bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16).to_dict() returns
    (the class itself wants bitsandbytes installed, which needs CUDA)."""

    def to_dict(self):
        return {"quant_method": "bitsandbytes", "_load_in_8bit": False, "_load_in_4bit": True,
                "llm_int8_threshold": 6.0, "llm_int8_skip_modules": None,
                "llm_int8_enable_fp32_cpu_offload": False, "llm_int8_has_fp16_weight": False,
                "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
                "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_storage": "uint8",
                "load_in_4bit": True, "load_in_8bit": False}


def test_a_bits_and_bytes_config_and_its_dict_agree(client):
    config = _BitsAndBytesConfig()
    kwargs = dict(hf_config=str(CONFIGS / "llama-3-8b.json"), seq=1024, precision="bf16-pure",
                  lora={"r": 16, "target_modules": "all-linear"}, advice=False)
    a = client.estimate(quantization=config, **kwargs)
    b = client.estimate(quantization={"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                      "bnb_4bit_use_double_quant": True,
                                      "bnb_4bit_compute_dtype": "bfloat16"}, **kwargs)
    assert a.response == b.response
    # Llama-3-8B (two 4-bit values per byte) and its adapters.
    assert a.parameter_count == 8_030_261_248 + 41_943_040
    assert a.trainable_parameter_count == 41_943_040
    assert any("NF4, double quantization" in note for note in a.notes)


class _BitsAndBytes8bitConfig:
    """What transformers' BitsAndBytesConfig(load_in_8bit=True).to_dict() returns (the 4-bit
    keys at their defaults beside the 8-bit ones)."""

    def to_dict(self):
        return {"quant_method": "bitsandbytes", "_load_in_8bit": True, "_load_in_4bit": False,
                "llm_int8_threshold": 6.0, "llm_int8_skip_modules": None,
                "llm_int8_enable_fp32_cpu_offload": False, "llm_int8_has_fp16_weight": False,
                "bnb_4bit_quant_type": "fp4", "bnb_4bit_use_double_quant": False,
                "bnb_4bit_compute_dtype": "float32", "bnb_4bit_quant_storage": "uint8",
                "load_in_4bit": False, "load_in_8bit": True}


def test_an_8bit_base_takes_a_byte_a_weight(client):
    kwargs = dict(hf_config=str(CONFIGS / "llama-3-8b.json"), seq=1024, precision="bf16-pure",
                  lora={"r": 16, "target_modules": "all-linear"}, advice=False)
    a = client.estimate(quantization=_BitsAndBytes8bitConfig(), **kwargs)
    b = client.estimate(quantization={"load_in_8bit": True}, **kwargs)
    assert a.response == b.response
    assert a.parameter_count == 8_030_261_248 + 41_943_040
    assert any("LLM.int8" in note and "7 such columns" in note for note in a.notes)
    wider = client.estimate(quantization={"load_in_8bit": True, "int8_outlier_columns": 512},
                            **kwargs)
    # More outlier columns: more of each input kept by the 8-bit layers' nodes.
    assert wider.saved_for_backward_bytes > a.saved_for_backward_bytes


def test_fp8_training_with_transformer_engine(client):
    kwargs = dict(hf_config=str(CONFIGS / "llama-3-8b.json"), seq=1024, precision="bf16",
                  device="h100-80gb", advice=False)
    bf16 = client.estimate(**kwargs)
    fp8 = client.estimate(fp8="delayed", **kwargs)
    same = client.estimate(fp8={"recipe": "delayed", "amax_history_len": 1024}, **kwargs)
    assert fp8.response == same.response
    assert fp8.saved_for_backward_bytes < bf16.saved_for_backward_bytes
    assert any("te.Linear" in note for note in fp8.notes)
    with pytest.raises(memest.InvalidArgument, match="fp8.recipe"):
        client.estimate(fp8="sometimes", **kwargs)
    with pytest.raises(memest.InvalidArgument, match="compute capability 8.9"):
        client.estimate(fp8="current", **dict(kwargs, device="a100-80gb"))


def test_a_torchao_config_and_memest_names_agree(client):
    kwargs = dict(hf_config=str(CONFIGS / "llama-3-8b.json"), seq=1024, precision="bf16-pure",
                  mode="inference", advice=False)
    # transformers' TorchAoConfig(Int4WeightOnlyConfig(group_size=64)).to_dict()
    config = {"quant_method": "torchao", "modules_to_not_convert": None,
              "include_input_output_embeddings": False, "untie_embedding_weights": False,
              "quant_type": {"default": {"_type": "Int4WeightOnlyConfig", "_version": 2,
                                         "_data": {"group_size": 64, "version": 2}}}}
    a = client.estimate(quantization=config, **kwargs)
    b = client.estimate(quantization={"format": "torchao-int4", "group_size": 64}, **kwargs)
    assert a.response == b.response
    assert any("Int4WeightOnlyConfig, group_size 64" in note for note in a.notes)
    with pytest.raises(memest.InvalidArgument, match="quantization.quant_type"):
        client.estimate(quantization={"quant_method": "torchao",
                                      "quant_type": "float8_weight_only"}, **kwargs)
    preshuffled = {"quant_method": "torchao", "quant_type": {"default": {
        "_type": "Int4WeightOnlyConfig",
        "_data": {"group_size": 128, "int4_packing_format": "preshuffled"}}}}
    with pytest.raises(memest.InvalidArgument, match="int4_packing_format"):
        client.estimate(quantization=preshuffled, **kwargs)


@pytest.mark.parametrize("quantization, message", [
    ({"load_in_8bit": True, "load_in_4bit": True}, "quantization.load_in_4bit"),
    ({"load_in_8bit": True, "llm_int8_has_fp16_weight": True},
     "quantization.llm_int8_has_fp16_weight"),
    ({"load_in_8bit": True, "llm_int8_threshold": "high"}, "quantization.llm_int8_threshold"),
    ({"load_in_8bit": True, "int8_outlier_columns": -1},
     r"config\.quantization\.int8_outlier_columns"),
    ({"load_in_4bit": True, "bnb_4bit_quant_type": "int4"}, "quantization.bnb_4bit_quant_type"),
    ({"load_in_4bit": True, "llm_int8_skip_modules": ["score"]},
     r"config\.quantization\.skip_modules\[0\]: 'score' matches no"),
])
def test_quantization_refusals_name_the_field(client, quantization, message):
    with pytest.raises(memest.InvalidArgument, match=message):
        client.estimate(hf_config=LLAMA, seq=128, precision="bf16-pure", quantization=quantization,
                        advice=False)


def test_bitsandbytes_optimizers_keep_8bit_state(client):
    kwargs = dict(hf_config=LLAMA, seq=256, precision="bf16-pure", advice=False,
                  lora={"r": 16, "target_modules": ["q_proj", "v_proj"]})
    fp32 = client.estimate(optimizer="adamw", **kwargs)
    paged = client.estimate(optimizer="paged-adamw-8bit", **kwargs)
    # 8,388,608 adapter values (all of 65,536 or more): 2 bytes and 2 float32 per 256 each,
    # against AdamW's two float32 states.
    assert fp32.end_of_step.optimizer_state == 8 * 8_388_608
    assert paged.end_of_step.optimizer_state == 2 * 8_388_608 + 8 * 8_388_608 // 256
    assert any(note.startswith("paged optimizer") for note in paged.notes)
