"""Shared machinery of the multi-process truth (tests/parallel): launching N gloo ranks, the
per-rank allocator trace, saved-for-backward bytes, and the collectives gloo 1.13 lacks.

How each rank is measured, and what the trace cannot see: ranktrace.py.
"""
import collections
import contextlib
import datetime
import gc
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONFORMANCE = os.path.join(ROOT, "tests", "conformance")
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
for p in (CONFORMANCE, HERE):  # this folder first
    if p not in sys.path:
        sys.path.insert(0, p)
# The profiler's memory reporter warns on every free of a block allocated before profiling
# started (parameters, grads): expected here, and noise.
os.environ.setdefault("GLOG_minloglevel", "2")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402

import measure  # noqa: E402  (tests/conformance)
from recorder import ParamStore, Recorder, _make_leaf  # noqa: E402,F401
from ranktrace import PHASES, StepPhases, Trace, step_results, storage_key  # noqa: E402,F401


# ---------------------------------------------------------------------------------------------
def explained(trace, phases):
    """{"explain": trace.explain(phases)} when run.py --explain asked for it, else {}."""
    if not os.environ.get("PARALLEL_EXPLAIN"):
        return {}
    return {"explain": trace.explain([p for p in phases if p in trace._peak_at])}


def reference(fn, batch, optimizer, keep_grads=False, steps=2):
    """The same model and step in ONE process, without any parallelism (its own parameters and
    optimizer over all of them): what memest's single-device estimate is already held to by the
    conformance suite, and what the parallel figures are accounted against
    (docs/parallelism-truth.md). Per step: phase peaks, live at the end, model-state bytes."""
    store = ParamStore(seed=0)
    plan = record(store, fn, batch)
    out, _ = measure_steps(store, plan, fn, batch, optimizer, keep_grads=keep_grads, steps=steps)
    for r in out:
        del r["other_at_end"]
    return out


def record(store, fn, batch):
    """The case's record pass (its plan), which also creates the parameters: under the profiler,
    because c10's CPU memory reporter reports the free of a block only if it saw the block's
    allocation (ProfiledCPUMemoryReporter keeps the sizes of what it saw, across sessions), and
    a case may free a parameter's storage (ZeroRedundancyOptimizer's parameter buckets)."""
    from torch.autograd import ProfilerActivity, _disable_profiler, _enable_profiler, _prepare_profiler
    cfg = Trace.profiler_config()
    _prepare_profiler(cfg, {ProfilerActivity.CPU})
    _enable_profiler(cfg, {ProfilerActivity.CPU})
    try:
        rec = Recorder(store, training=True)
        return rec.finish(fn(rec, batch))
    finally:
        _disable_profiler()


# ---------------------------------------------------------------------------------------------
def distinct_bytes(tensors):
    seen = {}
    for t in tensors:
        ptr, nb, _ = storage_key(t)
        seen[ptr] = nb
    return sum(seen.values())


def model_state(params, opt_state_tensors, buffers=()):
    """End-of-step bytes: parameters (with the model's buffers, as memest files them), their
    .grad and the optimizer's state, as distinct storages (a parameter that is a view into a
    flat bucket counts the bucket once)."""
    params = list(params)
    return {
        "parameters": distinct_bytes(params + list(buffers)),
        "gradients": distinct_bytes([p.grad for p in params if p.grad is not None]),
        "optimizer_state": distinct_bytes(opt_state_tensors),
    }


def optimizer_state_tensors(opt):
    return [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]


class SavedBytes:
    """Distinct storages autograd packs while the context is open and that are still alive when
    `total()` is called (the conformance suite's rule: parameters excluded, inputs included,
    wrapped Python scalars not counted)."""

    def __init__(self, exclude_storages=()):
        self.exclude = set(exclude_storages)
        self.saved = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t):
        if measure._is_wrapped_number(t):
            return t
        ptr, nb, st = storage_key(t)
        if ptr in self.exclude or nb == 0:
            return t
        e = self.saved.get(ptr)
        if e is None or e[0].expired():
            self.saved[ptr] = [StorageWeakRef(st), nb]
        return t.detach()

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *a):
        self._hooks.__exit__(*a)

    def total(self):
        return sum(e[1] for e in self.saved.values() if not e[0].expired())


def saved_by_forward(store, plan, fn, batch):
    """Bytes autograd saves for backward in one forward and loss of the case (parameters left
    out), with nothing of it kept afterwards."""
    sb = SavedBytes(param_storages(store.params.values()))
    rec = Recorder(store, plan=plan, training=True)
    rec.make_inputs()
    with sb:
        loss = rec.take(fn(rec, batch))
    saved = sb.total()
    del loss
    rec.release_all()
    del rec
    return saved


def measure_steps(store, plan, fn, batch, optimizer, sync=None, teardown=None, steps=2,
                  keep_grads=False):
    """`steps` training steps of `fn` (recorded as `plan`) under one allocator trace, the
    for-loop `optimizer`: zero_grad(set_to_none, unless `keep_grads`) -> DATA -> FORWARD -> BACKWARD -> (GRAD_SYNC:
    `sync()`, when given) -> OPTIMIZER_STEP. Returns the step results (step_results with each
    step's end-of-step model states and what else stays live) and the trace's explained live
    sets. `teardown()`, when given, runs inside the trace after the optimizer is gone (the
    caller lets go of its own buffers there: TP's global buffer)."""
    trace = Trace()
    for n, prm in store.params.items():
        trace.register(prm, f"parameter {n}")
    for n, buf in store.buffers.items():
        trace.register(buf, f"buffer {n}")
    eos = []
    with trace:
        opt = measure.make_optimizer(measure.Config(optimizer=optimizer, impl="for-loop"),
                                     store.trainable())
        trace.mark("0.END")
        for s in range(1, steps + 1):
            opt.zero_grad(set_to_none=not keep_grads)
            phases = StepPhases(trace, s)
            phases.set_phase("DATA")
            rec = Recorder(store, plan=plan, tracker=phases, training=True)
            rec.make_inputs()
            phases.set_phase("FORWARD")
            loss = rec.take(fn(rec, batch))
            phases.set_phase("BACKWARD")
            loss.backward()
            del loss
            rec.release_all()
            del rec
            if sync is not None:
                phases.set_phase("GRAD_SYNC")
                sync()
            phases.set_phase("OPTIMIZER_STEP")
            opt.step()
            trace.mark(f"{s}.END")
            eos.append(model_state(store.params.values(), optimizer_state_tensors(opt),
                                   store.buffers.values()))
        trace.mark("TEARDOWN")
        opt.zero_grad(set_to_none=True)
        del opt
        if teardown is not None:
            teardown()
    peaks, at_mark, _ = trace.analyse(alive=[*store.params.values(), *store.buffers.values()])
    results = step_results(peaks, at_mark, steps)
    for r, e in zip(results, eos):
        r["end_of_step"] = e
        r["other_at_end"] = r["live_at_end"] - sum(e.values())
    return results, {"unseen_frees": trace.unseen_frees,
                     **explained(trace, [f"{s}.{ph}" for s in (1, 2) for ph in PHASES])}


def param_storages(tensors):
    return {t.storage().data_ptr() for t in tensors}


def run_inputs(rec, given=None):
    """Run mode: the plan's inputs and targets, made as the conformance suite makes them
    (`Recorder.make_inputs`), except those `given` (a received activation)."""
    given = given or {}
    for name, (shape, dtype, high) in rec.plan["leaves"].items():
        rec._prepared[name] = given[name] if name in given else _make_leaf(shape, dtype, "randn",
                                                                           rec.store.gen, high)


# ---------------------------------------------------------------------------------------------
GROUP = None   # the cases' process group: gloo with one worker thread (set by worker())
_FLUSH = None


def make_group(rank, world, ranks=None, name="memest-parallel"):
    """A gloo group with one worker thread of the world's `ranks` (all of them by default), made
    by its members only; `rank` is this process's rank in the world."""
    ranks = list(range(world)) if ranks is None else list(ranks)
    opts = dist.ProcessGroupGloo._Options()
    opts._devices = [dist.ProcessGroupGloo.create_default_device()]
    opts._threads = 1
    opts._timeout = datetime.timedelta(seconds=120)
    store = dist.PrefixStore(name, dist.distributed_c10d._get_default_store())
    pg = dist.ProcessGroupGloo(store, ranks.index(rank), len(ranks), opts)
    # Known to torch.distributed as new_group() would make it (get_rank(group) and the like).
    c10d = dist.distributed_c10d
    c10d._pg_map[pg] = (dist.Backend.GLOO, store)
    c10d._pg_names[pg] = name
    c10d._pg_group_ranks[pg] = {g: i for i, g in enumerate(ranks)}
    return pg


def flush(group=None):
    """Returns once gloo's worker has let go of every work item queued before (see above)."""
    dist.all_reduce(_FLUSH, group=group or GROUP)


def all_reduce(t, group=None):
    """dist.all_reduce (in place, sum), then flush(): the trace sees t's free wherever the caller
    lets go of it."""
    dist.all_reduce(t, group=group or GROUP)
    flush(group)


def broadcast_coalesced(group, tensors, buffer_size, src):
    """torch/csrc/distributed/c10d/comm.cpp broadcast_coalesced: buckets by size (one limit),
    each flattened into a new tensor (a view when the bucket holds one tensor), broadcast,
    copied back; at most two buckets in flight."""
    buckets, _ = dist._compute_bucket_assignment_by_size(list(tensors), [buffer_size])
    in_flight = collections.deque()

    def finish(work, flat, bucket):
        work.wait()
        flush(group)
        for t, o in zip(bucket, torch._utils._unflatten_dense_tensors(flat, bucket)):
            t.copy_(o)
    for idx in buckets:
        if len(in_flight) >= 2:
            finish(*in_flight.popleft())
        bucket = [tensors[i] for i in idx]
        flat = torch._utils._flatten_dense_tensors(bucket)
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        in_flight.append((group.broadcast([flat], opts), flat, bucket))
        del flat
    while in_flight:
        finish(*in_flight.popleft())


@contextlib.contextmanager
def ddp_construction():
    """DDP's constructor with its parameter broadcast run by `broadcast_coalesced` above."""
    orig = dist._broadcast_coalesced
    dist._broadcast_coalesced = broadcast_coalesced
    try:
        yield
    finally:
        dist._broadcast_coalesced = orig


# Collectives gloo 1.13 lacks, with NCCL's memory: the output is the caller's, nothing else.
def all_gather_into_tensor(output, inp, group=None):
    """NCCL's all_gather_into_tensor (1.13: _all_gather_base), as an in-place all_reduce of the
    output with this rank's chunk written in and zeros elsewhere."""
    group = group or GROUP
    rank = group.rank()
    n = inp.shape[0]
    output.zero_()
    output[rank * n:(rank + 1) * n].copy_(inp)
    all_reduce(output, group)


def reduce_scatter_tensor(output, inp, group=None):
    """NCCL's reduce_scatter_tensor (1.13: _reduce_scatter_base) for an input the caller lets
    go of afterwards (Megatron's are: the row-parallel output, the column-parallel input
    gradient): an in-place all_reduce of the input, then this rank's chunk copied out."""
    group = group or GROUP
    rank = group.rank()
    n = output.shape[0]
    all_reduce(inp, group)
    output.copy_(inp[rank * n:(rank + 1) * n])


# ---------------------------------------------------------------------------------------------
def worker(rank, world, case_ids, outdir, initfile):
    """One rank: runs the given cases in order, writing <outdir>/<n>.<rank>.json for each. Its
    stderr (c10's warnings, among them the profiler's for every free of a block allocated
    before the trace) goes to <outdir>/stderr.<rank>, which run.py shows when a case fails."""
    fd = os.open(os.path.join(outdir, f"stderr.{rank}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    os.close(fd)
    torch.set_num_threads(1)
    import registry  # the cases (imports every case module)
    dist.init_process_group("gloo", init_method="file://" + initfile, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    global GROUP, _FLUSH
    GROUP = make_group(rank, world)
    _FLUSH = torch.zeros(1)
    for n, cid in enumerate(case_ids):
        case = registry.CASES[cid]
        try:
            torch.manual_seed(0)
            res = case.run(rank, world, dict(case.params))
            res = {"ok": True, **res}
        except Exception as e:  # reported by the runner; the other ranks time out
            import traceback
            res = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        with open(os.path.join(outdir, f"{n}.{rank}.json"), "w") as f:
            json.dump(res, f)
        gc.collect()
        if not res["ok"]:
            break
        dist.barrier(group=GROUP)
    dist.destroy_process_group()
