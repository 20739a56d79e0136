#!/usr/bin/env python3
"""Count the parameters of Hugging Face causal LMs (and masked-LM encoders) from their config.json.

Each config is loaded with the real `transformers` library and the model is
built on the meta device (no memory is allocated for weights), then

    parameters   = sum(p.numel() for p in model.parameters())

which counts a tied weight (lm_head == embed_tokens) once, as the hub cards do.

Usage:
    python count_params.py                 # every *.json next to this script
    python count_params.py a.json b.json   # the given files
    python count_params.py --json          # JSON instead of a table

Needs only the standard library, torch and transformers.  With torch >= 2.0 the
model is built under `with torch.device("meta")`; with older torch a small
stand-in for accelerate.init_empty_weights moves each registered parameter to
the meta device.
"""

import argparse
import contextlib
import glob
import json
import os
import shutil
import sys
import tempfile

import torch
import transformers
from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForImageClassification,
                          AutoModelForMaskedLM, AutoModelForSeq2SeqLM)


@contextlib.contextmanager
def _empty_weights_torch1():
    """Like accelerate.init_empty_weights(include_buffers=False) for torch 1.x."""
    old_register = torch.nn.Module.register_parameter

    def register_parameter(module, name, param):
        old_register(module, name, param)
        # An already-meta parameter (e.g. embed_tokens.weight being tied to
        # lm_head) is kept as is, so that the tie survives.
        if param is not None and param.device.type != "meta":
            p = module._parameters[name]
            kwargs = dict(p.__dict__)
            kwargs["requires_grad"] = p.requires_grad
            module._parameters[name] = type(p)(p.to(torch.device("meta")), **kwargs)

    torch.nn.Module.register_parameter = register_parameter
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = old_register


def meta_context():
    if hasattr(torch.device("meta"), "__enter__"):
        return torch.device("meta")
    return _empty_weights_torch1()


def known_model_types():
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    return set(CONFIG_MAPPING_NAMES)


def load_config(path):
    """AutoConfig.from_pretrained on a temp dir holding the file as config.json."""
    tmp = tempfile.mkdtemp(prefix="hfcfg_")
    try:
        shutil.copyfile(path, os.path.join(tmp, "config.json"))
        return AutoConfig.from_pretrained(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def count(path):
    with open(path) as f:
        raw = json.load(f)
    model_type = raw.get("model_type", "?")
    row = {"model_type": model_type, "transformers": transformers.__version__}
    if model_type not in known_model_types():
        row.update(parameters=None, tied=None,
                   error="not in this transformers")
        return row
    try:
        config = load_config(path)
        with meta_context():
            # the encoders are built as their masked LMs (BertForMaskedLM, RobertaForMaskedLM),
            # T5 as T5ForConditionalGeneration
            auto = (AutoModelForMaskedLM if model_type in ("bert", "roberta") else
                    AutoModelForImageClassification if model_type == "vit" else
                    AutoModelForSeq2SeqLM if model_type == "t5" else AutoModelForCausalLM)
            model = auto.from_config(config)
    except Exception as e:  # report, keep going with the other files
        row.update(parameters=None, tied=None,
                   error="%s: %s" % (type(e).__name__, str(e).splitlines()[0][:200]))
        return row

    total = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings()
    out = model.get_output_embeddings()
    tied = bool(out is not None and emb is not None and out.weight is emb.weight)
    # "non-embedding" as on the Qwen cards: total minus the token embedding
    # and, when it is a separate tensor, minus lm_head.
    non_emb = total - emb.weight.numel()
    if out is not None and not tied:
        non_emb -= out.weight.numel()
    row.update(parameters=total, tied=tied, non_embedding=non_emb,
               architecture=type(model).__name__)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help="config.json files (default: *.json here)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)

    files = args.files or sorted(
        glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "*.json")))
    transformers.logging.set_verbosity_error()

    results = {}
    for path in files:
        results[os.path.basename(path)] = count(path)

    if args.json:
        json.dump(results, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
        return 0

    print("transformers %s, torch %s" % (transformers.__version__, torch.__version__))
    hdr = ("file", "model_type", "parameters", "non-embedding", "tied")
    fmt = "%-22s %-10s %15s %15s  %s"
    print(fmt % hdr)
    print("-" * 74)
    for name, r in results.items():
        if r.get("parameters") is None:
            print(fmt % (name, r["model_type"], "-", "-", r["error"]))
        else:
            print(fmt % (name, r["model_type"], format(r["parameters"], ","),
                         format(r["non_embedding"], ","), "yes" if r["tied"] else "no"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
