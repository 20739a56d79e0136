#!/work/venv-torch2/bin/python
"""DTensor tensor parallelism (`parallelize_module`, torchtitan's Llama plan) per rank, measured:
PyTorch 2.x on the CPU, gloo, 2 and 4 processes. By hand, never in CI, with the venv of fsdp2.py
(PyTorch 2.15.0 from PyPI):

  /work/venv-torch2/bin/python tests/parallel/dtensor_tp.py [--case SUBSTRING ...] [--write-expected]
      [--explain] [--lifetimes] [--events SUBSTRING] [--list]
  /work/venv-torch2/bin/python tests/parallel/dtensor_tp.py --tables | --models

fsdp2.py's runner and result format, by import (fsdp2.main with this module as the driver);
the trace is fsdp2_trace.LabelledTrace with DTensor's names (DTensorTrace below). Each rank builds
the case's block as nn.Modules, applies the plan torchtitan's apply_tp applies
(pytorch/torchtitan torchtitan/models/llama3/infra/parallelize.py at f18e68c6, lines 173-248):

  mlp        ffn_norm (LayerNorm) -> feed_forward.w1 (ColwiseParallel) -> GELU ->
             feed_forward.w2 (RowwiseParallel) -> + x; loss = mean.
  attention  attention_norm -> attention.wq, wk, wv (ColwiseParallel) -> SDPA (the CPU's
             fused kernel, _scaled_dot_product_flash_attention_for_cpu) -> attention.wo
             (RowwiseParallel) -> + x; loss = mean.
  lm         tok_embeddings RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)) ->
             norm SequenceParallel() -> output ColwiseParallel(input_layouts=Shard(1),
             output_layouts=Shard(-1), use_local_output=False) -> cross_entropy under
             loss_parallel() (forward and backward).
  mlp-sbh, attention-sbh
             tp.py's tp-mlp and tp-attention exactly (one fused wqkv split per head, the
             attention written out), in Megatron's [s, b, h], the same styles with the
             sequence at dim 0: tp.py's Megatron layers and DTensor's on the same model.

Plain (no /sp): the block's input is the whole [b, s, h] on every rank, the norm is an ordinary
module, the colwise linear's input Replicate, the rowwise linear's output Replicate (an
all-reduce). /sp: the input is the rank's [b, s/t, h] shard, the norm SequenceParallel(),
PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)) on
feed_forward / attention (the all-gather), the rowwise linear's output Shard(1) (a
reduce-scatter). s = 32, b = 2, h = 128, ffn = 512, 8 heads, V = 256, float32, biases as
tests/parallel/tp.py's Megatron layers have them (the lm's output linear has none), Adam
(torch.optim.Adam, lr 1e-3, for-loop: foreach=False, as tp.py), 2 steps: zero_grad(set_to_none)
-> DATA -> FORWARD -> LOSS -> BACKWARD -> OPTIMIZER_STEP, under one allocator trace per rank.
The numbers are compared with tests/parallel/expected/dtensor_<case>.json to the byte: a change
fails (exit 1). --events SUBSTRING prints rank 0's allocations and frees of the last step whose
op path contains it ("all": every one), named. --tables prints the figures and the side-by-side
with tp.py's Megatron cases from the expected files (no run). memest's estimates against these
files: tests/parallel/dtensor_compare.py (no run; CI). --models writes the memest model
files of the unsharded blocks (expected/models/dtensor-<model>.json, traced by memest's own
tracer from the same modules).
docs/parallelism-truth.md, "10. DTensor tensor parallelism, measured on PyTorch 2.x", accounts
for the figures.

What the trace names (DTensorTrace.name): every functional collective DTensor runs
(`funcol.all_gather_single`, `reduce_scatter_single`, `all_reduce`) is wrapped in a
record_function "funcol::<kind> [<scope>]" and its result labelled "<kind> output [<scope>]";
<scope> is the module running (forward; a record_function "module::<path>" from a pre-hook
prepended before parallelize_module's own input hook to a hook after its output hook) or, in
backward, the module whose forward made the autograd node being run ("<path> backward").
Saved-for-backward tensors are labelled "saved [<scope>]". gloo's own copies are named by
GLOO_COPIES (the "without gloo" figures leave them out: what NCCL would allocate). As in
fsdp2.py the gloo group has one worker thread; each _c10d_functional op DTensor issues is
followed at once by a flush, so that every free is seen on the caller's thread.
"""
import gc
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import fsdp2  # noqa: E402  (puts tests/conformance on the path; torch, the runner)
import fsdp2_trace  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

STEPS = 2
DIMS = {"batch": 2, "seq": 32, "hidden": 128, "ffn": 512, "heads": 8, "vocab": 256}
# model -> its layout: "bsh" is torchtitan's [b, s, h] (the sequence is dim 1:
# Shard(1)), "sbh" Megatron's [s, b, h] (dim 0: Shard(0), SequenceParallel(sequence_dim=0)).
MODELS = {"mlp": "bsh", "attention": "bsh", "lm": "bsh", "mlp-sbh": "sbh", "attention-sbh": "sbh"}

# id -> (world size, parameters). sp: sequence parallelism. The lm is always sequence-parallel
# (torchtitan's plan for the embedding, the final norm and the output has no other form);
# mlp-sbh only (without it the MLP does not depend on the layout: dtensor/mlp/t<T>).
CASES = {}
for _m, _layout in MODELS.items():
    for _sp in ((True,) if _m in ("lm", "mlp-sbh") else (False, True)):
        for _w in (2, 4):
            CASES[f"dtensor/{_m}/t{_w}" + ("/sp" if _sp and _m != "lm" else "")] = (
                _w, {"model": _m, "layout": _layout, "sp": _sp, "optimizer": "adam-for-loop"})


# ---------------------------------------------------------------------------------------------
class FeedForward(nn.Module):
    def __init__(self, h, ffn):
        super().__init__()
        self.w1, self.w2 = nn.Linear(h, ffn), nn.Linear(ffn, h)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class MLPBlock(nn.Module):
    """Either layout: nothing in it depends on which dim is the sequence."""

    def __init__(self, h=DIMS["hidden"], ffn=DIMS["ffn"]):
        super().__init__()
        self.ffn_norm, self.feed_forward = nn.LayerNorm(h), FeedForward(h, ffn)

    def forward(self, x):
        return x + self.feed_forward(self.ffn_norm(x))


class Attention(nn.Module):
    """torchtitan's Attention without rotary embeddings, [b, s, h]: the heads a rank holds follow
    from its share of wq's output (`view(b, s, -1, head_dim)`, as torchtitan writes it); the
    core is F.scaled_dot_product_attention (on the CPU, float32, no mask:
    _scaled_dot_product_flash_attention_for_cpu)."""

    def __init__(self, h=DIMS["hidden"], heads=DIMS["heads"]):
        super().__init__()
        self.head_dim = h // heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(h, h) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        y = F.scaled_dot_product_attention(q, k, v)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


class AttentionSBH(nn.Module):
    """tests/parallel/tp.py's attention as Megatron writes it, [s, b, h]: one fused wqkv whose
    output viewed as [s, b, heads, 3 head_dim] is split into q, k, v (so a rank's rows are its
    heads' q, k and v), the core written out (matmul, / sqrt(head_dim), softmax, matmul). No
    local outlives its last use (tp.py's recorder lets go of each value there too): the scores
    are never named, the context is replaced by its merged copy before wo runs."""

    def __init__(self, h=DIMS["hidden"], heads=DIMS["heads"]):
        super().__init__()
        self.head_dim = h // heads
        self.wqkv, self.wo = nn.Linear(h, 3 * h), nn.Linear(h, h)

    def forward(self, x):
        s, b, _ = x.shape
        hn = self.head_dim
        q, k, v = self.wqkv(x).view(s, b, -1, 3 * hn).split([hn, hn, hn], 3)  # views: saved anyway
        c = torch.matmul(torch.softmax(torch.matmul(q.permute(1, 2, 0, 3), k.permute(1, 2, 3, 0)) / hn ** 0.5, -1),
                         v.permute(1, 2, 0, 3))
        c = c.permute(2, 0, 1, 3).reshape(s, b, -1)
        return self.wo(c)


class AttentionBlock(nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.attention_norm, self.attention = nn.LayerNorm(DIMS["hidden"]), attention

    def forward(self, x):
        return x + self.attention(self.attention_norm(x))


class LM(nn.Module):
    def __init__(self, vocab=DIMS["vocab"], h=DIMS["hidden"]):
        super().__init__()
        self.tok_embeddings, self.norm = nn.Embedding(vocab, h), nn.LayerNorm(h)
        self.output = nn.Linear(h, vocab, bias=False)

    def forward(self, ids):
        return self.output(self.norm(self.tok_embeddings(ids)))


def make_model(name):
    return {"mlp": MLPBlock, "mlp-sbh": MLPBlock, "lm": LM,
            "attention": lambda: AttentionBlock(Attention()),
            "attention-sbh": lambda: AttentionBlock(AttentionSBH())}[name]()


def plan(name, sp):
    """torchtitan's apply_tp, for the block at hand (f18e68c6 parallelize.py:173-248); in the
    sbh layout the same styles with the sequence at dim 0."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel)
    if name == "lm":
        return {"tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
                "norm": SequenceParallel(),
                "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1),
                                          use_local_output=False)}
    seq = 0 if MODELS[name] == "sbh" else 1
    norm, mod, cols, row = {"mlp": ("ffn_norm", "feed_forward", ("w1",), "w2"),
                            "attention": ("attention_norm", "attention", ("wq", "wk", "wv"), "wo"),
                            "attention-sbh": ("attention_norm", "attention", ("wqkv",), "wo")
                            }[name.replace("mlp-sbh", "mlp")]
    out = {}
    if sp:
        out[norm] = SequenceParallel(sequence_dim=seq)
        out[mod] = PrepareModuleInput(input_layouts=(Shard(seq),), desired_input_layouts=(Replicate(),))
    out.update({f"{mod}.{c}": ColwiseParallel() for c in cols})
    out[f"{mod}.{row}"] = RowwiseParallel(output_layouts=Shard(seq)) if sp else RowwiseParallel()
    return out


# ---------------------------------------------------------------------------------------------
def local(t):
    return getattr(t, "_local_tensor", t)


def short(path):
    """An op path as the documents cite it: the innermost module::, the funcol:: wrappers, the
    c10d:: and gloo ops, the optimizer's step and autograd's node, then the first two ops below
    the last of those."""
    parts = path.split(" > ")
    keep, last = [], -1
    for i, q in enumerate(parts):
        if q.startswith("module::"):
            keep = [k for k in keep if not k.startswith("module::")]
            keep.append(q)
            last = i
        elif q.startswith(("funcol::", "c10d::", "gloo:", "Optimizer.")):
            keep.append(q)
            last = i
        elif q.startswith("autograd::engine::evaluate_function: "):
            keep.append(q.split(": ", 1)[1])
            last = i + 1 if i + 1 < len(parts) and parts[i + 1] == keep[-1] else i
    return " > ".join(keep + [q for q in parts[last + 1:last + 3] if q != "-"]) or "-"


# What gloo allocates inside the _c10d_functional ops (the ops are in
# torch/csrc/distributed/c10d/Functional.cpp; gloo's in ProcessGroupGloo.cpp): the all-gather is
# allgather_into_tensor_coalesced (AsyncAllgatherCoalescedWork), the reduce-scatter
# reduce_scatter_tensor_coalesced (a clone of the input, all-reduced, this rank's chunk copied
# out).
GLOO_COPIES = (
    ("c10d::allgather_into_tensor_coalesced_", "gloo all-gather: input-sized flat copy (caller's thread)"),
    ("gloo:all_gather", "gloo all-gather: worker's flat output"),
    ("c10d::reduce_scatter_tensor_coalesced_", "gloo reduce-scatter: clone of the input"),
)


class DTensorTrace(fsdp2_trace.LabelledTrace):
    """fsdp2_trace's labelled trace with DTensor's places: an unlabelled allocation is named by
    the module and functional collective it was made in (short() above)."""

    def name(self, j):
        if self.alloc_label.get(j):
            return " = ".join(self.alloc_label[j])
        op = self._ev[j][3]
        if "gloo:" in op or "c10d::" in op:  # the worker thread's own are roots: no scope
            where = [q for q in op.split(" > ") if q.startswith("funcol::")]
            scope = where[-1].split(" ", 1)[1] if where else ""
            for key, what in GLOO_COPIES:
                if key in op:
                    return f"{what} {scope}".rstrip()
            return fsdp2_trace.gloo_name(op, scope).rstrip()
        ph = (self.alloc_phase.get(j) or "?").split(".")[-1]
        return f"{'activation' if ph in ('FORWARD', 'LOSS') else 'temporary'} [{short(op)}] ({ph.lower()})"

    def lifetimes(self, marks):
        """Every labelled allocation (collective outputs, saved tensors, gradients) and gloo's
        copies on the caller's thread made while one of `marks` lasted, as fsdp2_trace's. The
        gloo worker's own flat all-gather output (made and freed inside `gloo:all_gather` on the
        worker thread, under the caller's profiler state) is in the profiler's result in some
        runs and not in others: left out here; it is never at a peak without gloo's copies."""
        rows = {}
        marks_t = [t for t, _ in self._marks]
        import bisect

        def phase_at(t):
            i = bisect.bisect_right(marks_t, t) - 1
            return self._marks[i][1] if i >= 0 else None
        for j, e in enumerate(self._ev):
            if e[1] <= 0 or self.alloc_phase.get(j) not in marks:
                continue
            nm = self.name(j)
            if not (self.alloc_label.get(j) or nm.startswith("gloo")) or nm == "input" \
                    or e[3].startswith("gloo:"):  # the worker thread's: seen in some runs only
                continue
            f = self.free_at.get(j)
            key = (nm, self.alloc_phase[j], short(e[3]), phase_at(self._ev[f][0]) if f is not None else None,
                   short(self._ev[f][3]) if f is not None else None)
            r = rows.setdefault(key, [0, 0])
            r[0] += e[1]
            r[1] += 1
        return [[k[0], v[0], v[1], *k[1:]] for k, v in rows.items()]


class Probes:
    """Module scopes (forward hooks around parallelize_module's own), the autograd nodes each
    module's forward made (for backward's scope), and DTensor's functional collectives wrapped:
    waited on at once, flushed, labelled. `trace` is the trace of the case running (or None)."""

    def __init__(self):
        self.trace = None
        self.stack = []        # [(scope, first autograd sequence number, record_function)]
        self.node_scope = {}   # id(autograd node) -> scope of the module whose forward made it
        self.outside = "loss"  # the scope outside every module and autograd node: loss, optimizer

    # -- scopes ---------------------------------------------------------------------------------
    @staticmethod
    def _seq():
        """The sequence number the next autograd node made on this thread gets."""
        return torch._C._autograd._get_sequence_nr()

    def attach(self, model, root):
        for name, m in model.named_modules():
            scope = name or root
            m.register_forward_pre_hook(lambda m_, a, s=scope: self._enter(s), prepend=True)
            m.register_forward_hook(lambda m_, a, out, s=scope: self._leave(s, out))

    def _enter(self, scope):
        from torch.autograd.profiler import record_function
        rf = record_function(f"module::{scope}")
        rf.__enter__()
        self.stack.append((scope, self._seq(), rf))

    def _leave(self, scope, out):
        s, start, rf = self.stack.pop()
        assert s == scope, (s, scope)
        rf.__exit__(None, None, None)
        # the nodes made since this module's pre-hook that no inner module claimed (inner
        # modules' hooks ran first); walked through, not stopped at, what inner modules claimed
        todo = [t.grad_fn for t in (out if isinstance(out, (tuple, list)) else (out,))
                if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        seen = set()
        while todo:
            n = todo.pop()
            if n is None or id(n) in seen or n.name() == "torch::autograd::AccumulateGrad" \
                    or n._sequence_nr() < start:
                continue
            seen.add(id(n))
            self.node_scope.setdefault(id(n), scope)
            todo.extend(f for f, _ in n.next_functions)

    def scope(self):
        if self.stack:
            return self.stack[-1][0]
        n = torch._C._current_autograd_node()
        if n is not None:
            return f"{self.node_scope.get(id(n), 'loss')} backward"
        return self.outside

    # -- labels ---------------------------------------------------------------------------------
    def label(self, t, s):
        if self.trace is not None and isinstance(t, torch.Tensor):
            self.trace.label(local(t), s)

    def install(self):
        """funcol's all_gather_single, reduce_scatter_single and all_reduce (what DTensor's
        placements and loss_parallel call) run under "funcol::<kind> [<scope>]" and their result
        is labelled; the _c10d_functional ops they issue are each followed at once by a flush
        (before funcol waits and lets go of the collective's buffers: the gloo worker must have
        dropped its work item first, or the last reference, and the free, would be its own)."""
        import torch.distributed._functional_collectives as funcol
        from torch.autograd.profiler import record_function
        pr = self

        def wrap(kind, orig):
            def f(*a, **k):
                scope = pr.scope()
                with record_function(f"funcol::{kind} [{scope}]"):
                    res = orig(*a, **k)
                    if isinstance(res, funcol.AsyncCollectiveTensor):
                        res = res.wait()
                pr.label(res, f"{kind} output [{scope}]")
                return res
            return f
        funcol.all_gather_single = wrap("all-gather", funcol.all_gather_single)
        funcol.reduce_scatter_single = wrap("reduce-scatter", funcol.reduce_scatter_single)
        funcol.all_reduce = wrap("all-reduce", funcol.all_reduce)

        ns = torch.ops._c10d_functional

        def flushed(orig):
            def f(*a):
                out = orig(*a)
                if pr.trace is not None:  # the group's name is the op's last argument
                    pr.trace.flush(dist.distributed_c10d._resolve_process_group(a[-1]))
                return out
            return f
        for op in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce"):
            setattr(ns, op, flushed(getattr(ns, op)))

        # distribute_tensor at construction: c10d scatter (Shard) and broadcast (Replicate)
        import torch.distributed.tensor.placement_types as placements
        from torch.distributed.device_mesh import DeviceMesh

        def construction(orig):
            def f(*a, **k):
                out = orig(*a, **k)
                if pr.trace is not None:
                    mesh = next(x for x in a if isinstance(x, DeviceMesh))
                    pr.trace.flush(mesh.get_group(k.get("mesh_dim", 0)))
                return out
            return f
        for name in ("mesh_scatter", "mesh_broadcast"):
            setattr(placements, name, construction(getattr(placements, name)))
        return self


PROBES = Probes()


class Saved:
    """Bytes autograd saves in forward + loss, by distinct storage still alive at the end of the
    loss (the conformance rule): parameters left out (their local shards), inputs included,
    wrapped scalars not counted; a DTensor counts its local tensor. Each saved storage is
    labelled "saved [<scope>]"."""

    def __init__(self, model):
        self.params = {fsdp2_trace.storage_key(local(p))[0] for p in model.parameters()}
        self.saved = {}
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)

    def pack(self, t):
        from torch.multiprocessing.reductions import StorageWeakRef
        lt = local(t)
        if lt.dim() == 0 and lt.dtype in (torch.float64, torch.int64) and t.grad_fn is None \
                and not t.requires_grad:
            return t
        ptr, nb, st = fsdp2_trace.storage_key(lt)
        if ptr in self.params or nb == 0:
            return t
        e = self.saved.get(ptr)
        if e is None or e[0].expired():
            self.saved[ptr] = [StorageWeakRef(st), nb]
            PROBES.label(lt, f"saved [{PROBES.scope()}]")
        return t.detach()

    def total(self):
        return sum(e[1] for e in self.saved.values() if not e[0].expired())


def setup(world):
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh("cpu", (world,))


def model_state(model, opt):
    params = list(model.parameters())
    state = [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    return {"parameters": fsdp2.storages(params), "gradients": fsdp2.storages(p.grad for p in params),
            "optimizer_state": fsdp2.storages(state)}


def run_case(rank, world, cid, p, mesh):
    from torch.distributed.tensor.parallel import loss_parallel, parallelize_module
    trace = DTensorTrace()
    PROBES.trace = trace
    b, s, h, V = DIMS["batch"], DIMS["seq"], DIMS["hidden"], DIMS["vocab"]
    # the same data on every rank (a sequence-parallel rank's shard: its own)
    gen = torch.Generator().manual_seed(1000 + (rank if p["sp"] and p["model"] != "lm" else 0))
    ends, saved = [], []
    gc.collect()
    gc.disable()
    with trace:
        trace.mark("CONSTRUCT")
        torch.manual_seed(0)
        model = make_model(p["model"])
        parallelize_module(model, mesh, plan(p["model"], p["sp"]))
        PROBES.attach(model, p["model"])
        for n, prm in model.named_parameters():
            trace.label(local(prm), f"parameter {n}")
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
        trace.mark("0.END")
        for st in range(1, STEPS + 1):
            opt.zero_grad(set_to_none=True)
            PROBES.node_scope.clear()
            trace.mark(f"{st}.DATA")
            if p["model"] == "lm":
                x = torch.randint(0, V, (b, s), generator=gen)
                y = torch.randint(0, V, (b, s), generator=gen)
                trace.label(y, "input")
            else:
                # plain: the whole block input on every rank; sp: the rank's sequence shard
                n = s // world if p["sp"] else s
                x = torch.empty((b, n, h) if p["layout"] == "bsh" else (n, b, h)).normal_(0.0, 0.1, generator=gen)
                y = None
            trace.label(x, "input")
            sv = Saved(model)
            with sv.hooks:
                trace.mark(f"{st}.FORWARD")
                out = model(x)
                trace.mark(f"{st}.LOSS")
                PROBES.outside = "loss"
                if p["model"] == "lm":
                    with loss_parallel():
                        loss = F.cross_entropy(out.flatten(0, 1), y.flatten(0, 1))
                else:
                    loss = out.mean()
                del out  # the loop holds only the loss and the batch across backward
            saved.append(sv.total())
            trace.mark(f"{st}.BACKWARD")
            if p["model"] == "lm":
                with loss_parallel():
                    loss.backward()
            else:
                loss.backward()
            del loss, x, y, sv
            trace.mark(f"{st}.OPTIMIZER_STEP")
            PROBES.outside = "optimizer"
            opt.step()
            for state in opt.state.values():
                for k, v in state.items():
                    if isinstance(v, torch.Tensor):
                        trace.label(local(v), f"optimizer state {k}")
            for n, prm in model.named_parameters():
                if prm.grad is not None:
                    trace.label(local(prm.grad), f"grad {n}")
            ends.append(model_state(model, opt))
            trace.mark(f"{st}.END")
        trace.mark("TEARDOWN")
        alive = [local(x) for x in model.parameters()] + \
            [local(x.grad) for x in model.parameters() if x.grad is not None] + \
            [local(v) for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    PROBES.trace = None
    PROBES.node_scope.clear()
    gc.enable()
    trace.analyse(alive=alive)
    if os.environ.get("FSDP2_EVENTS") and rank == 0:
        dump_events(trace, os.environ["FSDP2_EVENTS"])
    return fsdp2.result(trace, ends, saved, p, steps=STEPS)


def dump_events(trace, substring):
    """--events: rank 0's allocations and frees of the last step whose op path contains
    `substring` ("" or "all": every one), in order: phase, bytes, name, where."""
    for i, (t, nb, ptr, path) in enumerate(trace._ev):
        ph = [m for tm, m in trace._marks if tm <= t]
        if ph and ph[-1].startswith(f"{STEPS}.") and (substring in ("", "all") or substring in path):
            print(f"{ph[-1]:<18} {nb:>+10,} {ptr:>14x}  {trace.name(i) if nb > 0 else '':<60.60} "
                  f"{short(path)}", file=sys.stdout, flush=True)


def write_models():
    """--models: expected/models/dtensor-<model>.json, memest's model file of each unsharded
    block (what the engine is given with a tensor-parallel plan), traced by memest's own tracer
    (client/python/memest/tracer.py, loaded without the package's gRPC stubs) from the module
    the cases parallelize, at batch 2: [b, s, h] inputs (batch dim 0), [s, b, h] (batch dim 1),
    token ids [b, s] with targets [b, s] and cross-entropy for the lm; loss = mean otherwise."""
    import json
    import types
    root = os.path.dirname(os.path.dirname(HERE))
    if "memest" not in sys.modules:  # memest/__init__.py imports the generated gRPC stubs
        pkg = types.ModuleType("memest")
        pkg.__path__ = [os.path.join(root, "client", "python", "memest")]
        sys.modules["memest"] = pkg
    from memest import tracer
    b, s, h, V = DIMS["batch"], DIMS["seq"], DIMS["hidden"], DIMS["vocab"]
    for name, layout in MODELS.items():
        torch.manual_seed(0)
        model = make_model(name)
        if name == "lm":
            out = tracer.trace(model, torch.randint(0, V, (b, s)), target=torch.randint(0, V, (b, s)),
                               loss="cross_entropy")
        else:
            x = torch.randn((b, s, h) if layout == "bsh" else (s, b, h))
            out = tracer.trace(model, x, loss=lambda y: y.mean(), batch_dim=0 if layout == "bsh" else 1)
        path = os.path.join(fsdp2.EXPECTED, "models", f"dtensor-{name}.json")
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
        print(f"wrote {os.path.relpath(path)} ({out.path}; {len(out['ops']['ops'])} ops{'; ' if out.notes else ''}"
              f"{'; '.join(out.notes)})")
    return 0


def _ranks(path):
    import json
    with open(path) as f:
        d = json.load(f)
    return d, [d["ranks"][r["same_as_rank"]] if "same_as_rank" in r else r for r in d["ranks"]]


# (DTensor case, tp.py's Megatron case on the same model): docs/parallelism-truth.md §10
SIDE_BY_SIDE = [(f"dtensor/{d}/t{t}{sp}", f"tp/{m}/t{t}{sp}") for t in (2, 4)
                for d, m, sps in (("mlp", "mlp", ("",)), ("mlp-sbh", "mlp", ("/sp",)),
                                  ("attention-sbh", "attention", ("", "/sp")),
                                  ("mlp", "mlp", ("/sp",)), ("attention", "attention", ("", "/sp")))
                for sp in sps] + [(f"dtensor/lm/t{t}", f"tp/lm/t{t}/sp") for t in (2, 4)]


def tables():
    """--tables: the figures of docs/parallelism-truth.md §10 from the expected files (no run):
    every case (rank 0; every rank measures the same steps), then each DTensor case beside
    tp.py's Megatron case of the same model (PyTorch 1.13's expected files; 2.15 measures the
    MLP and attention cases the same)."""
    short_ph = {"OPTIMIZER_STEP": "step"}
    print("| case | saved | step 1 peak (phase) | steady DATA | FORWARD | LOSS | BACKWARD | OPTIMIZER_STEP "
          "| steady peak with gloo (phase) | P / G / S at end |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for cid in sorted(CASES, key=lambda c: (list(MODELS).index(c.split("/")[1]), c)):
        _, ranks = _ranks(fsdp2.case_file(cid))
        r = ranks[0]
        assert all(x["steps"] == r["steps"] for x in ranks), cid
        s1, s2 = r["steps"][0], r["steps"][-1]
        p1, p2, g2 = s1["phases_without_gloo"], s2["phases_without_gloo"], s2["phases"]
        t1, tg = max(p1, key=p1.get), max(g2, key=g2.get)
        e = s2["end_of_step"]
        print(f"| {cid} | {r['saved_for_backward']:,} | {p1[t1]:,} ({short_ph.get(t1, t1.lower())}) | "
              + " | ".join(f"{p2[k]:,}" for k in fsdp2.PHASES)
              + f" | {g2[tg]:,} ({short_ph.get(tg, tg.lower())}) | {e['parameters']:,} / {e['gradients']:,} / "
              f"{e['optimizer_state']:,} |")
    print()
    print("| DTensor case | Megatron case (tp.py) | saved | DATA | FORWARD | LOSS | BACKWARD (M: with GRAD_SYNC) "
          "| OPTIMIZER_STEP | step peak | live at end |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for dc, mc in SIDE_BY_SIDE:
        d = _ranks(fsdp2.case_file(dc))[1][0]
        m = _ranks(os.path.join(fsdp2.EXPECTED, mc.replace("/", "_") + ".json"))[1][0]
        ds, ms = d["steps"][-1], m["steps"][-1]
        dp, mp = ds["phases_without_gloo"], dict(ms["phases"])
        mp["BACKWARD"] = max(mp["BACKWARD"], mp.pop("GRAD_SYNC", 0))
        cells = [(d["saved_for_backward"], m["saved_for_backward"])] + \
            [(dp[k], mp[k]) for k in fsdp2.PHASES] + [(max(dp.values()), ms["peak"]),
                                                     (ds["live_at_end"], ms["live_at_end"])]
        print(f"| {dc} | {mc} | " + " | ".join(f"{a:,} ({a - b:+,})" for a, b in cells) + " |")
    return 0


if __name__ == "__main__":
    if "--models" in sys.argv[1:]:
        sys.exit(write_models())
    if "--tables" in sys.argv[1:]:
        sys.exit(tables())
    sys.exit(fsdp2.main("dtensor_tp"))
