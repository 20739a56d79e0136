"""config.lora and config.quantization (QLoRA's 4-bit base) from what a PEFT user has.

config.lora from a LoraConfig, its kwargs as a dict, or the
adapter_config.json that save_pretrained writes (a path to it or to the adapter's directory).

The fields read are PEFT's: r, lora_alpha, lora_dropout, target_modules (a list of names, or
"all-linear"), modules_to_save, use_dora (DoRA); and get_peft_model's autocast_adapter_dtype
(True, PEFT's default: a bf16 or fp16 model's adapters are float32). What memest does not model
is refused, naming the field, as `memest estimate --lora-config` refuses it.
"""
import json
import os

from memest.errors import InvalidArgument

_PLAIN_ONLY = ("rank_pattern", "layers_to_transform", "layer_replication", "lora_bias",
               "exclude_modules")


def _lora_dict(lora):
    if isinstance(lora, (str, os.PathLike)):
        path = os.path.join(lora, "adapter_config.json") if os.path.isdir(lora) else lora
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        except OSError as error:
            raise InvalidArgument("lora %s: cannot open the file: %s" % (path, error.strerror)) from None
        except ValueError as error:
            raise InvalidArgument("lora %s: not JSON: %s" % (path, error)) from None
    if isinstance(lora, dict):
        return dict(lora)
    if callable(getattr(lora, "to_dict", None)):  # peft.LoraConfig
        return lora.to_dict()
    raise InvalidArgument("lora: expected a peft LoraConfig, a dict of its fields or a path to "
                          "adapter_config.json, got %s" % type(lora).__name__)


def _names(value, field, prefix="lora"):
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    try:
        names = list(value)
    except TypeError:
        raise InvalidArgument("%s.%s: a list of module names" % (prefix, field)) from None
    for i, name in enumerate(names):
        if not isinstance(name, str):
            raise InvalidArgument("%s.%s[%d]: a module name (a string)" % (prefix, field, i))
    return sorted(names) if isinstance(value, (set, frozenset)) else names


def apply_lora(config, lora):
    """Sets config.lora (a memest.v1.RunConfig's) from `lora` (see the module's docstring)."""
    data = _lora_dict(lora)
    peft_type = data.get("peft_type")
    if peft_type is not None and str(getattr(peft_type, "value", peft_type)) != "LORA":
        raise InvalidArgument("lora.peft_type: %r; memest models LoRA adapters" % (peft_type,))
    for key in _PLAIN_ONLY:
        if data.get(key):
            raise InvalidArgument("lora.%s: set, and memest models plain LoRA (one rank on every "
                                  "target module of every layer)" % key)
    if data.get("bias", "none") != "none":
        raise InvalidArgument("lora.bias: %r trains the base model's biases, which memest does "
                              "not model" % data["bias"])
    rank = data.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool):
        raise InvalidArgument("lora.r: the adapters' rank (an integer) is required")
    targets = data.get("target_modules")
    if isinstance(targets, str):  # a regular expression to PEFT, unless "all-linear" in any case
        if targets.lower() != "all-linear":
            raise InvalidArgument("lora.target_modules: %r is a regular expression to PEFT; "
                                  "memest takes a list of names or \"all-linear\"" % targets)
        targets = "all-linear"
    out = config.lora
    try:
        out.rank = rank
        if data.get("lora_alpha") is not None:
            out.alpha = float(data["lora_alpha"])
        if data.get("lora_dropout") is not None:
            out.dropout = float(data["lora_dropout"])
    except (TypeError, ValueError) as error:
        raise InvalidArgument("lora: %s" % error) from None
    out.target_modules.extend(_names(targets, "target_modules"))
    out.modules_to_save.extend(_names(data.get("modules_to_save"), "modules_to_save"))
    if data.get("autocast_adapter_dtype") is False:
        out.keep_adapter_dtype = True
    out.use_dora = bool(data.get("use_dora"))


_FORMATS = {"nf4": "WEIGHT_FORMAT_BNB_NF4", "fp4": "WEIGHT_FORMAT_BNB_FP4"}


_SERVED = {"w8a8-fp8": "WEIGHT_FORMAT_W8A8_FP8", "fp8": "WEIGHT_FORMAT_W8A8_FP8",
           "w8a8-int8": "WEIGHT_FORMAT_W8A8_INT8", "w4a16": "WEIGHT_FORMAT_W4A16",
           "w8a16": "WEIGHT_FORMAT_W8A16", "torchao-int4": "WEIGHT_FORMAT_TORCHAO_INT4",
           "torchao-int8": "WEIGHT_FORMAT_TORCHAO_INT8"}
# transformers' TorchAoConfig(...).to_dict()["quant_type"]["default"]["_type"]
_TORCHAO = {"Int4WeightOnlyConfig": "torchao-int4", "Int8WeightOnlyConfig": "torchao-int8"}
_SCALES = {"channel": "SCALE_GRANULARITY_CHANNEL", "tensor": "SCALE_GRANULARITY_TENSOR",
           "block": "SCALE_GRANULARITY_BLOCK"}
_INPUTS = {"token": "INPUT_QUANTIZATION_DYNAMIC_TOKEN", "tensor": "INPUT_QUANTIZATION_DYNAMIC_TENSOR",
           "static": "INPUT_QUANTIZATION_STATIC"}
_SERVED_KEYS = {"format", "weight_scales", "block", "inputs", "asymmetric_inputs", "group_size",
                "zero_point", "act_order", "gptq", "skip_modules"}


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _word(data, key, words):
    value = data[key]
    if value not in words:
        raise InvalidArgument("quantization.%s: %r; expected one of %s"
                              % (key, value, ", ".join(sorted(words))))
    from memest import v1
    return getattr(v1, words[value])


def _apply_served(out, data):
    """A quantized checkpoint served by vLLM (with serving=...): memest's own names (the CLI's
    --quantize and --quant-* flags). A config.json's quantization_config needs none of this:
    hf_config= reads it."""
    unknown = sorted(set(data) - _SERVED_KEYS)
    if unknown:
        raise InvalidArgument("quantization.%s: not a setting of %s (expected %s)"
                              % (unknown[0], data["format"], ", ".join(sorted(_SERVED_KEYS))))
    out.format = _word(data, "format", _SERVED)
    if data["format"] == "fp8":  # vLLM's --quantization fp8: one scale a weight and an input
        out.weight_scales = _word({"s": "tensor"}, "s", _SCALES)
        out.inputs = _word({"i": "tensor"}, "i", _INPUTS)
    if "weight_scales" in data:
        out.weight_scales = _word(data, "weight_scales", _SCALES)
    if "inputs" in data:
        out.inputs = _word(data, "inputs", _INPUTS)
    if "block" in data:
        block = data["block"]
        if (not isinstance(block, (list, tuple)) or len(block) != 2
                or not all(_is_int(v) for v in block)):
            raise InvalidArgument("quantization.block: [n, k], two integers, got %r" % (block,))
        out.block_n, out.block_k = int(block[0]), int(block[1])
    if "group_size" in data:
        if not _is_int(data["group_size"]):
            raise InvalidArgument("quantization.group_size: an integer (-1: per channel), got %r"
                                  % (data["group_size"],))
        out.group_size = int(data["group_size"])
    for key, field in (("asymmetric_inputs", "asymmetric_inputs"), ("zero_point", "zero_point"),
                       ("act_order", "act_order"), ("gptq", "gptq_layout")):
        value = data.get(key, False)
        if not isinstance(value, bool):
            raise InvalidArgument("quantization.%s: True or False, got %r" % (key, value))
        setattr(out, field, value)
    out.skip_modules.extend(_names(data.get("skip_modules"), "skip_modules", "quantization"))


def _apply_int8(out, data):
    """LLM.int8 (load_in_8bit): llm_int8_threshold, llm_int8_skip_modules, memest's
    int8_outlier_columns and PEFT's prepare_model_for_kbit_training; the 4-bit keys that
    BitsAndBytesConfig.to_dict() writes beside them are not read."""
    from memest import v1
    if data.get("llm_int8_has_fp16_weight"):
        raise InvalidArgument("quantization.llm_int8_has_fp16_weight: 8-bit layers that keep and "
                              "train float16 weights are not modelled")
    out.format = v1.WEIGHT_FORMAT_BNB_INT8
    threshold = data.get("llm_int8_threshold")
    if threshold is not None:
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
            raise InvalidArgument("quantization.llm_int8_threshold: a number, got %r" % (threshold,))
        out.int8_threshold = float(threshold)
    if "int8_outlier_columns" in data:
        if not _is_int(data["int8_outlier_columns"]):
            raise InvalidArgument("quantization.int8_outlier_columns: an integer, got %r"
                                  % (data["int8_outlier_columns"],))
        out.int8_outlier_columns = int(data["int8_outlier_columns"])
    out.skip_modules.extend(_names(data.get("llm_int8_skip_modules"), "llm_int8_skip_modules"))
    if "prepare_model_for_kbit_training" in data:
        out.prepare_model_for_kbit_training = bool(data["prepare_model_for_kbit_training"])


def _torchao(data):
    """A transformers TorchAoConfig's dict as memest's names: its quant_type's one config
    (Int4WeightOnlyConfig's group_size; Int8WeightOnlyConfig per row) and
    modules_to_not_convert."""
    kind = data.get("quant_type")
    if isinstance(kind, dict) and set(kind) == {"default"} and isinstance(kind["default"], dict):
        fields = kind["default"].get("_data") or {}
        kind = kind["default"].get("_type")
    else:
        fields = data.get("quant_type_kwargs") or {}
        kind = {"int4_weight_only": "Int4WeightOnlyConfig",
                "int8_weight_only": "Int8WeightOnlyConfig"}.get(kind, kind)
    if kind not in _TORCHAO:
        raise InvalidArgument("quantization.quant_type: %r; memest models %s"
                              % (kind, ", ".join(sorted(_TORCHAO))))
    # Settings that change the tensors or the kernels, refused unless at their defaults.
    for key, default in (("int4_packing_format", "plain"), ("packing_format", "plain")):
        value = fields.get(key)
        if value is not None and str(value).lower().split(".")[-1] != default:
            raise InvalidArgument("quantization.quant_type.%s: %r; memest models the %s packing"
                                  % (key, value, default))
    granularity = fields.get("granularity")
    if kind == "Int8WeightOnlyConfig" and granularity not in (None, "PerRow", "PerRow()") and not (
            isinstance(granularity, dict) and granularity.get("_type") == "PerRow"):
        raise InvalidArgument("quantization.quant_type.granularity: %r; memest models PerRow"
                              % (granularity,))
    for key in ("include_input_output_embeddings", "untie_embedding_weights"):
        if data.get(key):
            raise InvalidArgument("quantization.%s: True is not modelled (the embeddings stay "
                                  "in the model's dtype)" % key)
    out = {"format": _TORCHAO[kind]}
    if kind == "Int4WeightOnlyConfig" and "group_size" in fields:
        out["group_size"] = fields["group_size"]
    if data.get("modules_to_not_convert"):
        out["skip_modules"] = data["modules_to_not_convert"]
    return out


def apply_quantization(config, quantization):
    """Sets config.quantization from a transformers BitsAndBytesConfig or a dict of its fields
    (load_in_4bit, bnb_4bit_quant_type, bnb_4bit_use_double_quant, bnb_4bit_compute_dtype,
    llm_int8_skip_modules; or load_in_8bit, llm_int8_threshold and memest's
    int8_outlier_columns), plus prepare_model_for_kbit_training (PEFT's; default: in training
    only); or a transformers TorchAoConfig (Int4WeightOnlyConfig, Int8WeightOnlyConfig) or its
    dict; or memest's names, a dict with "format" (torchao-int4, torchao-int8; to serve a
    quantized checkpoint with vLLM w8a8-fp8, fp8, w8a8-int8, w4a16, w8a16) and weight_scales,
    block, inputs, asymmetric_inputs, group_size, zero_point, act_order, gptq, skip_modules."""
    if callable(getattr(quantization, "to_dict", None)):
        data = quantization.to_dict()
    elif isinstance(quantization, dict):
        data = dict(quantization)
    else:
        raise InvalidArgument("quantization: expected a transformers BitsAndBytesConfig or a "
                              "dict of its fields, got %s" % type(quantization).__name__)
    if data.get("quant_method") == "torchao":
        data = _torchao(data)
    if "format" in data:
        _apply_served(config.quantization, data)
        return
    if bool(data.get("load_in_8bit")) == bool(data.get("load_in_4bit")):
        raise InvalidArgument("quantization.load_in_4bit: one of load_in_4bit and load_in_8bit "
                              "must be True")
    from memest import v1
    out = config.quantization
    if data.get("load_in_8bit"):
        _apply_int8(out, data)
        return
    kind = data.get("bnb_4bit_quant_type", "fp4")
    if kind not in _FORMATS:
        raise InvalidArgument("quantization.bnb_4bit_quant_type: %r; expected nf4 or fp4" % (kind,))
    out.format = getattr(v1, _FORMATS[kind])
    out.double_quant = bool(data.get("bnb_4bit_use_double_quant", False))
    dtype = data.get("bnb_4bit_compute_dtype")
    if dtype is not None:
        out.compute_dtype = str(dtype).replace("torch.", "")
    out.skip_modules.extend(_names(data.get("llm_int8_skip_modules"), "llm_int8_skip_modules"))
    if "prepare_model_for_kbit_training" in data:
        out.prepare_model_for_kbit_training = bool(data["prepare_model_for_kbit_training"])
