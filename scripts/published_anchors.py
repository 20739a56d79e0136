#!/usr/bin/env python3
"""memest beside published, measured multi-GPU figures whose configuration it can express.

Megatron-LM's functional tests commit the memory its CI measured per GPU, with the whole
configuration (NVIDIA/Megatron-LM at d98e8a64: tests/functional_tests/test_cases/gpt/<case>/
model_config.yaml and golden_values_dev_dgx_{h100,a100}.json, 1 node x 8 GPUs). Their
`mem-max-allocated-bytes` is torch.cuda.max_memory_allocated() on the last rank (the last
pipeline stage), never reset: step 1 is the first step, later steps the steady state;
`mem-allocated-bytes` is torch.cuda.memory_allocated() after the iteration. Each case's model is
written as a memest op-graph file by scripts/megatron_anchor.py's megatron_gpt (Megatron's local
layers; the tests run TransformerEngine's, which save the same tensors by our reading) and
estimated with the case's settings. docs/published-anchors.md discusses the differences.

Usage: python3 scripts/published_anchors.py [--memest build/bin/memest] [--out DIR] [--check PCT]
--check: exit 1 when a steady-state peak is more than PCT percent from the published one.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megatron_anchor import megatron_gpt  # noqa: E402

# 7B-class GPT of the memory_speed cases: 32 layers, hidden 4096, 32 heads, 8 query groups,
# FFN 16384, learned positions, untied output, sequence 8192, vocabulary 131073 padded to a
# multiple of 128 x tensor ranks; bf16, the distributed optimizer, AdamW (weight decay 0.01),
# no recomputation, no gradient-accumulation fusion, dropout 0.1, fused attention.
GPT7B = dict(s=8192, h=4096, a=32, groups=8, layers=32, tied=False, fused=True)
# Every case's ENV_VARS set CUBLAS_WORKSPACE_CONFIG=:4096:8.
OPTIM = ["--precision", "bf16-pure", "--optimizer", "adamw", "--weight-decay", "0.01",
         "--optimizer-impl", "fused", "--no-hold-outputs", "--cublas-workspace-config=:4096:8"]
PLAN = ["wte=rowwise", "qkv=colwise", "proj=rowwise", "fc1=colwise", "fc2=rowwise",
        "output=colwise"]

# (case, GPU, published: steady max, first-step max, allocated after an iteration)
PUBLISHED = {
    ("gpt3_7b_tp4_pp1_memory_speed", "h100"): (57143791616, 50289487872, 20663519232),
    ("gpt3_7b_tp4_pp1_memory_speed", "a100"): (58188115968, 51333926912, 20634103808),
    ("gpt3_7b_tp1_pp4_memory_speed", "h100"): (60720852992, 52931256320, 24808996864),
    ("gpt3_7b_tp1_pp4_memory_speed", "a100"): (60489064448, 52700401664, 24510808064),
    ("gpt3_mcore_te_tp1_pp1_uniform_full_recompute", "a100"): (2534070272, None, 1232487936),
}


def cases(out):
    """case -> (model file, memest flags). TP4: micro-batch 2, global 8 over 2 data ranks (2
    micro-batches); PP4: 1 layer per virtual stage (8 chunks a stage), micro-batch 1 (4
    micro-batches); the small model: 12 layers, hidden 512, 8 heads, sequence 1024, micro-batch
    4 over 8 data ranks, tied, every layer recomputed, Megatron's DDP."""
    def model(name, **kw):
        path = os.path.join(out, name + ".json")
        with open(path, "w") as f:
            json.dump(megatron_gpt(**kw), f)
        return path
    tp4 = model("gpt7b-tp4", b=2, v=131584, **GPT7B)
    pp4 = model("gpt7b-pp4", b=1, v=131200, **GPT7B)
    small = model("gpt-small", s=1024, b=4, h=512, a=8, v=50304, layers=12)
    return {
        "gpt3_7b_tp4_pp1_memory_speed": [
            "--model", tp4, "--batch", "4", "--grad-accum", "2", *OPTIM,
            "--dp-strategy", "megatron-distopt", "--data-parallel", "2", "--tensor-parallel", "4",
            *[f"--tensor-plan={e}" for e in PLAN]],
        "gpt3_7b_tp1_pp4_memory_speed": [
            "--model", pp4, "--batch", "4", "--grad-accum", "4", *OPTIM,
            "--dp-strategy", "megatron-distopt", "--data-parallel", "2", "--pipeline", "4",
            "--virtual-stages", "8"],
        "gpt3_mcore_te_tp1_pp1_uniform_full_recompute": [
            "--model", small, "--batch", "4", *OPTIM, "--dp-strategy", "megatron-ddp",
            "--data-parallel", "8", "--checkpoint", "every-block", "--attention", "eager"],
    }


def estimate(exe, flags, gpu, first):
    cmd = [exe, "estimate", "--local", "--json", "--no-advice", "--device", f"{gpu}-80gb",
           *flags] + (["--first-step"] if first else [])
    r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    eos = r.get("endOfStep") or {}
    kept = sum(int(v) for k, v in eos.items() if k not in ("cudaContext", "nccl", "total"))
    return int(r["peak"]["allocatedBytes"]), kept


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memest", default="build/bin/memest")
    ap.add_argument("--out", default=None, help="where the model files go (default: a temp dir)")
    ap.add_argument("--check", type=float, default=None)
    args = ap.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="memest-anchors-")
    os.makedirs(out, exist_ok=True)
    flags = cases(out)
    pct = lambda e, m: f"{(e - m) / m:+.2%}"
    print("| case | GPU | published max (steady) | memest peak | diff | step 1 | memest --first-step"
          " | diff | allocated after an iteration | memest end of step | diff |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    worst = 0.0
    for (case, gpu), (steady, first, after) in PUBLISHED.items():
        peak, kept = estimate(args.memest, flags[case], gpu, False)
        row = [case, gpu, f"{steady:,}", f"{peak:,}", pct(peak, steady)]
        if first is not None:
            first_peak, _ = estimate(args.memest, flags[case], gpu, True)
            row += [f"{first:,}", f"{first_peak:,}", pct(first_peak, first)]
        else:
            row += ["-", "-", "-"]
        row += [f"{after:,}", f"{kept:,}", pct(kept, after)]
        print("| " + " | ".join(row) + " |")
        worst = max(worst, abs(peak - steady) / steady * 100)
    if args.check is not None and worst > args.check:
        print(f"a steady-state peak is {worst:.2f}% from the published one (limit {args.check}%)")
        sys.exit(1)


if __name__ == "__main__":
    main()
