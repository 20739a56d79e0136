#!/usr/bin/env python3
"""Saved-for-backward of --hf-config models that transformers 4.47 lacks (Gemma 3) or builds
otherwise than transformers 5 (Gemma 2), against transformers 5 and PyTorch 2.x on the CPU.

hf_config_check.py compares every quantity with PyTorch 1.13 and transformers 4.47.1; Gemma 3
came in transformers 4.50, which needs PyTorch 2. This check measures what autograd keeps for
backward (measure.SavedStorages' method: the distinct storages packed during forward and the
loss, still alive after it, parameters and buffers left out) of small configs in eager
attention, float32, batch 2, sequence 16, and compares it with `memest estimate --hf-config`
(the CUDA runtime: PyTorch 2.x's autograd; SGD, the loop holding only the loss). Peaks are not
compared: the CPU has no caching allocator to model.

--cases deepseek measures DeepSeek-V3's latent attention and grouped-router MoE instead
(DeepseekV3ForCausalLM as transformers 4.57 writes it, whose experts loop over nn.Linear
modules: transformers 5 fuses them into 3-D parameters, which memest does not model); run it with
transformers 4.5x.

Usage:
  PY2 tests/conformance/hf5_saved_check.py measure DIR [--cases deepseek]  # torch 2.x, transformers >= 4.50
  python3 tests/conformance/hf5_saved_check.py compare DIR [--memest build/bin/memest]
  PY2 tests/conformance/hf5_saved_check.py run DIR [--memest PATH]   # both, one interpreter

`measure` writes DIR/<name>.json (each config, as its Config class's to_dict() writes it) and
DIR/measured.json; `compare` estimates each and prints measured, estimated, their difference and
the difference expected: the rotary tables, which memest keeps as buffers where transformers 5
computes them once a forward and the rotary multiplications save them (cos and sin, [1, T,
head_dim] float32: 2,048 bytes a pair; Gemma 3 has a pair for its global and one for its
windowed layers). Exits 1 when a difference is not the expected one.
"""
import argparse
import json
import os
import subprocess
import sys

SMALL = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, intermediate_size=128,
             max_position_embeddings=64, sliding_window=8)
# name: (Config class, model class, kwargs, rotary table pairs transformers 5 computes[, their
# width: head_dim when left out])
CASES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              {k: v for k, v in SMALL.items() if k != "sliding_window"}, 1),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", SMALL, 1),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               dict(SMALL, num_hidden_layers=3, sliding_window_pattern=3), 2),
    "gemma3_logit_softcap": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                             dict(SMALL, num_hidden_layers=3, sliding_window_pattern=3,
                                  final_logit_softcapping=30.0), 2),
}
# DeepSeek-V3 (transformers 4.57.1): a dense first layer, then the MoE of 8 experts in 2 groups;
# the rotary tables are qk_rope_head_dim wide.
DS = dict(vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
          num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
          n_routed_experts=8, routed_scaling_factor=2.5, kv_lora_rank=32, q_lora_rank=48,
          qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16, n_group=2, topk_group=1,
          num_experts_per_tok=2, first_k_dense_replace=1, norm_topk_prob=True,
          max_position_embeddings=64)
YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32,
        "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
DEEPSEEK_CASES = {
    name: ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(DS, **kw), 1, 8)
    for name, kw in {
        "deepseek_v3": {},
        "deepseek_v3_no_q_lora": dict(q_lora_rank=None),
        "deepseek_v3_no_interleave": dict(rope_interleave=False),
        "deepseek_v3_one_group_no_norm": dict(norm_topk_prob=False, n_group=1, topk_group=1),
        "deepseek_v3_two_shared": dict(n_shared_experts=2, first_k_dense_replace=0),
        "deepseek_v3_yarn": dict(rope_scaling=YARN),
    }.items()
}
BATCH, SEQ = 2, 16


def table_pair(case):
    """The bytes of a float32 cos and sin pair [1, T, width] that memest keeps as buffers."""
    width = case[4] if len(case) > 4 else SMALL["head_dim"]
    return 2 * SEQ * width * 4


def measure(out_dir, cases):
    import torch
    import torch.nn.functional as F
    import transformers
    from torch.multiprocessing.reductions import StorageWeakRef
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    os.makedirs(out_dir, exist_ok=True)
    measured = {"torch": torch.__version__, "transformers": transformers.__version__, "saved": {}}
    for name, (cfg_cls, cls, kw, *_) in cases.items():
        config = getattr(transformers, cfg_cls)(attn_implementation="eager", **kw)
        config.use_cache = False
        model = getattr(transformers, cls)(config).train()
        d = config.to_dict()
        d["_attn_implementation"] = "eager"
        with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
            json.dump(d, f, indent=1)
        owned = {t.untyped_storage().data_ptr()
                 for t in list(model.parameters()) + list(model.buffers())}
        saved = {}

        def pack(t):
            st = t.untyped_storage()
            if st.data_ptr() in owned or st.nbytes() == 0:
                return t
            e = saved.get(st.data_ptr())
            if e is None or e[0].expired():
                saved[st.data_ptr()] = [StorageWeakRef(st), st.nbytes()]
            return t.detach()

        ids = torch.randint(0, kw["vocab_size"], (BATCH, SEQ))
        target = torch.randint(0, kw["vocab_size"], (BATCH, SEQ))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logits = model(ids).logits
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
            del logits
        measured["saved"][name] = sum(e[1] for e in saved.values() if not e[0].expired())
        del loss
    with open(os.path.join(out_dir, "measured.json"), "w") as f:
        json.dump(measured, f, indent=1)
    return measured


def compare(out_dir, memest, cases):
    with open(os.path.join(out_dir, "measured.json")) as f:
        measured = json.load(f)
    print(f"saved for backward, bytes (torch {measured['torch']}, transformers "
          f"{measured['transformers']}, CPU, eager, float32, batch {BATCH}, sequence {SEQ})")
    print(f"  {'config':<30} {'measured':>10} {'memest':>10} {'difference':>11} {'expected':>9}")
    bad = 0
    for name, case in cases.items():
        cmd = [memest, "estimate", "--local", "--hf-config", os.path.join(out_dir, f"{name}.json"),
               "--seq", str(SEQ), "--batch", str(BATCH), "--precision", "fp32", "--attention",
               "eager", "--optimizer", "sgd", "--no-hold-outputs", "--json", "--no-advice"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            print(f"  {name}: memest exited {p.returncode}: {p.stderr.strip()}")
            bad += 1
            continue
        estimated = int(json.loads(p.stdout)["savedForBackwardBytes"])
        m = measured["saved"][name]
        expected = -case[3] * table_pair(case)
        ok = estimated - m == expected
        bad += not ok
        print(f"  {name:<30} {m:>10,} {estimated:>10,} {estimated - m:>+11,} {expected:>+9,}"
              f"{'' if ok else '  !!'}")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=("measure", "compare", "run"))
    ap.add_argument("dir")
    ap.add_argument("--memest", help="the memest binary (default: build/bin/memest)")
    ap.add_argument("--cases", choices=("hf5", "deepseek"), default="hf5",
                    help="Gemma 2 and 3 under transformers 5 (default), or DeepSeek-V3 under "
                         "transformers 4.57")
    args = ap.parse_args()
    cases = DEEPSEEK_CASES if args.cases == "deepseek" else CASES
    if args.memest is None:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        args.memest = os.path.join(root, "build", "bin", "memest")
    if args.action in ("measure", "run"):
        measure(args.dir, cases)
    if args.action in ("compare", "run"):
        return compare(args.dir, args.memest, cases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
