"""Writes the op graphs docs/published.md estimates: Hugging Face models traced with memest.trace
as the published benchmarks ran them. Run it with the CI environment's Python (build/pyenv:
Debian's PyTorch 1.13 and transformers 4.47.1, see scripts/test.sh):

    build/pyenv/bin/python docs/published/trace_hf.py            # all of them
    build/pyenv/bin/python docs/published/trace_hf.py bert-mlm   # one family

The benchmarks (transformers' model docs, "Using Scaled Dot Product Attention"; the script is
fxmarty's benchmark_sdpa_training gist with AutoModelForMaskedLM) load the model with
torch_dtype=torch.float16 and run, per step: model.zero_grad(); outputs = model(**inputs);
loss = outputs.logits.sum(); loss.backward() (no optimizer), inputs being input_ids only. So
the model is built from its config in float16 and traced with loss="sum", at batch 2 (the
engine rescales the batch: tracedBatch), one graph per sequence length and attention.

Three stand-ins, because the tracer runs on PyTorch 1.13 and the benchmarks on PyTorch 2.x:
- F.scaled_dot_product_attention does not exist in 1.13: a math stand-in gives the meta device
  its output shape, and memest.trace records the call as one scaled_dot_product_attention op
  (memest/_trace_fused.py), which the engine runs as the kernel PyTorch 2.x picks on the device.
- transformers refuses attn_implementation="sdpa" below torch 2.1.1: the check is skipped, so
  the model is built with the SDPA attention classes a PyTorch 2.x user gets.
- Python-side checks that read the inputs' values: the pad-token warning (a [B, 2] bool that dies
  at once) is skipped, and _prepare_4d_attention_mask_for_sdpa returns None, which is what it
  returns for the benchmark's all-ones mask (the meta device has no values to compare).
BERT's graph is traced with an all-ones attention_mask and zero token_type_ids passed in (the
benchmark lets the model make them: [B, T] int64 each, at most 128 KiB at B=16, T=512) so that
its shapes scale with the batch; DistilBERT takes input_ids only, as the benchmark calls it.

Each graph is written without the activations' declarations (optional checks of the shapes; the
estimate is the same without them) and without indentation, to keep the files small.
"""
import json
import math
import pathlib
import sys

import torch
import torch.nn.functional as F
import transformers.modeling_utils as modeling_utils
import transformers.models.bert.modeling_bert as modeling_bert
import transformers.models.distilbert.modeling_distilbert as modeling_distilbert
from transformers import BertConfig, BertForMaskedLM, DistilBertConfig, DistilBertForMaskedLM

import memest

OUT = pathlib.Path(__file__).resolve().parent
BATCH = 2  # traced batch; the estimate's --batch rescales it


def _math_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False):
    return (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).softmax(-1) @ v


def _enable_sdpa(cls, config, hard_check_only=False):
    config._attn_implementation = "sdpa"
    return config


def _install_stand_ins():
    if not hasattr(F, "scaled_dot_product_attention"):
        F.scaled_dot_product_attention = _math_sdpa
    modeling_utils.PreTrainedModel._check_and_enable_sdpa = classmethod(_enable_sdpa)
    no_mask = lambda mask, dtype, tgt_len=None: None
    modeling_bert._prepare_4d_attention_mask_for_sdpa = no_mask
    modeling_distilbert._prepare_4d_attention_mask_for_sdpa = no_mask
    skip = lambda *args, **kwargs: None
    modeling_bert.BertModel.warn_if_padding_and_no_attention_mask = skip
    modeling_distilbert.DistilBertModel.warn_if_padding_and_no_attention_mask = skip


def _bert(attention, seq):
    """BertForMaskedLM with bert-base-uncased's config (BertConfig's defaults)."""
    config = BertConfig()
    config._attn_implementation = attention
    model = BertForMaskedLM(config).half()
    ids = torch.randint(0, config.vocab_size - 1, (BATCH, seq))
    mask = torch.ones(BATCH, seq, dtype=torch.int64)
    types = torch.zeros(BATCH, seq, dtype=torch.int64)
    return model, (ids, mask, types)


def _distilbert(attention, seq):
    """DistilBertForMaskedLM with distilbert-base-uncased's config (DistilBertConfig's defaults)."""
    config = DistilBertConfig()
    config._attn_implementation = attention
    model = DistilBertForMaskedLM(config).half()
    return model, (torch.randint(0, config.vocab_size - 1, (BATCH, seq)),)


FAMILIES = {
    "bert-mlm": (_bert, (256, 512)),
    "distilbert-mlm": (_distilbert, (128, 256)),
}


def _slim(traced):
    graph = dict(traced["ops"])
    graph["tensors"] = [t for t in graph["tensors"] if t["role"] != "TENSOR_ROLE_ACTIVATION"]
    return {"ops": graph}


def main(names):
    _install_stand_ins()
    for name in names or FAMILIES:
        build, seqs = FAMILIES[name]
        for attention in ("eager", "sdpa"):
            for seq in seqs:
                torch.manual_seed(0)
                model, inputs = build(attention, seq)
                traced = memest.trace(model, inputs, loss="sum")
                if traced["ops"].get("tracedBatch") != BATCH:
                    raise SystemExit(f"{name} {attention} {seq}: not rescalable: {traced.notes}")
                path = OUT / f"{name}-{attention}-t{seq}.json"
                path.write_text(json.dumps(_slim(traced), separators=(",", ":")) + "\n")
                print(f"{path.relative_to(OUT.parent.parent)}: {len(traced['ops']['ops'])} ops")


if __name__ == "__main__":
    main(sys.argv[1:])
