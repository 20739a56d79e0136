"""Builds an EstimateRequest from the keyword arguments of Client.estimate.

The words are the `memest` command's (client/cli/flags.cc): precision="bf16",
optimizer="adamw", checkpoint="every-block", and so on. Anything this module refuses raises
InvalidArgument naming the argument, before any call is made.
"""

import json
import os
import re

from google.protobuf import json_format

from memest import v1
from memest.errors import InvalidArgument
from memest.lora import apply_lora, apply_quantization

MODES = {"training": v1.MODE_TRAINING, "inference": v1.MODE_INFERENCE}
RUNTIMES = {"cuda": v1.RUNTIME_CUDA, "cpu-1.13": v1.RUNTIME_CPU_TORCH_1_13}
CPU_ISAS = {"avx512": v1.CPU_ISA_AVX512, "avx2": v1.CPU_ISA_AVX2}
PRECISIONS = {
    "fp32": v1.PRECISION_FP32,
    "fp16": v1.PRECISION_FP16_AMP,
    "bf16": v1.PRECISION_BF16_AMP,
    "bf16-pure": v1.PRECISION_BF16_PURE,
    "fp16-pure": v1.PRECISION_FP16_PURE,
}
OPTIMIZERS = {
    "sgd": v1.OPTIMIZER_KIND_SGD,
    "momentum": v1.OPTIMIZER_KIND_SGD_MOMENTUM,
    "adam": v1.OPTIMIZER_KIND_ADAM,
    "adamw": v1.OPTIMIZER_KIND_ADAMW,
    "adagrad": v1.OPTIMIZER_KIND_ADAGRAD,
    "rmsprop": v1.OPTIMIZER_KIND_RMSPROP,
    "lion": v1.OPTIMIZER_KIND_LION,
    "adafactor": v1.OPTIMIZER_KIND_ADAFACTOR,
    "hf-adamw": v1.OPTIMIZER_KIND_HF_ADAMW,
    "hf-adafactor": v1.OPTIMIZER_KIND_HF_ADAFACTOR,
    "adamw-bnb-8bit": v1.OPTIMIZER_KIND_BNB_ADAMW_8BIT,
    "paged-adamw-8bit": v1.OPTIMIZER_KIND_BNB_PAGED_ADAMW_8BIT,
    "paged-adamw-32bit": v1.OPTIMIZER_KIND_BNB_PAGED_ADAMW_32BIT,
}
# memest's names and Hugging Face's attn_implementation names.
ATTENTIONS = {
    "eager": v1.ATTENTION_EAGER,
    "sdpa": v1.ATTENTION_SDPA,
    "flash": v1.ATTENTION_FLASH,
    "flash_attention_2": v1.ATTENTION_FLASH,
    "mem-efficient": v1.ATTENTION_MEM_EFFICIENT,
    "cudnn": v1.ATTENTION_CUDNN,
}
MODULE_LOADINGS = {"lazy": v1.CUDA_MODULE_LOADING_LAZY, "eager": v1.CUDA_MODULE_LOADING_EAGER}
EXPERT_LOADS = {"worst": v1.EXPERT_LOAD_WORST, "balanced": v1.EXPERT_LOAD_BALANCED}
KV_CACHE_DTYPES = {"auto": v1.KV_CACHE_DTYPE_UNSPECIFIED, "fp8": v1.KV_CACHE_DTYPE_FP8_E4M3,
                   "fp8_e4m3": v1.KV_CACHE_DTYPE_FP8_E4M3, "fp8_e5m2": v1.KV_CACHE_DTYPE_FP8_E5M2}
# vLLM's engine arguments a `serving` dict may give, by their own names.
SERVING_SIZES = ("block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
                 "request_tokens", "concurrency", "max_loras")
PIPELINE_SCHEDULES = {"1f1b": v1.PIPELINE_SCHEDULE_1F1B, "gpipe": v1.PIPELINE_SCHEDULE_GPIPE}
TENSOR_STYLES = {"colwise": v1.TENSOR_SHARD_STYLE_COLWISE, "rowwise": v1.TENSOR_SHARD_STYLE_ROWWISE,
                 "colwise-gathered": v1.TENSOR_SHARD_STYLE_COLWISE_GATHERED}
TENSOR_LAYERS = {"megatron": v1.TENSOR_PARALLEL_LAYERS_MEGATRON,
                 "dtensor": v1.TENSOR_PARALLEL_LAYERS_DTENSOR}
DP_STRATEGIES = {"ddp": v1.DATA_PARALLEL_DDP, "zero1": v1.DATA_PARALLEL_ZERO1,
                 "deepspeed-zero2": v1.DATA_PARALLEL_DEEPSPEED_ZERO2,
                 "deepspeed-zero1": v1.DATA_PARALLEL_DEEPSPEED_ZERO1,
                 "deepspeed-zero3": v1.DATA_PARALLEL_DEEPSPEED_ZERO3,
                 "fsdp1": v1.DATA_PARALLEL_FSDP1, "fsdp2": v1.DATA_PARALLEL_FSDP2,
                 "megatron-ddp": v1.DATA_PARALLEL_MEGATRON_DDP,
                 "megatron-distopt": v1.DATA_PARALLEL_MEGATRON_DISTOPT}
OPTIMIZER_IMPLS = {
    "for-loop": v1.OPTIMIZER_IMPL_FOR_LOOP,
    "foreach": v1.OPTIMIZER_IMPL_FOREACH,
    "fused": v1.OPTIMIZER_IMPL_FUSED,
}
CHECKPOINTS = {
    "none": v1.CHECKPOINT_POLICY_NONE,
    "every-block": v1.CHECKPOINT_POLICY_EVERY_BLOCK,
    "every-k": v1.CHECKPOINT_POLICY_EVERY_K_BLOCKS,
    "sqrt": v1.CHECKPOINT_POLICY_SQRT_BLOCKS,
    "attention": v1.CHECKPOINT_POLICY_ATTENTION_CORE,
    "scopes": v1.CHECKPOINT_POLICY_SCOPES,
}

_CAPACITY_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "ki": 1 << 10, "kib": 1 << 10, "kb": 10**3,
    "m": 1 << 20, "mi": 1 << 20, "mib": 1 << 20, "mb": 10**6,
    "g": 1 << 30, "gi": 1 << 30, "gib": 1 << 30, "gb": 10**9,
    "t": 1 << 40, "ti": 1 << 40, "tib": 1 << 40, "tb": 10**12,
}


def _word(name, value, words):
    if value not in words:
        raise InvalidArgument('%s: unknown value "%s"; expected one of %s'
                              % (name, value, ", ".join(words)))
    return words[value]


def _assign(message, field, value, name):
    """message.field = value (or repeated.extend(value) when field is None), with a protobuf
    type or range error turned into InvalidArgument naming the argument."""
    try:
        if field is None:
            message.extend(value)
        else:
            setattr(message, field, value)
    except (TypeError, ValueError) as error:
        raise InvalidArgument("%s: %s" % (name, error)) from None


def parse_capacity(value, field="capacity_bytes"):
    """Bytes from an int or a string such as "24GiB", "80GB", "85899345920"; errors name
    `field`."""
    if isinstance(value, bool):
        raise InvalidArgument("%s: expected bytes or a size such as 24GiB, got %r"
                              % (field, value))
    if isinstance(value, int):
        return value
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(value))
    unit = match and _CAPACITY_UNITS.get(match.group(2).lower())
    if not unit:
        raise InvalidArgument('%s: expected bytes or a size such as 24GiB, got "%s" '
                              "(use B, KiB, MiB, GiB, TiB, or KB, MB, GB, TB)" % (field, value))
    return int(float(match.group(1)) * unit)


def build_model(preset=None, model=None, params=None, seq=None, hf_config=None):
    """A memest.v1.Model from a preset name (with params), a model description, or a Hugging Face
    config (with seq)."""
    given = [name for name, value in (("preset", preset), ("model", model),
                                       ("hf_config", hf_config)) if value is not None]
    if len(given) != 1:
        raise InvalidArgument("%s and %s: give one, not both" % tuple(given[:2]) if given
                              else "preset, model or hf_config: one is required")
    if hf_config is not None:
        if params:
            raise InvalidArgument("params: only apply to a preset; edit the config instead")
        message = v1.Model()
        try:
            message.hf_config.config.update(_hf_config_dict(hf_config))
        except (TypeError, ValueError) as error:
            raise InvalidArgument("hf_config: not a JSON object: %s" % (error,)) from None
        if seq is not None:
            _assign(message.hf_config, "seq", seq, "seq")
        return message
    if preset is not None:
        message = v1.Model()
        _assign(message.preset, "name", preset, "preset")
        for name, value in (params or {}).items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidArgument("params[%s]: expected an integer, got %r" % (name, value))
            message.preset.params[name] = value
        if seq is not None:
            message.preset.params["seq"] = seq
        return message
    if params or seq is not None:
        raise InvalidArgument("params/seq: only apply to a preset, not to a model")
    if isinstance(model, v1.Model):
        return model
    if isinstance(model, (str, os.PathLike)):
        return read_model_file(model)
    if isinstance(model, dict):
        return _parse_model_dict(model, "model")
    raise InvalidArgument("model: expected a dict in the proto JSON mapping, a path to a JSON "
                          "file or a memest.v1.Model, got %s" % type(model).__name__)


def _hf_config_dict(hf_config):
    """The config.json's object: from a path, a dict, or a transformers PretrainedConfig (all of
    its fields, defaults included)."""
    if isinstance(hf_config, (str, os.PathLike)):
        if os.path.isdir(hf_config):  # a model's directory (a hub snapshot) holds config.json
            hf_config = os.path.join(hf_config, "config.json")
        try:
            with open(hf_config, encoding="utf-8") as f:
                data = json.load(f)
        except OSError as error:
            raise InvalidArgument("hf_config %s: cannot open the file: %s"
                                  % (hf_config, error.strerror)) from None
        except ValueError as error:
            raise InvalidArgument("hf_config %s: not JSON: %s" % (hf_config, error)) from None
    elif isinstance(hf_config, dict):
        data = hf_config
    elif callable(getattr(hf_config, "to_json_string", None)):
        data = json.loads(hf_config.to_json_string(use_diff=False))
        # The JSON leaves out the attention the config was made with (attn_implementation=...):
        # transformers keeps it in _attn_implementation_internal (None when not chosen).
        chosen = vars(hf_config).get("_attn_implementation_internal")
        if isinstance(chosen, str):
            data["attn_implementation"] = chosen
    else:
        raise InvalidArgument("hf_config: expected a path to config.json, a dict or a "
                              "transformers PretrainedConfig, got %s" % type(hf_config).__name__)
    if not isinstance(data, dict):
        raise InvalidArgument("hf_config: expected a JSON object, got %s" % type(data).__name__)
    return data


def _parse_model_dict(data, where):
    try:
        return json_format.ParseDict(data, v1.Model())
    except json_format.ParseError as error:
        raise InvalidArgument("%s: not a memest.v1.Model: %s" % (where, error)) from None


def read_model_file(path):
    """A memest.v1.Model from a JSON file in the proto JSON mapping (as `memest --model`)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as error:
        raise InvalidArgument("model %s: cannot open the file: %s" % (path, error.strerror)) \
            from None
    except ValueError as error:
        raise InvalidArgument("model %s: not JSON: %s" % (path, error)) from None
    return _parse_model_dict(data, "model %s" % (path,))


def _apply_serving(config, serving):
    """config.serving from True (vLLM's defaults) or a dict of its engine arguments."""
    config.serving.SetInParent()
    if serving is True:
        return
    if not isinstance(serving, dict):
        raise InvalidArgument("serving: True or a dict of vLLM's settings, got %r" % (serving,))
    known = set(SERVING_SIZES) | {"gpu_memory_utilization", "kv_cache_dtype",
                                  "fully_sharded_loras"}
    for key, value in serving.items():
        if key not in known:
            raise InvalidArgument("serving[%r]: unknown; known: %s" % (key, ", ".join(sorted(known))))
        if key == "kv_cache_dtype":
            config.serving.kv_cache_dtype = _word("serving['kv_cache_dtype']", value,
                                                  KV_CACHE_DTYPES)
        else:
            _assign(config.serving, key, value, "serving[%r]" % key)


FP8_RECIPES = {"delayed": v1.FP8_RECIPE_DELAYED, "current": v1.FP8_RECIPE_CURRENT}


def _apply_fp8(config, fp8):
    """config.fp8 from "delayed" / "current" or {"recipe": ..., "amax_history_len": n}."""
    data = {"recipe": fp8} if isinstance(fp8, str) else fp8
    if not isinstance(data, dict) or set(data) - {"recipe", "amax_history_len"}:
        raise InvalidArgument("fp8: \"delayed\", \"current\" or a dict of recipe and "
                              "amax_history_len, got %r" % (fp8,))
    config.fp8.recipe = _word("fp8.recipe", data.get("recipe"), FP8_RECIPES)
    if data.get("amax_history_len") is not None:
        _assign(config.fp8, "amax_history_len", data["amax_history_len"], "fp8.amax_history_len")


def build_request(*, preset=None, model=None, params=None, seq=None, hf_config=None, batch_size=1,
                  grad_accum_steps=None, mode=None, precision=None, optimizer=None,
                  optimizer_impl=None, weight_decay=None, keep_grads=False, checkpoint=None,
                  checkpoint_k=None, checkpoint_scopes=(), checkpoint_non_reentrant=False,
                  first_step=False, device=None,
                  capacity_bytes=None, generate_tokens=None, expandable_segments=False,
                  runtime=None, cpu_isa=None, cpu_l1_cache_bytes=None, cpu_l2_cache_bytes=None,
                  hold_outputs=None, attention=None,
                  cuda_module_loading=None, cublas_workspace_config=None, data_parallel=None,
                  dp_strategy=None,
                  bucket_cap_mb=None, gradient_as_bucket_view=False, reduce_bucket_size=None,
                  overlap_comm=False, offload_optimizer=False, offload_param=False,
                  reshard_after_forward=None, keep_last_block_gathered=False,
                  fsdp_mixed_precision=False, fsdp_cpu_offload=False,
                  pipeline=None, pipeline_schedule=None, pipeline_keep_outputs=False,
                  tensor_parallel=None, sequence_parallel=False, tensor_plan=None,
                  tensor_layers=None, context_parallel=None, expert_parallel=None, pipeline_virtual_stages=None,
                  gpus_per_node=None,
                  data_shard=None, stage3_prefetch_bucket_size=None,
                  stage3_max_live_parameters=None, stage3_max_reuse_distance=None,
                  stage3_param_persistence_threshold=None, lora=None, quantization=None,
                  expert_load=None, serving=None, fp8=None, advice=True, layer_rows=None):
    """The EstimateRequest for Client.estimate's arguments (see its docstring)."""
    request = v1.EstimateRequest(model=build_model(preset, model, params, seq, hf_config))
    config = request.config
    if serving is False:
        serving = None
    if serving is None or batch_size != 1:  # a server's batches are its scheduler's
        _assign(config, "batch_size", batch_size, "batch_size")
    if serving is not None:
        _apply_serving(config, serving)
    if grad_accum_steps is not None:
        _assign(config, "grad_accum_steps", grad_accum_steps, "grad_accum_steps")
    if mode is not None:
        config.mode = _word("mode", mode, MODES)
    if precision is not None:
        config.precision = _word("precision", precision, PRECISIONS)
    if optimizer is not None:
        config.optimizer.kind = _word("optimizer", optimizer, OPTIMIZERS)
    if optimizer_impl is not None:
        config.optimizer.impl = _word("optimizer_impl", optimizer_impl, OPTIMIZER_IMPLS)
    if weight_decay is not None:
        _assign(config.optimizer, "weight_decay", weight_decay, "weight_decay")
    config.zero_grad_keep_grads = bool(keep_grads)
    if checkpoint is not None:
        config.checkpoint.policy = _word("checkpoint", checkpoint, CHECKPOINTS)
    if checkpoint_k is not None:
        _assign(config.checkpoint, "every_k", checkpoint_k, "checkpoint_k")
    config.checkpoint.non_reentrant = bool(checkpoint_non_reentrant)
    if isinstance(checkpoint_scopes, str):
        checkpoint_scopes = [checkpoint_scopes]
    if checkpoint_scopes:
        _assign(config.checkpoint.scopes, None, list(checkpoint_scopes), "checkpoint_scopes")
    if first_step:
        config.step = v1.STEP_KIND_FIRST_STEP
    if device is not None and capacity_bytes is not None:
        raise InvalidArgument("device and capacity_bytes: give one, not both")
    if device is not None:
        _assign(config, "device_name", device, "device")
    if capacity_bytes is not None:
        bytes_ = parse_capacity(capacity_bytes)
        if bytes_ <= 0:
            raise InvalidArgument("capacity_bytes: must be positive, got %d" % bytes_)
        config.device_capacity_bytes = bytes_
    if generate_tokens is not None:
        _assign(config, "generate_tokens", generate_tokens, "generate_tokens")
    config.expandable_segments = bool(expandable_segments)
    if runtime is not None:
        config.runtime = _word("runtime", runtime, RUNTIMES)
    if cpu_isa is not None:
        config.cpu_isa = _word("cpu_isa", cpu_isa, CPU_ISAS)
    if cpu_l1_cache_bytes is not None:
        _assign(config, "cpu_l1_cache_bytes", cpu_l1_cache_bytes, "cpu_l1_cache_bytes")
    if cpu_l2_cache_bytes is not None:
        _assign(config, "cpu_l2_cache_bytes", cpu_l2_cache_bytes, "cpu_l2_cache_bytes")
    if hold_outputs is not None:
        config.hold_outputs = bool(hold_outputs)
    if attention is not None:
        config.attention = _word("attention", attention, ATTENTIONS)
    if cuda_module_loading is not None:
        config.cuda_module_loading = _word("cuda_module_loading", cuda_module_loading,
                                           MODULE_LOADINGS)
    if cublas_workspace_config is not None:
        if not isinstance(cublas_workspace_config, str):
            raise InvalidArgument("cublas_workspace_config: CUBLAS_WORKSPACE_CONFIG's text, e.g. "
                                  "':4096:8', got " + repr(cublas_workspace_config))
        config.cublas_workspace_config = cublas_workspace_config
    if expert_load is not None:
        config.expert_load = _word("expert_load", expert_load, EXPERT_LOADS)
    if data_parallel is not None:
        _assign(config.parallelism, "data", data_parallel, "data_parallel")
    if dp_strategy is not None:
        config.parallelism.data_parallel = _word("dp_strategy", dp_strategy, DP_STRATEGIES)
    if bucket_cap_mb is not None:
        _assign(config.parallelism, "bucket_cap_mb", bucket_cap_mb, "bucket_cap_mb")
    if gradient_as_bucket_view:
        config.parallelism.gradient_as_bucket_view = True
    if reduce_bucket_size is not None:
        _assign(config.parallelism, "reduce_bucket_size", reduce_bucket_size, "reduce_bucket_size")
    if overlap_comm:
        config.parallelism.overlap_comm = True
    if offload_optimizer:
        config.parallelism.offload_optimizer = True
    if offload_param:
        config.parallelism.offload_param = True
    if reshard_after_forward is not None:
        config.parallelism.reshard_after_forward = bool(reshard_after_forward)
    if keep_last_block_gathered:
        config.parallelism.keep_last_block_gathered = True
    if fsdp_mixed_precision:
        config.parallelism.fsdp_mixed_precision = True
    if fsdp_cpu_offload:
        config.parallelism.fsdp_cpu_offload = True
    if pipeline is not None:
        _assign(config.parallelism, "pipeline", pipeline, "pipeline")
    if pipeline_schedule is not None:
        config.parallelism.pipeline_schedule = _word("pipeline_schedule", pipeline_schedule,
                                                     PIPELINE_SCHEDULES)
    if pipeline_keep_outputs:
        config.parallelism.pipeline_keep_outputs = True
    if tensor_parallel is not None:
        _assign(config.parallelism, "tensor", tensor_parallel, "tensor_parallel")
    if sequence_parallel:
        config.parallelism.sequence_parallel = True
    if tensor_layers is not None:
        config.parallelism.tensor_layers = _word("tensor_layers", tensor_layers, TENSOR_LAYERS)
    if pipeline_virtual_stages is not None:
        _assign(config.parallelism, "pipeline_virtual_stages", pipeline_virtual_stages,
                "pipeline_virtual_stages")
    if context_parallel is not None:
        _assign(config.parallelism, "context", context_parallel, "context_parallel")
    if expert_parallel is not None:
        _assign(config.parallelism, "expert", expert_parallel, "expert_parallel")
    if gpus_per_node is not None:
        _assign(config.parallelism, "gpus_per_node", gpus_per_node, "gpus_per_node")
    if data_shard is not None:
        _assign(config.parallelism, "data_shard", data_shard, "data_shard")
    for name, value in (("stage3_prefetch_bucket_size", stage3_prefetch_bucket_size),
                        ("stage3_max_live_parameters", stage3_max_live_parameters),
                        ("stage3_max_reuse_distance", stage3_max_reuse_distance),
                        ("stage3_param_persistence_threshold", stage3_param_persistence_threshold)):
        if value is not None:
            _assign(config.parallelism, name, value, name)
    for module, style in (tensor_plan or {}).items():
        entry = config.parallelism.tensor_plan.add()
        _assign(entry, "module", module, "tensor_plan")
        entry.style = _word("tensor_plan[%r]" % module, style, TENSOR_STYLES)
    if lora is not None:
        apply_lora(config, lora)
    if quantization is not None:
        apply_quantization(config, quantization)
    if fp8 is not None:
        _apply_fp8(config, fp8)
    request.skip_advice = not advice
    if layer_rows is not None:
        request.max_layer_rows = layer_rows
    return request
