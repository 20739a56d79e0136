"""A served model through the Python client (serving=True or a dict of vLLM's engine
arguments): the answer's .serving holds vLLM's startup budget and what its KV cache holds, and
agrees with vLLM 0.19.0's startup log on H100 (docs/serving.md).
"""
import pathlib

import pytest

import memest

REPO = pathlib.Path(__file__).resolve().parents[2]
LLAMA31 = str(REPO / "tests" / "data" / "hf_configs" / "llama-3.1-8b.json")


def test_serving_answers_the_questions_a_server_asks(client):
    e = client.estimate(hf_config=LLAMA31, device="h100-80gb", advice=False,
                        serving={"gpu_memory_utilization": 0.95, "max_model_len": 8192,
                                 "concurrency": 64, "request_tokens": 2048})
    s = e.serving
    assert isinstance(s, memest.Serving)
    assert s.starts and s.refusal == ""
    assert (s.max_num_seqs, s.max_num_batched_tokens, s.block_size) == (1024, 8192, 16)
    # vLLM 0.19.0 logged "GPU KV cache size: 476,016 tokens" for this run.
    assert 0.995 * 476_016 <= s.kv_tokens <= 1.001 * 476_016
    assert s.kv_tokens == s.num_blocks * 16
    assert s.kv_cache_bytes == (s.requested_bytes - s.weights_bytes - s.activation_peak_bytes
                                - s.non_torch_bytes)
    assert s.concurrent_requests == min(1024, (s.num_blocks - 1) // 128)
    assert s.longest_request == min(8192, (s.num_blocks - 1) // 64 * 16)
    assert "tokens of KV cache" in repr(e)
    assert e.fit.fits


def test_serving_with_defaults_and_a_refusal(client):
    e = client.estimate(hf_config=LLAMA31, device="l4", serving=True, advice=False)
    assert not e.serving.starts
    assert "To serve at least one request" in e.serving.refusal
    assert e.serving.max_model_len == 131072
    assert "vLLM does not start" in repr(e)


@pytest.mark.parametrize("kwargs, message", [
    (dict(serving={"max_seqs": 8}), "serving['max_seqs']: unknown"),
    (dict(serving={"kv_cache_dtype": "int4"}), "kv_cache_dtype"),
    (dict(serving="yes"), "serving: True or a dict"),
    (dict(serving=True, batch_size=4), "config.batch_size: a server's batches"),
    (dict(serving=True, mode="training"), "config.mode: a server runs inference"),
])
def test_serving_refusals_name_the_field(client, kwargs, message):
    with pytest.raises(memest.InvalidArgument, match=".*" + message.replace("[", r"\[")
                       .replace("]", r"\]").replace("'", "'")):
        client.estimate(hf_config=LLAMA31, device="h100-80gb", **kwargs)


def test_serving_a_quantized_checkpoint(client):
    # A config.json with its quantization_config: RedHatAI's Llama-3.1-8B W8A8 (compressed-
    # tensors), served in float16 as vLLM 0.19.0 logged it: 529,200 tokens.
    import json
    config = json.loads(pathlib.Path(LLAMA31).read_text())
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "int-quantized", "ignore": ["lm_head"],
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True},
            "input_activations": {"num_bits": 8, "type": "int", "strategy": "token",
                                  "dynamic": True, "symmetric": True}}}}
    e = client.estimate(hf_config=config, device="h100-80gb", precision="fp16-pure",
                        advice=False, serving={"gpu_memory_utilization": 0.95,
                                               "max_model_len": 8192})
    assert 0.995 * 529_200 <= e.serving.kv_tokens <= 1.001 * 529_200
    # The same as memest's own names (the CLI's --quantize w8a8-int8).
    f = client.estimate(hf_config=LLAMA31, device="h100-80gb", precision="fp16-pure",
                        advice=False, quantization={"format": "w8a8-int8"},
                        serving={"gpu_memory_utilization": 0.95, "max_model_len": 8192})
    assert f.serving.kv_tokens == e.serving.kv_tokens
    with pytest.raises(memest.InvalidArgument, match="quantization.bits: not a setting"):
        client.estimate(hf_config=LLAMA31, device="h100-80gb", serving=True,
                        quantization={"format": "w4a16", "bits": 4})


@pytest.mark.parametrize("quantization, message", [
    ({"format": "w4a16", "zero_point": "false"}, "quantization.zero_point: True or False"),
    ({"format": "w4a16", "group_size": 64.9}, "quantization.group_size: an integer"),
    ({"format": "w8a8-fp8", "block": ["a", 128]}, "quantization.block: \\[n, k\\]"),
    ({"format": "w4a16", "skip_modules": [3]}, "quantization.skip_modules\\[0\\]"),
    ({"format": "int3"}, "quantization.format: 'int3'"),
])
def test_serving_quantization_refusals_name_the_field(client, quantization, message):
    with pytest.raises(memest.InvalidArgument, match=message):
        client.estimate(hf_config=LLAMA31, device="h100-80gb", serving=True,
                        quantization=quantization)


def test_serving_lora_adapters(client):
    """vLLM's --enable-lora --max-loras 4 --max-lora-rank 16 on Llama-3-8B: the slots of every
    wrapped module (369,426,432 bytes, docs/serving.md) and the punica wrapper's index tensors
    (56 x 8192 + 24 x 1024 + 24 x 4 + 32 bytes)."""
    llama3 = str(REPO / "tests" / "data" / "hf_configs" / "llama-3-8b.json")
    plain = client.estimate(hf_config=llama3, device="h100-80gb", advice=False,
                            serving={"max_model_len": 8192})
    e = client.estimate(hf_config=llama3, device="h100-80gb", advice=False, lora={"r": 16},
                        serving={"max_model_len": 8192, "max_loras": 4})
    assert e.serving.lora_bytes == 369_426_432 + 56 * 8192 + 24 * 1024 + 24 * 4 + 32
    assert e.serving.weights_bytes - plain.serving.weights_bytes >= e.serving.lora_bytes
    assert e.serving.kv_cache_bytes < plain.serving.kv_cache_bytes
    assert plain.serving.lora_bytes == 0
    with pytest.raises(memest.InvalidArgument, match="config.lora.rank: vLLM's max_lora_rank"):
        client.estimate(hf_config=llama3, device="h100-80gb", advice=False, lora={"r": 12},
                        serving=True)
