#!/usr/bin/env python3
"""Records real models' training and inference steps on a CUDA GPU, for memest to be checked against.

For each case below (a torchvision, Hugging Face or torch.nn model at a size people run), in a
process of its own:

  1. memest.trace of the model (meta tensors, the same batch): DIR/NAME.trace.json, the model
     `memest estimate --model` reads;
  2. the step on the GPU: the cuBLAS workspaces first (training: a matmul forward and backward;
     inference: one forward matmul), the model and its optimizer, one warm-up step, then one
     measured steady-state step; for each phase
     (data, forward, loss, backward, optimizer step; data and forward for inference) the bytes
     allocated when it starts and torch.cuda.max_memory_allocated() / max_memory_reserved() over
     it (the peak statistics reset at each phase's start): DIR/NAME.json;
  3. the caching allocator's own record of both steps (torch.cuda.memory._snapshot() with
     the allocation history): DIR/NAME.snapshot.pickle.

The step is memest's step model with `--no-hold-outputs`: the inputs and the target are made on
the GPU in the data phase (one allocation each) and dropped after backward; the model's output
is dropped once the loss exists; optimizer.step(), then zero_grad(set_to_none=True). bf16 is
torch.autocast with float32 parameters. Environment that changes allocation
(PYTORCH_CUDA_ALLOC_CONF, CUBLAS_WORKSPACE_CONFIG) is unset for the case's process.

    python3 tests/validation/cuda_record.py --out DIR [--only NAME ...] [--dry-run | --trace-only]
        [--no-trace]

--dry-run runs the cases on the CPU without the GPU readings, --trace-only only traces them (to
check the script and the traces where no GPU is). The comparison with memest's estimates is tests/validation/cuda_compare.py.
Needs torch (2.x for SDPA), torchvision and transformers; memest's Python package is imported
from client/python without its gRPC parts.
"""
import argparse
import contextlib
import json
import os
import pickle
import subprocess
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from three_way import ALLOCATOR_ENV  # noqa: E402  (environment that changes what is allocated)


def import_tracer():
    """memest.tracer without memest/__init__ (which imports the gRPC client)."""
    pkg = types.ModuleType("memest")
    pkg.__path__ = [os.path.join(REPO, "client", "python", "memest")]
    sys.modules.setdefault("memest", pkg)
    import memest.tracer as tracer  # noqa: E402
    return tracer


# ---- the cases -------------------------------------------------------------------------------

def _images(b, size=224):
    import torch
    g = torch.Generator().manual_seed(0)
    return (torch.randn(b, 3, size, size, generator=g),), torch.randint(0, 1000, (b,), generator=g)


def _tokens(b, seq, vocab):
    import torch
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, vocab, (b, seq), generator=g),), torch.randint(0, vocab, (b, seq), generator=g)


def _torchvision(name, b, size=224):
    def make():
        import torchvision
        return getattr(torchvision.models, name)(weights=None)
    return make, lambda: _images(b, size)


def _hf(cls_name, cfg_name, attn, b, seq, **cfg):
    def make():
        import transformers
        config = getattr(transformers, cfg_name)(**cfg)
        config._attn_implementation = attn
        model = getattr(transformers, cls_name)(config)
        model.config.use_cache = False
        return model
    return make, lambda: _tokens(b, seq, cfg["vocab_size"])


def _hf_checkpointed(*args, **cfg):
    """_hf's model with Hugging Face's gradient checkpointing on (every decoder layer)."""
    make, data = _hf(*args, **cfg)

    def make_checkpointed():
        model = make()
        model.gradient_checkpointing_enable()
        return model
    return make_checkpointed, data


def _hf_lora(*args, **cfg):
    """_hf's model with PEFT's LoRA on q_proj and v_proj (r 16, alpha 32, dropout 0.05)."""
    make, data = _hf(*args, **cfg)

    def make_lora():
        import peft
        config = peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05,
                                 target_modules=["q_proj", "v_proj"])
        return peft.get_peft_model(make(), config)
    return make_lora, data


def _encoder(b, seq, d=512, heads=8, layers=6):
    def make():
        import torch.nn as nn
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, batch_first=True)
        return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def data():
        import torch
        g = torch.Generator().manual_seed(0)
        x = torch.randn(b, seq, d, generator=g)
        return (x,), torch.randn(b, seq, d, generator=g)
    return make, data


def _lstm_lm(b, seq, vocab=10000, hidden=1024):
    def make():
        import torch.nn as nn

        class LstmLm(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(vocab, hidden)
                self.rnn = nn.LSTM(hidden, hidden, num_layers=2, batch_first=True)
                self.head = nn.Linear(hidden, vocab)

            def forward(self, ids):
                out, _ = self.rnn(self.embed(ids))
                return self.head(out)
        return LstmLm()
    return make, lambda: _tokens(b, seq, vocab)


BERT = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
            intermediate_size=3072)
GPT2 = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)
LLAMA = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
             num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=2048)

# name -> (make, data, loss, optimizer, precision, modes)
CASES = {
    "resnet50": (*_torchvision("resnet50", 32), "cross_entropy", "momentum", "fp32", ("training", "inference")),
    "resnet50-bf16": (*_torchvision("resnet50", 32), "cross_entropy", "momentum", "bf16", ("training",)),
    "mobilenet_v3_large": (*_torchvision("mobilenet_v3_large", 32), "cross_entropy", "momentum", "fp32", ("training",)),
    "vit_b_16": (*_torchvision("vit_b_16", 16), "cross_entropy", "adamw", "fp32", ("training", "inference")),
    "bert-base-sdpa": (*_hf("BertForMaskedLM", "BertConfig", "sdpa", 8, 512, **BERT), "cross_entropy", "adamw", "fp32", ("training", "inference")),
    "bert-base-eager": (*_hf("BertForMaskedLM", "BertConfig", "eager", 8, 512, **BERT), "cross_entropy", "adamw", "fp32", ("training",)),
    "gpt2-sdpa-bf16": (*_hf("GPT2LMHeadModel", "GPT2Config", "sdpa", 4, 1024, **GPT2), "cross_entropy", "adamw", "bf16", ("training",)),
    "llama-sdpa-bf16": (*_hf("LlamaForCausalLM", "LlamaConfig", "sdpa", 4, 1024, **LLAMA), "cross_entropy", "adamw", "bf16", ("training",)),
    "llama-gqa-checkpointed-bf16": (*_hf_checkpointed("LlamaForCausalLM", "LlamaConfig", "sdpa", 8, 1024, **dict(LLAMA, num_key_value_heads=4)), "cross_entropy", "adamw", "bf16", ("training",)),
    "llama-lora-bf16": (*_hf_lora("LlamaForCausalLM", "LlamaConfig", "sdpa", 4, 1024, **LLAMA), "cross_entropy", "adamw", "bf16", ("training",)),
    "bert-base-sdpa-bf16": (*_hf("BertForMaskedLM", "BertConfig", "sdpa", 8, 512, **BERT), "cross_entropy", "adamw", "bf16", ("training",)),
    "transformer_encoder": (*_encoder(32, 256), "mse", "adamw", "fp32", ("training", "inference")),
    "lstm_lm": (*_lstm_lm(32, 128), "cross_entropy", "adamw", "fp32", ("training", "inference")),
}


# ---- one case ----------------------------------------------------------------------------------

def apply_loss(F, out, loss, target):
    if not hasattr(out, "dim"):
        out = out.logits if hasattr(out, "logits") else out[0]
    if loss == "cross_entropy":
        if out.dim() > 2:
            return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))
        return F.cross_entropy(out, target)
    return F.mse_loss(out, target)


def make_optimizer(torch, kind, params):
    if kind == "momentum":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=0, foreach=True)
    return torch.optim.AdamW(params, lr=1e-4, weight_decay=0, foreach=True)


class Phases:
    """Per phase: allocated at its start, and the peaks over it."""

    def __init__(self, torch, device):
        self.torch, self.device, self.rows = torch, device, []

    @contextlib.contextmanager
    def phase(self, name):
        cuda = self.device.type == "cuda"
        if cuda:
            self.torch.cuda.synchronize()
            start = self.torch.cuda.memory_allocated()
            self.torch.cuda.reset_peak_memory_stats()
        yield
        if cuda:
            self.torch.cuda.synchronize()
            self.rows.append({"phase": name, "allocated_at_start": start,
                              "peak_allocated": self.torch.cuda.max_memory_allocated(),
                              "peak_reserved": self.torch.cuda.max_memory_reserved(),
                              "allocated_at_end": self.torch.cuda.memory_allocated()})
        else:
            self.rows.append({"phase": name})


def run_case(name, mode, out_dir, dry_run, trace_only=False, no_trace=False):
    import torch
    import torch.nn.functional as F
    make, data, loss, opt_kind, precision, _ = CASES[name]
    tag = f"{name}.{mode}"
    record = {"case": name, "mode": mode, "loss": loss, "optimizer": opt_kind,
              "precision": precision, "torch": torch.__version__}
    device = torch.device("cpu") if dry_run else torch.device("cuda", 0)
    training = mode == "training"
    torch.manual_seed(0)
    if device.type == "cuda":
        free0, total = torch.cuda.mem_get_info()
        record.update(device_name=torch.cuda.get_device_name(), cuda=torch.version.cuda,
                      cudnn=torch.backends.cudnn.version(), total_memory=total,
                      free_after_init=free0)
        # Python stacks of each allocation (no C++ frames: symbolizing them takes minutes).
        torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                                 max_entries=500000)
        # The cuBLAS workspaces the step itself would create: training's forward and backward
        # threads each get one (a matmul forward and backward); inference runs on one thread, so
        # one forward matmul under no_grad (a backward here would add a second workspace that
        # real inference never makes).
        a = torch.randn(256, 256, device=device, requires_grad=training)
        if training:
            (a @ a).sum().backward()
        else:
            with torch.no_grad():
                a @ a
        del a
        torch.cuda.synchronize()
        record["cublas_warmup_bytes"] = torch.cuda.memory_allocated()
        free1, _ = torch.cuda.mem_get_info()
        record["free_after_cublas"] = free1

    model = make()
    model.train(training)
    inputs, target = data()
    batch = inputs[0].shape[0]
    record["batch"] = batch
    record["parameters"] = sum(p.numel() for p in model.parameters())
    t0 = time.time()
    try:
        if no_trace:
            raise RuntimeError("not traced here (--no-trace)")
        tracer = import_tracer()
        traced = tracer.trace(model, inputs, target=target if training else None,
                              loss=loss if training else None, training=training)
        tracer.save(traced, os.path.join(out_dir, tag + ".trace.json"))
        record["trace"] = {"path": traced.path, "notes": list(traced.notes)}
    except Exception as e:  # recorded; the measurement goes on
        record["trace_error"] = f"{type(e).__name__}: {e}"[:2000]
    record["trace_seconds"] = round(time.time() - t0, 2)
    if trace_only:
        with open(os.path.join(out_dir, tag + ".json"), "w") as f:
            json.dump(record, f, indent=1)
        return record

    model.to(device)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16"
                else contextlib.nullcontext())
    opt = make_optimizer(torch, opt_kind, [p for p in model.parameters() if p.requires_grad]) if training else None
    steps = []
    for step in ("warm-up", "measured"):
        p = Phases(torch, device)
        if training:
            with p.phase("DATA"):
                x = [t.to(device) for t in inputs]
                tgt = target.to(device)
            with p.phase("FORWARD"), autocast:
                out = model(*x)
            with p.phase("LOSS"), autocast:
                lv = apply_loss(F, out, loss, tgt)
                del out
            with p.phase("BACKWARD"):
                lv.backward()
                del x, tgt, lv
            with p.phase("OPTIMIZER_STEP"):
                opt.step()
                opt.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                with p.phase("DATA"):
                    x = [t.to(device) for t in inputs]
                with p.phase("FORWARD"), autocast:
                    out = model(*x)
                del x, out
        steps.append({"step": step, "phases": p.rows})
    record["steps"] = steps
    if device.type == "cuda":
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        with open(os.path.join(out_dir, tag + ".snapshot.pickle"), "wb") as f:
            pickle.dump(snapshot, f)
    with open(os.path.join(out_dir, tag + ".json"), "w") as f:
        json.dump(record, f, indent=1)
    return record


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--trace-only", action="store_true")
    parser.add_argument("--no-trace", action="store_true",
                        help="measure only (the traces made elsewhere, with the same torch and transformers)")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=int, default=300,
                        help="seconds per case and mode (a trace on real tensors takes minutes)")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.case:
        run_case(args.case, args.mode, args.out, args.dry_run or args.trace_only, args.trace_only,
                 args.no_trace)
        return 0
    names = args.only or list(CASES)
    env = {k: v for k, v in os.environ.items() if k not in ALLOCATOR_ENV}
    failed = 0
    for name in names:
        for mode in CASES[name][5]:
            t0 = time.time()
            cmd = [sys.executable, os.path.abspath(__file__), "--out", args.out, "--case", name,
                   "--mode", mode] + (["--dry-run"] if args.dry_run else []) + (
                       ["--trace-only"] if args.trace_only else []) + (
                       ["--no-trace"] if args.no_trace else [])
            try:
                proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, timeout=args.timeout)
                ok, text = proc.returncode == 0, proc.stdout
            except subprocess.TimeoutExpired as e:
                ok, text = False, f"timed out after {args.timeout} s\n{e.stdout or ''}"
            if not ok:
                failed += 1
                with open(os.path.join(args.out, f"{name}.{mode}.error.txt"), "w") as f:
                    f.write(text)
            else:
                with open(os.path.join(args.out, f"{name}.{mode}.json")) as f:
                    rec = json.load(f)
                text = rec.get("trace_error", "traced")
            print(f"{'ok' if ok else 'FAILED':7} {name} [{mode}] {time.time() - t0:.1f} s: "
                  f"{text.strip().splitlines()[-1][:300] if text.strip() else ''}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
