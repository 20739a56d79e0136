"""Data parallelism on every rank: DistributedDataParallel (its C++ Reducer's gradient buckets)
and ZeroRedundancyOptimizer (torch's ZeRO-1) over DDP, PyTorch 1.13 on the CPU with gloo.

One trace per rank spans: the construction of DDP (parameter broadcast, buckets) and of the
optimizer (ZeRO's parameter buckets), then `steps` steps of the conformance suite's protocol:
zero_grad -> data -> forward (DDP's forward: the bucket rebuild in step 2) -> loss -> backward
(the reducer's copies into the buckets, gloo's in-place all-reduce, the copy back) ->
optimizer step (ZeRO: the local step, then the broadcast of every rank's updated parameters).
"""
import gc

import torch
import torch.distributed as dist

import common
from common import (ParamStore, Recorder, StepPhases, Trace, model_state,
                    optimizer_state_tensors, step_results)
import measure
import models

MODELS = {"mlp": models.mlp, "gpt": models.gpt}


class StoreModule(torch.nn.Module):
    """The case as an nn.Module for DDP: the ParamStore's parameters in declaration order (the
    order DDP buckets them in), and a forward that runs the case on a run-mode Recorder."""

    def __init__(self, store, fn, batch):
        super().__init__()
        self.plist = torch.nn.ParameterList(list(store.params.values()))
        self.fn, self.batch = fn, batch

    def forward(self, rec):
        return rec.take(self.fn(rec, self.batch))


def _optimizer(p, params):
    opt = p["optimizer"]
    if p.get("zero"):
        from torch.distributed.optim import ZeroRedundancyOptimizer
        cls, kw = {"adam": (torch.optim.Adam, {"lr": 1e-3}),
                   "adamw": (torch.optim.AdamW, {"lr": 1e-3}),
                   "momentum": (torch.optim.SGD, {"lr": 0.01, "momentum": 0.9})}[opt]
        return ZeroRedundancyOptimizer(params, optimizer_class=cls, foreach=False, process_group=common.GROUP,
                                       parameters_as_bucket_view=p["parameters_as_bucket_view"], **kw)
    return measure.make_optimizer(measure.Config(optimizer=opt, impl="for-loop"), params)


def run(rank, world, p):
    fn = MODELS[p["model"]]
    batch = p["batch"]
    store = ParamStore(seed=0)
    plan = common.record(store, fn, batch)
    names = {id(v): k for k, v in store.params.items()}

    # Saved for backward: the bare module (DDP adds no autograd node that saves).
    saved = common.saved_by_forward(store, plan, fn, batch)

    # The same step in one process, without DDP (rank 0 only: it does not depend on the rank).
    ref = common.reference(fn, batch, p["optimizer"], p.get("keep_grads", False), 3) if rank == 0 else None

    module = StoreModule(store, fn, batch)
    trace = Trace()
    for n, prm in store.params.items():
        trace.register(prm, f"parameter {n}")
    steps = p.get("steps", 3)
    eos = []
    with trace:
        trace.mark("CONSTRUCT")
        with common.ddp_construction():
            ddp = torch.nn.parallel.DistributedDataParallel(
                module, process_group=common.GROUP, bucket_cap_mb=p["bucket_cap_mb"],
                gradient_as_bucket_view=p["gradient_as_bucket_view"],
                find_unused_parameters=p.get("find_unused_parameters", False))
        opt = _optimizer(p, store.trainable())
        trace.mark("0.END")
        for s in range(1, steps + 1):
            opt.zero_grad(set_to_none=not p.get("keep_grads", False))
            phases = StepPhases(trace, s)
            phases.set_phase("DATA")
            rec = Recorder(store, plan=plan, tracker=phases, training=True)
            rec.make_inputs()
            phases.set_phase("FORWARD")
            loss = ddp(rec)
            phases.set_phase("BACKWARD")
            loss.backward()
            del loss
            rec.release_all()
            del rec
            phases.set_phase("OPTIMIZER_STEP")
            opt.step()
            trace.mark(f"{s}.END")
            eos.append(model_state(store.params.values(),
                                   optimizer_state_tensors(opt.optim if p.get("zero") else opt)))
        logging = ddp._get_ddp_logging_data()
        partition = [[names[id(q)] for q in grp] for grp in _partition(opt)] if p.get("zero") else None
        trace.mark("TEARDOWN")
        common.flush()
        opt.zero_grad(set_to_none=True)
        del ddp, opt, module
        gc.collect()
    peaks, at_mark, _ = trace.analyse(alive=store.params.values())
    results = step_results(peaks, at_mark, steps)
    for r, e in zip(results, eos):
        r["end_of_step"] = e
        r["other_at_end"] = r["live_at_end"] - sum(e.values())
    out = {
        "saved_for_backward": saved,
        "construct": {"peak": peaks["CONSTRUCT"], "live_after": at_mark["0.END"]},
        "steps": results,
        "ddp": {
            "bucket_sizes": [int(x) for x in str(logging.get("bucket_sizes", "")).split(",") if x.strip()],
            "rebuilt_bucket_sizes": [int(x) for x in str(logging.get("rebuilt_bucket_sizes", "")).split(",")
                                     if x.strip()],
            "rebuilt_bucket_params": [[list(store.params)[int(i)] for i in g.split()] for g in
                                      str(logging.get("rebuilt_per_bucket_param_indices", "")).split(",")
                                      if g.strip()],
        },
        "unseen_frees": trace.unseen_frees,
    }
    if partition is not None:
        out["zero_partition"] = partition
    if ref is not None:
        out["reference"] = ref
    out.update(common.explained(trace, ["CONSTRUCT"] + [f"{s}.{ph}" for s in (1, 2, steps) for ph in common.PHASES]))
    dist.barrier(group=common.GROUP)
    return out


def _partition(opt):
    """The parameters each rank's local optimizer owns (one parameter group)."""
    return [[q for g in groups for q in g["params"]] for groups in opt._partition_parameters()]
