#!/work/venv-torch2/bin/python
"""FSDP1 (FullyShardedDataParallel) per rank, measured: PyTorch 2.x on the CPU, gloo, 2 and 4
processes. By hand, never in CI, with the venv of fsdp2.py (PyTorch 2.15.0 from PyPI):

  /work/venv-torch2/bin/python tests/parallel/fsdp1.py [--case SUBSTRING ...] [--write-expected]
      [--explain] [--lifetimes] [--events SUBSTRING] [--list]

fsdp2.py's runner, model, saved-bytes pass and result format, by import (fsdp2.main with this
module as the driver); fsdp1_trace.Probes names FSDP1's buffers. Each rank builds fsdp2's GPT
(V 256, t 16, d 128, 4 heads, 3 blocks, batch 4 per rank), wraps it as HF accelerate and
torchtitan's FSDP1 days did, `FullyShardedDataParallel(model,
auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.device("cpu"))` (each block one
unit, the root the embeddings, final LayerNorm and head), builds AdamW (foreach) over its
FlatParameters and runs 3 steps (zero_grad(set_to_none) -> DATA -> FORWARD -> LOSS -> BACKWARD
[-> again per micro-batch] -> OPTIMIZER_STEP), all under one allocator trace. The numbers are
compared with tests/parallel/expected/fsdp1_<case>.json to the byte: a change fails (exit 1).
docs/parallelism-truth.md, "FSDP1, measured on PyTorch 2.15", accounts for them
(tests/parallel/fsdp1_account.py checks the rules).

FSDP1 on the CPU in 2.15 needs `device_id=torch.device("cpu")`: with device_id None it takes
the current accelerator for a CPU module and raises "FSDP needs a non-CPU accelerator device"
when there is none (_init_utils._init_device_handle). Its streams are then torch.cpu's (no-ops),
`record_stream` is skipped for CPU tensors, and the all-gather takes its CPU path
(`dist.all_gather` into the chunks of `_full_param_padded`).
"""
import gc
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import fsdp2  # noqa: E402  (puts tests/conformance on the path; torch, the runner, the model)
import fsdp1_trace  # noqa: E402
import fsdp2_trace  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DIMS = fsdp2.DIMS
STEPS = fsdp2.STEPS

# id -> (world size, parameters). full-shard: FULL_SHARD with the 2.x defaults; shard-grad-op;
# bf16: MixedPrecision(bf16 parameters and buffers, fp32 reduction); orig-params:
# use_orig_params=True; accum2: 2 micro-batches, a reduce-scatter each; accum2-no-sync: the
# first under no_sync(); pad: V 255 and a head bias (the root's FlatParameter odd: padded);
# no-shard: NO_SHARD (FSDP's DDP mode).
BASE = {"sharding": "FULL_SHARD", "param_dtype": None, "reduce_dtype": None, "buffer_dtype": None,
        "use_orig_params": False, "microbatches": 1, "no_sync": False, "vocab": 256, "head_bias": False,
        "backward_prefetch": "BACKWARD_PRE", "limit_all_gathers": True, "forward_prefetch": False,
        "optimizer": "adamw-foreach"}
VARIANTS = {
    "full-shard": {},
    "shard-grad-op": {"sharding": "SHARD_GRAD_OP"},
    "bf16": {"param_dtype": "bfloat16", "reduce_dtype": "float32", "buffer_dtype": "bfloat16"},
    "orig-params": {"use_orig_params": True},
    "accum2": {"microbatches": 2},
    "accum2-no-sync": {"microbatches": 2, "no_sync": True},
    "pad": {"vocab": 255, "head_bias": True},
    "no-shard": {"sharding": "NO_SHARD"},
}
CASES = {f"fsdp1/{v}/w{w}": (w, {**BASE, **p}) for v, p in VARIANTS.items() for w in (2, 4)
         if not (v == "no-shard" and w == 4)}
PROBES = fsdp1_trace.Probes()
UNITS = ("root", "h.0", "h.1", "h.2")


def setup(world):
    return None


def build(p):
    from torch.distributed.fsdp import BackwardPrefetch, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    torch.manual_seed(0)
    model = fsdp2.GPT(p["vocab"], DIMS["t"], DIMS["d"], DIMS["heads"], DIMS["layers"])
    if p["head_bias"]:
        model.head = nn.Linear(DIMS["d"], p["vocab"], bias=True)
    mp_ = None
    if p["param_dtype"]:
        mp_ = MixedPrecision(**{k: getattr(torch, p[k]) for k in ("param_dtype", "reduce_dtype", "buffer_dtype")})
    return FSDP(model, auto_wrap_policy=ModuleWrapPolicy({fsdp2.Block}),
                sharding_strategy=getattr(ShardingStrategy, p["sharding"]), mixed_precision=mp_,
                use_orig_params=p["use_orig_params"], device_id=torch.device("cpu"),
                backward_prefetch=getattr(BackwardPrefetch, p["backward_prefetch"]),
                limit_all_gathers=p["limit_all_gathers"], forward_prefetch=p["forward_prefetch"])


def units(model):
    """{unit name: FSDP instance}: the root, then one per block."""
    return {"root": model, **{f"h.{i}": blk for i, blk in enumerate(model.module.h)}}


class _ParamSource:
    """What fsdp2.Saved leaves out as parameters: the module's parameters and the units'
    FlatParameters (whose data is the gathered `_full_param_padded` while a unit runs)."""

    def __init__(self, model):
        self.model = model

    def parameters(self):
        yield from self.model.parameters()
        for m in units(self.model).values():
            yield m._handle.flat_param


def model_state(model, opt):
    params = list(model.parameters())
    state = [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    return {"parameters": fsdp2.storages(params), "gradients": fsdp2.storages(p.grad for p in params),
            "optimizer_state": fsdp2.storages(state)}


def run_case(rank, world, cid, p, ctx):
    import contextlib
    trace = fsdp2_trace.LabelledTrace()
    PROBES.trace = trace
    gen = torch.Generator().manual_seed(1000 + rank)
    b, t = DIMS["batch"], DIMS["t"]
    ends, saved = [], []
    gc.collect()
    gc.disable()  # as fsdp2.py: no collection mid-step
    with trace:
        trace.mark("CONSTRUCT")
        model = build(p)
        PROBES.units = {id(m._handle): u for u, m in units(model).items()}
        for u, m in units(model).items():
            trace.label(m._handle.flat_param, f"local shard {u}")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
        trace.mark("0.END")
        for s in range(1, STEPS + 1):
            opt.zero_grad(set_to_none=True)
            for k in range(p["microbatches"]):
                sync = contextlib.nullcontext() if not (p["no_sync"] and k == 0) else model.no_sync()
                with sync:
                    trace.mark(f"{s}.DATA")
                    idx = torch.randint(0, p["vocab"], (b, t), generator=gen)
                    y = torch.randint(0, p["vocab"], (b, t), generator=gen)
                    trace.label(idx, "input")
                    trace.label(y, "input")
                    sv = fsdp2.Saved(_ParamSource(model))
                    with sv.hooks:
                        trace.mark(f"{s}.FORWARD")
                        logits = model(idx)
                        trace.mark(f"{s}.LOSS")
                        loss = F.cross_entropy(logits.view(b * t, -1), y.view(-1))
                        del logits
                    saved.append(sv.total())
                    trace.mark(f"{s}.BACKWARD")
                    loss.backward()
                    del loss, idx, y, sv
            trace.mark(f"{s}.OPTIMIZER_STEP")
            opt.step()
            for st in opt.state.values():
                for k, v in st.items():
                    if isinstance(v, torch.Tensor):
                        trace.label(v, f"optimizer state {k}")
            for prm in model.parameters():
                trace.label(prm.grad, "sharded grad (end of step)")
            ends.append(model_state(model, opt))
            trace.mark(f"{s}.END")
        trace.mark("TEARDOWN")
        alive = list(model.parameters()) + [x.grad for x in model.parameters() if x.grad is not None] + \
            [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    PROBES.trace = None
    gc.enable()
    trace.analyse(alive=alive)
    if os.environ.get("FSDP2_EVENTS") and rank == 0:
        fsdp2.dump_events(trace, os.environ["FSDP2_EVENTS"])
    return fsdp2.result(trace, ends, saved, p)


if __name__ == "__main__":
    sys.exit(fsdp2.main("fsdp1"))
