#!/work/venv-torch215/bin/python
"""DeepSpeed ZeRO-3 per rank, measured: DeepSpeed 0.16.0 on PyTorch 2.15 on the CPU, gloo, 2 and 4
processes. By hand, never in CI (Debian's PyTorch 1.13 runs no DeepSpeed). In the venv of
fsdp2.py, with DeepSpeed added:

  /work/venv-torch215/bin/pip install deepspeed==0.16.0
  /work/venv-torch215/bin/python tests/parallel/zero3.py [--case SUBSTRING ...] [--write-expected]
      [--explain] [--lifetimes] [--events SUBSTRING] [--list]

DeepSpeed on the CPU: DS_ACCELERATOR=cpu (set here before DeepSpeed is imported); without
oneCCL (oneccl_bindings_for_pytorch) the CPU accelerator's communication backend is gloo
(deepspeed/accelerator/cpu_accelerator.py), and deepspeed.initialize takes the default group
that fsdp2.worker made (one gloo worker thread, fsdp2_trace.install_gloo_one_thread). DeepSpeed's
optimizer is its FusedAdam ("optimizer": {"type": "AdamW"}), whose CPU op (csrc/cpu/adam/
fused_adam.cpp) DeepSpeed builds at the first run (torch.utils.cpp_extension, ninja, g++; cached
under ~/.cache/torch_extensions).

Every case starts its world size of gloo ranks (fsdp2.run_world). Each rank builds the GPT of
fsdp2.py (V 256, t 16, d 128, 4 heads, 3 blocks, batch 4 per rank) outside zero.Init (as HF
Trainer and accelerate do), hands it to deepspeed.initialize with the case's config (ZeRO stage
3, reduce_bucket_size 1e6 elements, the rest DeepSpeed's defaults unless the case says) and runs
STEPS steps (DATA -> FORWARD: engine(idx) -> LOSS: cross entropy -> BACKWARD: engine.backward ->
OPTIMIZER_STEP: engine.step; the loop holds the loss and the batch across backward, nothing else),
all under one allocator trace (fsdp2_trace.LabelledTrace). Names: DeepSpeed's own buffers are
labelled when it makes them (lp_param_buffer, the fp32 partitions, grad_partitions_flat_buffer,
the ipg bucket, the optimizer state, gathered parameters); everything else DeepSpeed allocates is
named by the innermost DeepSpeed function it was made in (DeepSpeed's instrument_w_nvtx ranges,
which the CPU accelerator ignores, are made torch.profiler record_functions "DS::<qualname>").
Every DeepSpeed all-gather and reduce-scatter is made synchronous and followed by a flush of
gloo's worker (as fsdp2.py does: the trace then sees every free), so a gather started as a
prefetch is complete when it is issued; what is allocated, and when it is freed, is DeepSpeed's.

The numbers are compared with tests/parallel/expected/zero3_<case>.json to the byte (exit 1 on
a change); --write-expected writes them. docs/parallelism-truth.md, section 11, accounts for
them; tests/parallel/zero3_compare.py compares memest with them.
"""
import gc
import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("DS_BUILD_OPS", "0")
sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fsdp2  # noqa: E402
import fsdp2_trace  # noqa: E402

STEPS = 3
DIMS = fsdp2.DIMS

# The config every case starts from: what the brief fixes, everything else DeepSpeed 0.16.0's
# defaults (deepspeed/runtime/zero/config.py): stage3_prefetch_bucket_size 5e7,
# stage3_max_live_parameters 1e9, stage3_max_reuse_distance 1e9,
# stage3_param_persistence_threshold 1e5 (every parameter of this model is below it: all are
# persistent), stage3_model_persistence_threshold sys.maxsize, overlap_comm True for stage 3,
# contiguous_gradients True, reduce_scatter True, sub_group_size 1e9 (one sub-group),
# round_robin_gradients False, no offload.
BASE_ZERO = {"stage": 3, "reduce_bucket_size": 1000000}
VARIANTS = {
    "bf16": ({"bf16": {"enabled": True}}, {}),
    "fp32": ({}, {}),
    "bf16-persist0": ({"bf16": {"enabled": True}}, {"stage3_param_persistence_threshold": 0}),
    "bf16-persist0-noprefetch": ({"bf16": {"enabled": True}},
                                 {"stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0,
                                  "stage3_max_reuse_distance": 9000}),
}
CASES = {f"zero3/{v}/w{w}": (w, {"precision": "fp32" if v == "fp32" else "bf16",
                                  "zero_optimization": {**BASE_ZERO, **z}, **top})
         for v, (top, z) in VARIANTS.items() for w in (2, 4)}


def ds_config(p):
    cfg = {"train_micro_batch_size_per_gpu": DIMS["batch"], "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "zero_optimization": p["zero_optimization"], "steps_per_print": 1 << 30,
           "wall_clock_breakdown": False}
    for k in ("bf16", "fp16"):
        if k in p:
            cfg[k] = p[k]
    return cfg


# ---------------------------------------------------------------------------------------------
def short(path):
    """fsdp2_trace.short with DeepSpeed's ranges (DS::) kept as FSDP2's are."""
    parts = path.split(" > ")
    keep, last = [], -1
    for i, q in enumerate(parts):
        if q.startswith(("DS::", "c10d::", "gloo:", "Optimizer.")):
            if q.startswith("DS::") and keep and keep[-1] == q:
                last = i
                continue
            keep.append(q)
            last = i
        elif q.startswith("autograd::engine::evaluate_function: "):
            keep.append(q.split(": ", 1)[1])
            last = i + 1 if i + 1 < len(parts) and parts[i + 1] == keep[-1] else i
    return " > ".join(keep + [q for q in parts[last + 1:last + 3] if q != "-"]) or "-"


def group_of(path):
    """The DeepSpeed function a collective was called from (gloo's copies are named by it)."""
    for q in reversed(path.split(" > ")):
        if q.startswith("DS::"):
            return q[4:]
    return "?"


fsdp2_trace.short = short
fsdp2_trace.group_of = group_of

# What DeepSpeed's functions allocate, by the innermost DS:: range and the op (first match).
DS_NAMES = (
    ("AllGatherCoalescedHandle.wait", "gathered param (contiguous copy of the flat buffer)"),
    ("AllGatherHandle.wait", "gathered param"),
    ("all_gather_coalesced", "all-gather flat buffer"),
    ("_allgather_params_coalesced", "persistent params all-gather"),
    ("_allgather_params", "persistent params all-gather"),
    ("reduce_scatter_coalesced", "reduce-scatter cat buffer"),
    ("__avg_scatter_grads", "reduce-scatter"),
    ("partition_grads", "partition_grads temporary"),
    ("_prepare_fp32_grad_for_sub_group", "step: flatten / fp32 gradient copy"),
    ("get_grad_norm_direct", "step: norm temporary"),
    ("_constant_buffered_norm2", "step: norm temporary"),
    ("has_overflow", "step: overflow check"),
    ("unscale_and_clip_grads", "step: unscale temporary"),
    ("_optimizer_step", "optimizer step temporary"),
    ("_post_step", "post-step"),
)


# Ranges around the whole forward and backward: what is made under them alone is the model's
# (activations, autograd's temporaries), not DeepSpeed's.
OUTER = {"DeepSpeedEngine.forward", "DeepSpeedEngine.backward", "DeepSpeedZeroOptimizer_Stage3.backward"}


class ZeroTrace(fsdp2_trace.LabelledTrace):
    def name(self, j):
        if self.alloc_label.get(j):
            return " = ".join(self.alloc_label[j])
        op = self._ev[j][3]
        if "gloo:" in op or "c10d::" in op:
            return fsdp2_trace.gloo_name(op, self.coll_group.get(j, "?"))
        ds = [q[4:] for q in op.split(" > ") if q.startswith("DS::") and q[4:] not in OUTER]
        ph = (self.alloc_phase.get(j) or "?").split(".")[-1]
        if ds:
            inner = ds[-1]
            for key, nm in DS_NAMES:
                if any(key in d for d in reversed(ds)):
                    return f"{nm} [{inner}] ({ph.lower()})"
            return f"DS [{inner} > {short(op).split(' > ')[-1]}] ({ph.lower()})"
        return f"{'activation' if ph in ('FORWARD', 'LOSS') else 'temporary'} [{short(op)}] ({ph.lower()})"

    def lifetimes(self, marks):
        # every DS:: allocation is shown, named or not: give them a label before the parent runs
        for j, e in enumerate(self._ev):
            if e[1] > 0 and "DS::" in e[3] and not self.alloc_label.get(j) and j in self.alloc_phase:
                self.alloc_label[j] = [self.name(j)]
        return super().lifetimes(marks)


class Probes:
    """DeepSpeed's nvtx ranges as record_functions; its collectives synchronous and flushed."""

    def __init__(self):
        self.trace = None
        self._stack = []

    def install(self):
        from deepspeed.accelerator import get_accelerator
        import deepspeed.comm as dscomm
        import deepspeed.comm.comm as dscomm2
        acc = get_accelerator()
        pr = self

        def push(msg):
            rf = torch.autograd.profiler.record_function("DS::" + msg)
            rf.__enter__()
            pr._stack.append(rf)

        def pop():
            if pr._stack:
                pr._stack.pop().__exit__(None, None, None)
        acc.range_push, acc.range_pop = push, pop

        class Done:
            def wait(self, *a, **k):
                return None

            def is_completed(self):
                return True

        def sync(name, orig):
            def f(*a, **k):
                asked = k.get("async_op", False)
                k["async_op"] = True  # the work is held here until gloo's worker let go of it
                with torch.autograd.profiler.record_function("DS::" + name):
                    work = orig(*a, **k)
                    if work is not None and hasattr(work, "wait"):
                        work.wait()
                    if pr.trace is not None:
                        pr.trace.flush(k.get("group"))
                    del work
                return Done() if asked else None
            return f
        for name in ("allgather_fn", "reduce_scatter_fn", "all_gather_into_tensor", "reduce_scatter_tensor",
                     "all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_reduce_coalesced"):
            for mod in (dscomm, dscomm2):
                orig = getattr(mod, name, None)
                if orig is not None and not getattr(orig, "_zero3_probe", False):
                    g = sync(name, orig)
                    g._zero3_probe = True
                    setattr(mod, name, g)
        # functions that DeepSpeed does not instrument, given a range of their own
        from deepspeed.runtime.zero import partition_parameters as PP
        from deepspeed.runtime.zero import stage3 as S3
        from deepspeed.runtime.comm import coalesced_collectives as CC

        def ranged(owner, attr, label):
            orig = getattr(owner, attr)

            def f(*a, **k):
                with torch.autograd.profiler.record_function("DS::" + label):
                    return orig(*a, **k)
            setattr(owner, attr, f)
        ranged(CC, "reduce_scatter_coalesced", "reduce_scatter_coalesced")
        for mod in (S3,):  # stage3 imported the name before this ran
            if hasattr(mod, "reduce_scatter_coalesced"):
                mod.reduce_scatter_coalesced = CC.reduce_scatter_coalesced
        for attr in ("_allgather_params_coalesced", "_allgather_params"):
            ranged(PP.Init, attr, "Init." + attr)
        for attr in ("_post_step", "_optimizer_step", "_get_norm_groups", "step", "_partition_all_parameters",
                     "initialize_optimizer_states", "_setup_for_real_optimizer", "partition_grads",
                     "independent_gradient_partition_epilogue", "unscale_and_clip_grads"):
            if hasattr(S3.DeepSpeedZeroOptimizer_Stage3, attr):
                ranged(S3.DeepSpeedZeroOptimizer_Stage3, attr, "DeepSpeedZeroOptimizer_Stage3." + attr)
        return self


PROBES = Probes()


def setup(world):
    import deepspeed
    from deepspeed.utils import logger
    import logging
    logger.setLevel(logging.WARNING)
    os.environ.update({"RANK": str(dist.get_rank()), "LOCAL_RANK": str(dist.get_rank()),
                       "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world)})
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    return {}


def label_state(trace, engine):
    opt = engine.optimizer  # DeepSpeedZeroOptimizer_Stage3
    lp = getattr(opt, "lp_param_buffer", None)
    if lp is not None:
        trace.label(lp, "lp_param_buffer (ds_tensor partitions)")
    lpk = fsdp2_trace.storage_key(lp)[0] if lp is not None else None
    for n, prm in engine.module.named_parameters():
        if fsdp2_trace.storage_key(prm.ds_tensor)[0] != lpk:
            trace.label(prm.ds_tensor, f"ds_tensor partition {n}")
    for i, t in enumerate(opt.fp32_partitioned_groups_flat):
        trace.label(t, f"fp32 partition sg{i}")
    trace.label(opt.grad_partitions_flat_buffer, "grad_partitions_flat_buffer")
    ipg = getattr(opt, "_DeepSpeedZeroOptimizer_Stage3__ipg_bucket_flat_buffer", None)
    trace.label(ipg, "ipg bucket")
    for st in opt.optimizer.state.values():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                trace.label(v, f"optimizer state {k}")


def label_gathered(trace, engine, tag):
    for n, prm in engine.module.named_parameters():
        if prm.data.numel() > 0:
            trace.label(prm.data, f"gathered param {n}")


def all_tensors():
    out = []
    for o in gc.get_objects():
        try:
            if isinstance(o, torch.Tensor):
                out.append(o)
        except Exception:
            pass
    return out


def run_case(rank, world, cid, p, ctx):
    import deepspeed
    trace = ZeroTrace()
    PROBES.trace = trace
    gen = torch.Generator().manual_seed(1000 + rank)
    b, t, V = DIMS["batch"], DIMS["t"], DIMS["vocab"]
    steps, saved, info = [], [], {}
    gc.collect()
    with trace:
        trace.mark("CONSTRUCT")
        torch.manual_seed(0)
        model = fsdp2.GPT(V, t, DIMS["d"], DIMS["heads"], DIMS["layers"])
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=ds_config(p))
        del model
        label_state(trace, engine)
        label_gathered(trace, engine, "init")
        zc = engine._config.zero_config
        info = {k: getattr(zc, k) for k in (
            "reduce_bucket_size", "prefetch_bucket_size", "max_live_parameters", "max_reuse_distance",
            "param_persistence_threshold", "model_persistence_threshold", "overlap_comm",
            "contiguous_gradients", "reduce_scatter", "sub_group_size")}
        info["optimizer"] = type(engine.optimizer.optimizer).__name__
        info["model_dtype"] = str(next(engine.module.parameters()).dtype)
        info["persistent"] = sorted(n for n, prm in engine.module.named_parameters() if prm.ds_persist)
        trace.mark("0.END")
        for s in range(1, STEPS + 1):
            trace.mark(f"{s}.DATA")
            idx = torch.randint(0, V, (b, t), generator=gen)
            y = torch.randint(0, V, (b, t), generator=gen)
            trace.label(idx, "input")
            trace.label(y, "input")
            sv = fsdp2.Saved(engine.module)
            with sv.hooks:
                trace.mark(f"{s}.FORWARD")
                logits = engine(idx)
                trace.mark(f"{s}.LOSS")
                loss = F.cross_entropy(logits.view(b * t, -1), y.view(-1))
                del logits
            saved.append(sv.total())
            trace.mark(f"{s}.BACKWARD")
            engine.backward(loss)
            del loss, idx, y, sv
            trace.mark(f"{s}.OPTIMIZER_STEP")
            engine.step()
            label_state(trace, engine)
            label_gathered(trace, engine, "end")
            opt = engine.optimizer
            steps.append({"optimizer_state": fsdp2.storages(
                v for st in opt.optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)),
                "gathered_params": fsdp2.storages(prm.data for prm in engine.module.parameters()
                                                  if prm.data.numel() > 0)})
            trace.mark(f"{s}.END")
        trace.mark("TEARDOWN")
        alive = all_tensors()
    PROBES.trace = None
    trace.analyse(alive=alive)
    del alive
    if os.environ.get("FSDP2_EVENTS") and rank == 0:
        fsdp2.dump_events(trace, os.environ["FSDP2_EVENTS"])
    out = fsdp2.result(trace, steps, saved, p)
    out["deepspeed"] = info
    engine.destroy()
    return out


if __name__ == "__main__":
    sys.exit(fsdp2.main("zero3"))
