"""Hugging Face configs through the Python client: a config.json path, its dict, or a
transformers PretrainedConfig; the models memest builds have the parameters transformers builds.
"""
import json
import pathlib

import pytest

import memest

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = REPO / "tests" / "data" / "hf_configs"


def test_a_config_path_and_its_dict_agree(client):
    path = CONFIGS / "llama-3.2-1b.json"
    from_path = client.estimate(hf_config=str(path), seq=256, mode="inference", advice=False)
    from_dict = client.estimate(hf_config=json.loads(path.read_text()), seq=256,
                                mode="inference", advice=False)
    assert from_path.parameter_count == 1_235_814_400  # Llama-3.2-1B, tied embeddings
    assert from_path.response == from_dict.response


def test_a_model_directory_is_read_through_its_config_json(client, tmp_path):
    (tmp_path / "config.json").write_text((CONFIGS / "qwen3-0.6b.json").read_text())
    result = client.estimate(hf_config=str(tmp_path), seq=64, mode="inference", advice=False)
    assert result.parameter_count == 596_049_920


def test_torch_dtype_is_the_precision_unless_one_is_given(client):
    path = str(CONFIGS / "qwen2.5-0.5b.json")  # torch_dtype bfloat16
    stored = client.estimate(hf_config=path, seq=128, mode="inference", advice=False)
    fp32 = client.estimate(hf_config=path, seq=128, mode="inference", precision="fp32",
                           advice=False)
    # bfloat16 weights take half the float32 ones' bytes (each allocation rounded to 512 B).
    assert abs(2 * stored.end_of_step.parameters / fp32.end_of_step.parameters - 1) < 1e-4
    assert stored.label == "qwen2 config seq=128, batch 1"
    assert any("from the config's torch_dtype bfloat16" in note
               for note in stored.notes)
    assert not any("torch_dtype" in note for note in fp32.notes)


def test_bad_configs_are_refused_naming_the_field(client, tmp_path):
    path = str(CONFIGS / "gpt2.json")
    with pytest.raises(memest.InvalidArgument, match=r"model\.hf_config\.seq: required"):
        client.estimate(hf_config=path)
    with pytest.raises(memest.InvalidArgument, match=r"model\.hf_config\.seq: must be at most"):
        client.estimate(hf_config=path, seq=4096)
    with pytest.raises(memest.InvalidArgument,
                       match=r"model\.hf_config\.config\.model_type: 'bloom' is not supported"):
        client.estimate(hf_config={"model_type": "bloom"}, seq=8)
    with pytest.raises(memest.InvalidArgument, match="cannot open the file"):
        client.estimate(hf_config=str(tmp_path / "missing.json"), seq=8)
    with pytest.raises(memest.InvalidArgument, match="hf_config: expected a path"):
        client.estimate(hf_config=42, seq=8)
    with pytest.raises(memest.InvalidArgument, match="preset and hf_config: give one"):
        client.estimate(preset="mlp", hf_config=path, seq=8)
    with pytest.raises(memest.InvalidArgument, match="params: only apply to a preset"):
        client.estimate(hf_config=path, seq=8, params={"layers": 2})


SMALL = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64)


@pytest.mark.parametrize("cls, config, kwargs", [
    ("LlamaForCausalLM", "LlamaConfig", dict(SMALL, attention_bias=True, tie_word_embeddings=True)),
    ("MistralForCausalLM", "MistralConfig", dict(SMALL, sliding_window=8)),
    ("Qwen2ForCausalLM", "Qwen2Config", SMALL),
    ("GemmaForCausalLM", "GemmaConfig", dict(SMALL, head_dim=32)),
    ("Gemma2ForCausalLM", "Gemma2Config", dict(SMALL, head_dim=16, sliding_window=8)),
    ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(SMALL, head_dim=16, sliding_window=8,
                                                   sliding_window_pattern=2)),
    ("Phi3ForCausalLM", "Phi3Config", dict(SMALL, pad_token_id=0)),
    ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(vocab_size=512, hidden_size=64,
                                                 num_hidden_layers=2, num_attention_heads=4,
                                                 intermediate_size=128)),
    ("GPT2LMHeadModel", "GPT2Config", dict(vocab_size=512, n_embd=64, n_layer=2, n_head=4,
                                             n_positions=64, n_inner=96)),
    ("FalconForCausalLM", "FalconConfig", dict(vocab_size=512, hidden_size=64,
                                               num_hidden_layers=2, num_attention_heads=4)),
    ("FalconForCausalLM", "FalconConfig", dict(vocab_size=512, hidden_size=64,
                                               num_hidden_layers=2, num_attention_heads=4,
                                               new_decoder_architecture=True, num_kv_heads=2,
                                               bias=True, ffn_hidden_size=96)),
    ("BertForMaskedLM", "BertConfig", dict(vocab_size=512, hidden_size=64, num_hidden_layers=2,
                                           num_attention_heads=4, intermediate_size=96,
                                           max_position_embeddings=64, type_vocab_size=3)),
    ("RobertaForMaskedLM", "RobertaConfig", dict(vocab_size=512, hidden_size=64,
                                                 num_hidden_layers=2, num_attention_heads=4,
                                                 intermediate_size=96,
                                                 max_position_embeddings=80, pad_token_id=1)),
    ("ViTForImageClassification", "ViTConfig", dict(hidden_size=64, num_hidden_layers=2,
                                                    num_attention_heads=4, intermediate_size=96,
                                                    image_size=32, patch_size=8, num_labels=7,
                                                    qkv_bias=False)),
    ("T5ForConditionalGeneration", "T5Config", dict(vocab_size=512, d_model=64, d_kv=8,
                                                    d_ff=96, num_layers=2, num_decoder_layers=3,
                                                    num_heads=4)),
    ("T5ForConditionalGeneration", "T5Config", dict(vocab_size=512, d_model=64, d_kv=16, d_ff=96,
                                                    num_layers=2, num_heads=4,
                                                    feed_forward_proj="gated-gelu",
                                                    tie_word_embeddings=False)),
    ("OPTForCausalLM", "OPTConfig", dict(vocab_size=512, hidden_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, ffn_dim=128,
                                         word_embed_proj_dim=32, do_layer_norm_before=False,
                                         max_position_embeddings=64)),
])
def test_a_transformers_config_has_the_models_parameters(client, cls, config, kwargs):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    if not hasattr(transformers, config):  # Gemma 3 came in transformers 4.50
        pytest.skip(f"{config} is not in transformers {transformers.__version__}")
    cfg = getattr(transformers, config)(**kwargs)
    model = getattr(transformers, cls)(cfg)
    real = sum(p.numel() for p in model.parameters())
    # an image model's sequence is its image's: left unset
    seq = None if config == "ViTConfig" else 16
    result = client.estimate(hf_config=cfg, seq=seq, advice=False)
    assert result.parameter_count == real


def test_a_transformers_config_keeps_its_attention(client):
    transformers = pytest.importorskip("transformers")
    small = dict(SMALL)
    eager = client.estimate(hf_config=transformers.LlamaConfig(attn_implementation="eager",
                                                               **small),
                            seq=16, mode="inference", advice=False)
    sdpa = client.estimate(hf_config=transformers.LlamaConfig(**small), seq=16,
                           mode="inference", advice=False)
    # Eager attention builds the [T, T] causal mask buffer; SDPA runs is_causal without one.
    assert eager.end_of_step.parameters > sdpa.end_of_step.parameters

