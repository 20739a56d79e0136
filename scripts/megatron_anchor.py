#!/usr/bin/env python3
"""memest's per-rank activations and model states beside Megatron's published formulas.

Prints the tables of docs/megatron-anchor.md: one transformer layer's saved-for-backward bytes
(memest's savedForBackwardBytes with L+1 layers minus with L) beside Korthikanti et al. 2022's
Table 2 (arXiv 2205.05198), and one rank's model states beside Megatron-LM's
compute_weight_and_optimizer_memory (megatron/training/theoretical_memory_usage.py, d98e8a64).

Section 7's rows: a mixture-of-experts model (tests/data/hf_configs/mixtral-8x7b.json) under
expert parallelism, one rank's model states beside the same function's expert terms.

Two models: `megatron`, a GPT as Megatron-LM writes it ([s, b, h], fused QKV, scaled
softmax, plain GELU, dropout masks, tied vocabulary-parallel embedding), written here as a memest
op-graph model file; and memest's `gpt2` preset (Hugging Face GPT2LMHeadModel).

Usage: python3 scripts/megatron_anchor.py [--memest build/bin/memest] [--out DIR]
                                          [--megatron .../theoretical_memory_usage.py]
Exits 1 when a layer's difference from Table 2 is not the known terms (known_difference).
"""
import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile

SHAPES = {"A": dict(s=2048, b=4, h=6144, a=64, v=51200),  # GPT-3-like, h/a = 96
          "B": dict(s=1024, b=8, h=1024, a=16, v=51200)}  # GPT-2 medium's layer
CASES = [(1, False), (2, False), (2, True), (4, False), (4, True), (8, False), (8, True)]
PLAN = ["wte=rowwise", "qkv=colwise", "proj=rowwise", "fc1=colwise", "fc2=rowwise"]
MODEL_DIR = None  # where the `megatron` model files are written (main sets it)
# Mixtral-8x7B (tests/data/hf_configs/mixtral-8x7b.json): GQA, SwiGLU experts, RMSNorm, untied.
MIXTRAL = dict(h=4096, a=32, g=8, ffn=14336, E=8, k=2, L=32, v=32000)


def attr(v):
    if isinstance(v, list):
        return {"ints": {"values": v}}
    return {"i": v} if isinstance(v, int) else {"f": v}


def megatron_gpt(s, b, h, a, v, layers, groups=None, ffn=None, tied=True, fused=False):
    """Megatron-LM's GPTModel (local layers, learned positions), op by op: by default the tied
    output and the eager attention (scaled softmax, its dropout mask). `groups`: GQA's query
    groups (the fused QKV [s, b, g, (a/g + 2) hd]); `ffn`: the MLP's width (4h); tied False: an
    `output.weight` of its own; fused: the attention one SDPA op (TransformerEngine's or
    PyTorch's fused kernel, causal, its dropout inside)."""
    hd = h // a
    g = groups or a
    ffn = ffn or 4 * h
    tensors, ops = [], []

    def leaf(name, shape, role="TENSOR_ROLE_PARAMETER", dtype="bfloat16", **kw):
        tensors.append(dict(name=name, shape=shape, dtype=dtype, role=role, **kw))
        return name

    def op(kind, inputs, scope="", n_out=1, **attrs):
        out = [f"{kind}_{len(ops)}" + (f".{i}" if n_out > 1 else "") for i in range(n_out)]
        ops.append(dict(kind=kind, inputs=inputs, outputs=out, scope=scope,
                        attrs={k: attr(x) for k, x in attrs.items()}))
        return out if n_out > 1 else out[0]

    ids = leaf("ids", [b, s], "TENSOR_ROLE_INPUT", "int64", batchDim=0)
    wte = leaf("wte", [v, h])
    x = op("embedding", [wte, ids], "embedding")
    pos = op("embedding", [leaf("wpe", [s, h]), op("arange", [], "embedding", end=s)], "embedding")
    x = op("contiguous", [op("transpose", [op("add", [x, pos], "embedding")], "embedding",
                             dim0=0, dim1=1)], "embedding")
    x = op("dropout", [x], "embedding", p=0.1)
    for i in range(layers):
        sc = f"h.{i}"
        p = lambda n, shape: leaf(f"{sc}.{n}", shape)
        ln = op("layer_norm", [x, p("ln1.weight", [h]), p("ln1.bias", [h])], sc)
        qkv_out = (a + 2 * g) * hd
        qkv = op("linear", [ln, p("attn.qkv.weight", [qkv_out, h]), p("attn.qkv.bias", [qkv_out])], sc)
        q, k, val = op("split", [op("view", [qkv], sc, shape=[s, b, g, (a // g + 2) * hd])], sc, 3,
                       dim=3, sizes=[a // g * hd, hd, hd])
        core = sc + ".attn.core"
        if fused:
            q = op("reshape", [op("contiguous", [q], core)], core, shape=[s, b, a, hd])
            k, val = op("contiguous", [k], core), op("contiguous", [val], core)
            ctx = op("scaled_dot_product_attention",
                     [op("permute", [t], core, dims=[1, 2, 0, 3]) for t in (q, k, val)], core,
                     fused=1, is_causal=1, dropout_p=0.1)
        else:
            scores = op("matmul", [op("permute", [q], core, dims=[1, 2, 0, 3]),
                                   op("permute", [k], core, dims=[1, 2, 3, 0])], core)
            probs = op("softmax", [op("div", [scores], core, scalar=float(hd) ** 0.5)], core, dim=-1)
            probs = op("dropout", [probs], core, p=0.1)
            ctx = op("matmul", [probs, op("permute", [val], core, dims=[1, 2, 0, 3])], core)
        ctx = op("reshape", [op("permute", [ctx], core, dims=[2, 0, 1, 3])], core, shape=[s, b, h])
        y = op("linear", [ctx, p("attn.proj.weight", [h, h]), p("attn.proj.bias", [h])], sc)
        x = op("add", [x, op("dropout", [y], sc, p=0.1)], sc)
        ln = op("layer_norm", [x, p("ln2.weight", [h]), p("ln2.bias", [h])], sc)
        y = op("linear", [ln, p("mlp.fc1.weight", [ffn, h]), p("mlp.fc1.bias", [ffn])], sc)
        y = op("linear", [op("gelu", [y], sc), p("mlp.fc2.weight", [h, ffn]),
                          p("mlp.fc2.bias", [h])], sc)
        x = op("add", [x, op("dropout", [y], sc, p=0.1)], sc)
    x = op("layer_norm", [x, leaf("ln_f.weight", [h]), leaf("ln_f.bias", [h])], "ln_f")
    head = wte if tied else leaf("output.weight", [v, h])
    logits = op("view", [op("linear", [x, head], "output")], "loss", shape=[s * b, v])
    labels = leaf("labels", [s, b], "TENSOR_ROLE_TARGET", "int64", batchDim=1)
    loss = op("cross_entropy", [logits, op("view", [labels], "loss", shape=[s * b])], "loss")
    return {"ops": {"tensors": tensors, "ops": ops, "tracedBatch": b, "loss": loss,
                    "blocks": [f"h.{i}" for i in range(layers)]}}


def memest(exe, model, shape, layers, t, sp, extra=()):
    cmd = [exe, "estimate", "--local", "--json", "--no-advice", "--precision", "bf16-pure",
           "--attention", "eager", "--batch", str(shape["b"]), *extra]
    if model == "gpt2":
        cmd += ["--preset", "gpt2-small", "--seq", str(shape["s"]), f"--param=layers={layers}"]
        cmd += [f"--param={k}={shape[m]}" for k, m in (("d_model", "h"), ("heads", "a"),
                                                       ("vocab", "v"))]
    else:
        cmd += ["--model", model_file(shape, layers)]
    if t > 1:
        cmd += ["--tensor-parallel", str(t)] + (["--sequence-parallel"] if sp else [])
        cmd += [f"--tensor-plan={e}" for e in PLAN] if model != "gpt2" else []
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def name(model):
    return "gpt2 preset" if model == "gpt2" else "Megatron-form GPT"


def model_file(shape, layers):
    path = os.path.join(MODEL_DIR, "megatron-{s}-{b}-{h}-{a}-{v}-L{L}.json".format(L=layers,
                                                                                   **shape))
    if not os.path.exists(path):
        with open(path, "w") as f:
            json.dump(megatron_gpt(layers=layers, **shape), f)
    return path


def table2(s, b, h, a, t, sp, selective, **_):
    """Korthikanti et al. 2022, Table 2: bytes per transformer layer."""
    scores = 0 if selective else 5 * a * s / (h * t)
    return s * b * h * ((34 / t if sp else 10 + 24 / t) + scores)


def known_difference(model, s, b, h, t, sp, **_):
    """What memest counts beyond Table 2: the two LayerNorms' float32 mean and rstd (16 B a
    token, the sequence split under SP) and, for HF GPT-2's gelu_new, the tanh output, 0.5*x and
    1 + tanh, each [s, b, 4h/t] in 16 bits."""
    stats = 16 * s * b // (t if sp else 1)
    return stats + (24 * s * b * h // t if model == "gpt2" else 0)


def layer_rows(exe, model, label):
    print(f"\n{name(model)}, shape {label}: one layer's saved bytes on one rank\n")
    print("| t | SP | checkpoint | Table 2 | memest | memest - Table 2 | known terms | "
          "unexplained |")
    print("|---|---|---|---|---|---|---|---|")
    shape, unexplained = SHAPES[label], 0
    for selective in (False, True):
        extra = ["--checkpoint", "attention"] if selective else []
        for t, sp in CASES:
            one, two = (memest(exe, model, shape, n, t, sp, extra)["savedForBackwardBytes"]
                        for n in (1, 2))
            got = int(two) - int(one)
            want = round(table2(t=t, sp=sp, selective=selective, **shape))
            known = known_difference(model, t=t, sp=sp, **shape)
            print(f"| {t} | {'yes' if sp else 'no'} | {'attention' if selective else 'none'} | "
                  f"{want:,} | {got:,} | {got - want:+,} | {known:+,} | {got - want - known:+,} |")
            unexplained += got - want != known
    return unexplained


def weight_and_optimizer(s, h, v, L, t, d, distopt, **_):
    """compute_weight_and_optimizer_memory for a dense GPT (LayerNorm, MHA, ffn 4h, tied, p 1)."""
    sharded = (L * (4 * h * h + 8 * h * h) + v * h) / t
    replicated = L * 2 * h * 2 + 2 * h
    return (sharded + replicated) * (6 + 12 / d if distopt else 18)


def activation_memory(s, b, h, v, L, t, sp, selective, **_):
    """report_theoretical_memory's activation term for p = 1 (compute_activation_memory when SP
    and selective recomputation, else compute_activation_memory_without_sp)."""
    if sp and selective:
        return (s * b * h * 34 * L + 8 * s * b + s * b * h + s * b * h * 4 * (1 + v / h)) / t
    layers = s * b * h * (10 + 24 / t) * L
    return (layers + 8 * s * b + s * b * h + (s * b * v / t + s * b * h) * 2) * 1.05


def model_rows(exe, model, label, layers=2, t=8):
    shape = SHAPES[label]
    print(f"\n{name(model)}, shape {label}, L={layers}, t={t}: the whole model's saved bytes on "
          "one rank\n")
    print("| SP | checkpoint | theoretical_memory_usage.py | memest | difference |")
    print("|---|---|---|---|---|")
    for sp in (True, False):
        for selective in (True, False):
            r = memest(exe, model, shape, layers, t, sp,
                       ["--checkpoint", "attention" if selective else "none"])
            got = int(r["savedForBackwardBytes"])
            want = round(activation_memory(L=layers, t=t, sp=sp, selective=selective, **shape))
            print(f"| {'yes' if sp else 'no'} | {'attention' if selective else 'none'} | "
                  f"{want:,} | {got:,} | {got - want:+,} |")


def state_rows(exe, model, label, layers=2, t=8, d=8):
    shape = SHAPES[label]
    print(f"\n{name(model)}, shape {label}, L={layers}, t={t}, SP: one rank's model states at the "
          "step's end\n")
    print("| strategy | theoretical_memory_usage.py | memest | difference |")
    print("|---|---|---|---|")
    for strategy, dp in (("megatron-ddp", 1), ("megatron-distopt", d)):
        r = memest(exe, model, shape, layers, t, True, ["--optimizer", "adam", "--data-parallel",
                                                       str(dp), "--dp-strategy", strategy])
        e = r["endOfStep"]
        got = sum(int(e[k]) for k in ("parameters", "gradients", "masterAndCasts",
                                       "optimizerState"))
        want = round(weight_and_optimizer(L=layers, t=t, d=dp, distopt=strategy.endswith("distopt"),
                                          **shape))
        print(f"| {strategy} (d={dp}) | {want:,} | {got:,} | {got - want:+,} |")


def moe_weight_and_optimizer(h, a, g, ffn, E, L, v, ep, d, **_):
    """compute_weight_and_optimizer_memory for MIXTRAL-like models: t = p = 1, the distributed
    optimizer; the routed experts split over ep ranks and sharded over d / ep."""
    per_parameter = lambda dp: 6 + 12 / dp
    attention = 2 * h * h * (1 + g / a)
    sharded = L * attention + 2 * h * v       # t = 1: attention, the untied embeddings
    replicated = L * (2 * h + h * E) + h      # the two RMSNorms and the router; the final norm
    experts = L * 2 * h * ffn * E * 3 / 2
    return (sharded + replicated) * per_parameter(d) + experts / ep * per_parameter(d // ep)


def moe_state_rows(exe, d=8):
    config = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data",
                          "hf_configs", "mixtral-8x7b.json")
    print(f"\nMixtral-8x7B, megatron-distopt over d={d}, Adam: one rank's model states at the "
          "step's end\n")
    print("| expert ranks | theoretical_memory_usage.py | memest | difference |")
    print("|---|---|---|---|")
    for ep in (1, 2, 4, 8):
        cmd = [exe, "estimate", "--local", "--json", "--no-advice", "--hf-config", config,
               "--seq", "128", "--batch", "1", "--precision", "bf16-pure", "--optimizer", "adam",
               "--data-parallel", str(d), "--dp-strategy", "megatron-distopt",
               "--expert-parallel", str(ep)]
        r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        e = r["endOfStep"]
        got = sum(int(e.get(k, 0)) for k in ("parameters", "gradients", "masterAndCasts",
                                              "optimizerState"))
        want = round(moe_weight_and_optimizer(ep=ep, d=d, **MIXTRAL))
        print(f"| {ep} | {want:,} | {got:,} | {got - want:+,} |")


def check_transcription(path, label="A", layers=2, t=8):
    """Runs Megatron's own theoretical_memory_usage.py (its one relative import stubbed) on the
    tables' configurations and checks the transcriptions above against it."""
    src = open(path).read().replace("from .utils import is_hybrid_model, print_rank_0",
                                    "is_hybrid_model = lambda a: False\nprint_rank_0 = print")
    tmu = {}
    exec(compile(src, path, "exec"), tmu)
    sh = SHAPES[label]
    for d, sp, sel in ((1, True, True), (8, True, False), (1, False, True), (1, False, False)):
        a = argparse.Namespace(
            kv_channels=sh["h"] // sh["a"], num_attention_heads=sh["a"], hidden_size=sh["h"],
            group_query_attention=False, num_experts=None, swiglu=False, mtp_num_layers=None,
            moe_shared_expert_intermediate_size=None, moe_latent_size=None, num_layers=layers,
            normalization="LayerNorm", multi_latent_attention=False, padded_vocab_size=sh["v"],
            untie_embeddings_and_output_weights=False, ffn_hidden_size=4 * sh["h"],
            expert_tensor_parallel_size=1, expert_model_parallel_size=1,
            pipeline_model_parallel_size=1, world_size=t * d, tensor_model_parallel_size=t,
            data_parallel_size=d, use_distributed_optimizer=d > 1, seq_length=sh["s"],
            micro_batch_size=sh["b"], virtual_pipeline_model_parallel_size=None,
            sequence_parallel=sp, recompute_granularity="selective" if sel else None)
        with contextlib.redirect_stdout(io.StringIO()):  # its own report lines
            weights, activations, _ = tmu["report_theoretical_memory"](a)
        mib = 1024 * 1024
        assert abs(weights * mib - weight_and_optimizer(L=layers, t=t, d=d, distopt=d > 1,
                                                        **sh)) < 1, (d, sp, sel)
        assert abs(activations * mib - activation_memory(L=layers, t=t, sp=sp, selective=sel,
                                                         **sh)) < 1, (d, sp, sel)
    m = MIXTRAL
    for ep in (1, 8):
        a = argparse.Namespace(
            kv_channels=m["h"] // m["a"], num_attention_heads=m["a"], hidden_size=m["h"],
            group_query_attention=True, num_query_groups=m["g"], num_experts=m["E"],
            swiglu=True, mtp_num_layers=None, moe_shared_expert_intermediate_size=None,
            moe_latent_size=None, moe_layer_freq=1, moe_ffn_hidden_size=m["ffn"],
            moe_router_topk=m["k"], add_bias_linear=False, num_layers=m["L"],
            normalization="RMSNorm", multi_latent_attention=False, padded_vocab_size=m["v"],
            untie_embeddings_and_output_weights=True, ffn_hidden_size=m["ffn"],
            expert_tensor_parallel_size=1, expert_model_parallel_size=ep,
            pipeline_model_parallel_size=1, world_size=8, tensor_model_parallel_size=1,
            data_parallel_size=8, use_distributed_optimizer=True)
        with contextlib.redirect_stdout(io.StringIO()):
            weights = tmu["compute_weight_and_optimizer_memory"](a)
        assert abs(weights - moe_weight_and_optimizer(ep=ep, d=8, **m)) < 1, ep
    print(f"the transcriptions agree with {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memest", default="build/bin/memest")
    ap.add_argument("--out", default=None, help="where the model files go (default: a temp dir)")
    ap.add_argument("--megatron", default=None,
                    help="Megatron-LM's megatron/training/theoretical_memory_usage.py: check the "
                         "transcriptions here against it first")
    args = ap.parse_args()
    if args.megatron:
        check_transcription(args.megatron)
    global MODEL_DIR
    MODEL_DIR = args.out or tempfile.mkdtemp(prefix="megatron-anchor-")
    os.makedirs(MODEL_DIR, exist_ok=True)
    unexplained = 0
    for model in ("megatron", "gpt2"):
        for label in SHAPES:
            unexplained += layer_rows(args.memest, model, label)
        model_rows(args.memest, model, "A")
        state_rows(args.memest, model, "A")
    moe_state_rows(args.memest)
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
