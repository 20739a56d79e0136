"""run.py --via-tracer: each conformance case as a torch.nn.Module, traced by memest.trace.

The case function is written once against the Recorder (recorder.py). Its record pass keeps a
tape: every op as the torch code it ran (the same closure the measured run calls) with the names
of its inputs and outputs. `CaseModule` replays that tape in `forward` on the tensors it is
given, with the case's parameters and buffers registered on the module (nn.Parameter /
register_buffer, the very tensors the measurement trains), so memest.trace sees parameters as
parameters and records whatever aten ops the torch code runs: nothing of the hand-recorded op
graph reaches memest, only PyTorch's own ops. The module lets go of each tensor where the measured
run does (the plan's `dies_after`: its last use, or the end of the case's `r.frame()`), so the
tensors its Python code holds are the case's, and memest.trace finds them with weak references.

The split between forward and loss is the case's: the module runs the ops before the loss's
first op (the first that reads a target or makes the loss) and returns the last tensor it made;
the loss callable given to memest.trace runs the rest, with the target memest.trace passes in.
Inputs are the case's inputs (role input, their declared batch dim), the target its target.

Batch: memest.trace traces at B and B+1 to find the batch dims; the module re-records the case
at the batch its inputs imply (a case's shapes are a function of the batch), so view shapes and
the like follow the batch as the case's code does.

Checkpointed runs: the ops the case runs under r.checkpoint are replayed under
torch.utils.checkpoint (reentrant, as the measured run), so memest.trace records them as the
model's own checkpoint regions and memest is given no --checkpoint policy.

Not expressible: cases with more than one target, cases whose first op is already the loss
(memest.trace takes one target, applied after forward), and cases that say why not themselves
(cases.Case.tracer: a custom autograd.Function, whose saved tensors and backward the tracer does
not see).
"""
import torch

from recorder import DTYPES, ParamStore, Recorder, _make_leaf


def _safe(name):
    return name.replace(".", "__")


def not_applicable(case, cfg, run):
    """Why the case cannot be run through the tracer, or None."""
    if case.tracer:
        return case.tracer
    targets = [n for n, d in _leaf_roles(run).items() if d == "target"]
    if len(targets) > 1:
        return f"{len(targets)} targets; memest.trace takes one"
    if cfg.training and run.plan["loss_begin"] == 0:
        return "the case's first op is already its loss: no forward to put in a module"
    return None


def _leaf_roles(run):
    roles = {}
    for d in run.model["ops"]["tensors"]:
        r = d["role"]
        if r in ("TENSOR_ROLE_INPUT", "TENSOR_ROLE_TARGET"):
            roles[d["name"]] = "input" if r == "TENSOR_ROLE_INPUT" else "target"
    return roles


class _Tape:
    """The case recorded at one batch size: its tape, plan and leaf shapes."""

    def __init__(self, fn, batch, cfg):
        rec = Recorder(ParamStore(0), training=cfg.training, checkpoint=cfg.checkpoint,
                       checkpoint_k=cfg.checkpoint_k, non_reentrant=cfg.non_reentrant,
                       hold_outputs=cfg.hold_outputs)
        result = fn(rec, batch)
        self.plan = rec.finish(result)
        self.tape = rec.tape
        self.checkpoints = {first: (last, out) for first, last, out in rec.tape_checkpoints}
        self.inputs = [n for n, d in ((d["name"], d) for d in rec.decls) if d["role"] == "TENSOR_ROLE_INPUT"]
        self.shapes = {d["name"]: list(d["shape"]) for d in rec.decls}


class CaseModule(torch.nn.Module):
    """The case's forward as a module (see the module docstring)."""

    def __init__(self, run, cfg):
        super().__init__()
        self._fn, self._cfg, self._batch = run.fn, cfg, run.batch
        self._names = {}
        self.params = torch.nn.ParameterDict()
        for n, p in run.store.params.items():
            self.params[_safe(n)] = p
            self._names[n] = ("params", _safe(n))
        for n, b in run.store.buffers.items():
            self.register_buffer("buf__" + _safe(n), b)
            self._names[n] = ("buffer", "buf__" + _safe(n))
        self._tapes = {b: _Tape(run.fn, b, cfg) for b in (run.batch, run.batch + 1)}
        self.state = {}  # the forward's tensors, for the loss (shared with the loss callable)

    def _tape_for(self, xs):
        """The case recorded at the batch these inputs imply (B or B + 1, the two batches
        memest.trace runs; recorded in __init__, outside the tracer's dispatch mode)."""
        want = [list(x.shape) for x in xs]
        for t in self._tapes.values():
            if [t.shapes[n] for n in t.inputs] == want:
                return t
        raise ValueError(f"no batch size of the case gives inputs of shapes {want}")

    def _tensor(self, name):
        kind, attr = self._names[name]
        return self.params[attr] if kind == "params" else getattr(self, attr)

    def _run(self, vals, ops, checkpoints=None, start=0, dies_after=None):
        """Runs tape entries `ops` (the case's ops from `start` on) on `vals`, letting go of each
        tensor where the measured run does (`dies_after`, the plan's: at its last use, or its
        frame's end), so that the module's Python references are the case's; a range in
        `checkpoints` ({first: (last, output)}) runs under torch.utils.checkpoint, taking the
        tensors it reads from outside and returning its output, as the measured run does."""
        checkpoints = checkpoints or {}
        dies_after = dies_after or {}

        def release(k):
            for n in dies_after.get(start + k, ()):
                vals.pop(n, None)
        i = 0
        while i < len(ops):
            if i in checkpoints:
                last, out_name = checkpoints[i]
                region = ops[i:last + 1]
                made = {n for _, _, outs in region for n in outs}
                reads = [n for _, ins, _ in region for n in ins if n not in made and n in vals]
                reads = list(dict.fromkeys(reads))

                def run(*ts, region=region, reads=reads, out_name=out_name, first=start + i):
                    local = dict(zip(reads, ts))
                    self._run(local, region, start=first, dies_after=dies_after)
                    return local[out_name]

                import torch.utils.checkpoint as tcp
                vals[out_name] = tcp.checkpoint(run, *[vals[n] for n in reads],
                                                use_reentrant=not self._cfg.non_reentrant)
                for k in range(i, last + 1):
                    release(k)
                i = last + 1
                continue
            fn, ins, outs = ops[i]
            args = [vals[n] if n in vals else self._tensor(n) for n in ins]
            out = fn(*args)
            del args
            got = list(out) if isinstance(out, (tuple, list)) else [out]
            del out
            for n, t in zip(outs, got):
                vals[n] = t
            del got
            release(i)
            i += 1

    def forward(self, *xs):
        t = self._tape_for(xs)
        vals = dict(zip(t.inputs, xs))
        lb = t.plan["loss_begin"]
        ops = t.tape if lb < 0 else t.tape[:lb]
        self._run(vals, ops, t.checkpoints, dies_after=t.plan["dies_after"])
        self.state = {"vals": vals, "tape": t}
        if lb < 0:  # inference: the case's result
            res = [vals[n] for n in t.plan["result"]]
            return res[0] if len(res) == 1 else tuple(res)
        last = ops[-1][2][0] if ops else t.inputs[0]
        return vals[last]


def trace_case(run, cfg):
    """memest.trace of the case (its measured parameters, its inputs and target at its batch)."""
    import memest

    mod = CaseModule(run, cfg)
    roles = _leaf_roles(run)
    decl = {d["name"]: d for d in run.model["ops"]["tensors"]}
    gen = torch.Generator().manual_seed(0)
    inputs, bds, target = [], [], None
    for name, (shape, dtype, high) in run.plan["leaves"].items():
        t = _make_leaf(shape, dtype, "randn", gen, high)
        bd = decl[name].get("batchDim", 0) if t.dim() > 0 else -1
        if roles[name] == "target":
            target = t
        else:
            inputs.append(t)
            bds.append(bd)
    # Leaves in the order the case declares its inputs (the module's positional arguments).
    order = _Tape(run.fn, run.batch, cfg).inputs
    by_name = dict(zip([n for n in run.plan["leaves"] if roles[n] == "input"], zip(inputs, bds)))
    inputs = [by_name[n][0] for n in order]
    bds = [by_name[n][1] for n in order]
    tgt_name = next((n for n, r in roles.items() if r == "target"), None)

    def loss(out, tgt=None):
        st = mod_state()
        vals, t = st["vals"], st["tape"]
        if tgt_name is not None:
            vals[tgt_name] = tgt
        lb = t.plan["loss_begin"]
        holder["module"]._run(vals, t.tape[lb:], start=lb, dies_after=t.plan["dies_after"])
        return vals[t.plan["result"][0]]

    # memest.trace runs a deep copy of the module: the loss reads the state of the copy that ran.
    holder = {"module": mod}
    orig_forward = CaseModule.forward

    def mod_state():
        return holder["module"].state

    class _Traced(CaseModule):
        def forward(self, *xs):
            holder["module"] = self
            return orig_forward(self, *xs)

    mod.__class__ = _Traced
    return memest.trace(mod, tuple(inputs), target=target if cfg.training else None,
                        loss=loss if cfg.training else None, batch_dim=bds, training=cfg.training)


__all__ = ["CaseModule", "trace_case", "not_applicable", "DTYPES"]
