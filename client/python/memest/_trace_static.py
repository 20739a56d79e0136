"""Static tensors of a trace: what the forward makes without reading the graph.

A tensor is static when nothing of the graph (inputs, parameters, activations) flows into it:
module buffers, tensors made by factories (torch.ones, arange, rand, zeros_like(x): a *_like or
new_* factory reads only its argument's shape), and anything computed from those alone (a
causal mask cut from a buffer or built from arange and triu; rotary tables from inv_freq; a
dropout-like noise drawn in forward). The ops that make them are not recorded as they run (many
have no memest rule, and most of them never matter); each static tensor remembers how it came to
be, and when an op of the graph reads one, it enters the graph as what it really is:

* a view of a buffer or of another static tensor (slice, view, expand, transpose, ...): the view
  ops are recorded then, from their base (a buffer: nothing is allocated; `self.cos[:t]` is a
  slice of the buffer, not a copy of it);
* a tensor of its own (a mask, a table computed in forward, a factory's result): a `full` op
  (memest's factory: a fresh allocation of its shape and dtype, no gradient) at the point the
  graph first reads it, so it is an activation of the forward, freed after its last use, or kept
  as saved for backward when an op saves it (masked_fill's mask);
* a tensor the trace never saw made (a tensor attribute of the module that is not a registered
  buffer): module state, declared as a buffer "const.<n>". Not what torch.tensor(...) makes in
  forward, which no dispatched op (or only lift_fresh) shows: a tensor of the forward.

Static tensors whose shape follows the batch (an attention mask [B, 1, 1, T] made from a ones
[B, T]) are rescaled by the engine: the tracer marks their batch dim (attrs.batch_dim).
"""
import contextlib
import weakref

import torch

try:
    from . import _aten_map
except ImportError:  # loaded on its own, outside the memest package
    import _aten_map

# Handlers whose result shares its input's storage (their memest kinds allocate nothing).
VIEW_KEYS = {
    "detach.default", "alias.default", "lift_fresh.default", "_unsafe_view.default",
    "view.default", "_reshape_alias.default", "t.default", "transpose.int", "permute.default",
    "expand.default", "unsqueeze.default", "squeeze.dim", "squeeze.default", "slice.Tensor",
    "select.int", "split.Tensor", "split_with_sizes.default", "unbind.int",
}
# Factories that read only their argument's shape and dtype (never its values).
SHAPE_FACTORIES = {
    "empty_like.default", "zeros_like.default", "ones_like.default", "full_like.default",
    "rand_like.default", "randn_like.default", "randint_like.default", "new_empty.default",
    "new_zeros.default", "new_ones.default", "new_full.default", "new_empty_strided.default",
}


class _View:
    """A static view: the aten op that made it, to be recorded when the graph reads it. It
    holds its base (as the view itself does) but not its outputs (weak references): the trace
    must not keep alive what it watches (_trace_lifetimes.py)."""

    __slots__ = ("func", "key", "args", "kwargs", "outs", "done")

    def __init__(self, func, key, args, kwargs, outs):
        self.func, self.key, self.args, self.kwargs = func, key, args, kwargs
        self.outs = [weakref.ref(o) for o in outs]
        self.done = False

    def live_outs(self):
        """The outputs, or None when one of them has died (a split whose other parts are gone)."""
        outs = [r() for r in self.outs]
        return None if any(o is None for o in outs) else outs


class _Fresh:
    """A static tensor with storage of its own, made by `op`."""

    __slots__ = ("op",)

    def __init__(self, op):
        self.op = op


class Statics:
    def __init__(self, tracer):
        self.tr = tracer
        self.made = {}  # id(tensor) -> _View or _Fresh

    def is_static(self, t):
        i = id(t)
        if i in self.made:
            return True
        tr = self.tr
        name = tr._names.get(i)
        if name is not None:
            return tr._roles.get(name) == "buffer"
        # never seen: a constant (a tensor held back for a handler is of the graph)
        return i not in tr._internal and i not in tr._noise and i not in tr._deferred

    def _seen(self, t):
        return id(t) in self.made or id(t) in self.tr._names

    def forget(self, oid):
        """The tensor with id `oid` died (its id may be reused)."""
        self.made.pop(oid, None)

    def absorb(self, func, key, args, kwargs, ins, outs):
        """True when the op makes static tensors (it then is not recorded now)."""
        if key in SHAPE_FACTORIES:
            statics = True
        else:
            statics = all(self.is_static(t) for t in ins)
        if not statics:
            return False
        in_place = func.overloadpacket.__name__.endswith("_")
        view = _View(func, key, args, kwargs, outs) if key in VIEW_KEYS and ins else None
        if key == "lift_fresh.default" and ins and not self._seen(ins[0]):
            view = None  # torch.tensor(...) in forward: made there (in C++, not dispatched)
        for o in outs:
            if in_place and ins and o is ins[0]:
                continue  # the same tensor, still static (BatchNorm's num_batches_tracked += 1)
            self.tr.life.watch(o)
            if id(o) in self.made or id(o) in self.tr._names:
                continue
            if view is not None:
                self.made[id(o)] = view  # one record for all the outputs of a split
            else:
                self.made[id(o)] = _Fresh(self.tr._current)
        return True

    def name_of(self, t):
        """The graph name of static tensor `t`, recording what makes it; None when `t` is not a
        static tensor the trace saw made."""
        rec = self.made.get(id(t))
        if rec is None:
            return None
        tr = self.tr
        saved = tr._current
        try:
            if isinstance(rec, _View):
                outs = rec.live_outs()
                if not rec.done and outs is not None:
                    rec.done = True
                    tr._current = f"aten.{rec.key}"
                    out = outs[0] if len(outs) == 1 else tuple(outs)
                    _aten_map.HANDLERS[rec.key](tr, rec.args, rec.kwargs, out)
                name = tr._names.get(id(t))
                if name is None:  # a multi-output view whose handler left this one unnamed
                    del self.made[id(t)]
                    self.made[id(t)] = _Fresh(f"aten.{rec.key}")
                    return self.name_of(t)
                return name
            tr._current = rec.op
            dt = _aten_map.DTYPE_NAMES.get(t.dtype)
            if dt is None:
                tr.unsupported(f"a tensor of dtype {t.dtype} made in forward")
            tr.emit("full", [], [t], {"shape": list(t.shape), "dtype": dt}, shape_attr="shape")
            return tr._names[id(t)]
        finally:
            tr._current = saved


@contextlib.contextmanager
def tensors_made_in_forward(tracer):
    """While recording, what torch.tensor(...) returns is a static tensor of the forward (a
    `full` where the graph reads it): built in C++, it reaches the dispatcher through no op at
    all on the meta device (HF OPT's `torch.tensor(finfo.min, device=...)`), and would otherwise
    be taken for module state."""
    original = torch.tensor

    def tensor(*args, **kwargs):
        t = original(*args, **kwargs)
        if not tracer.paused and id(t) not in tracer._names:
            tracer.life.watch(t)
            tracer.statics.made[id(t)] = _Fresh("torch.tensor")
        return t

    torch.tensor = tensor
    try:
        yield
    finally:
        torch.tensor = original


def batch_attr(kind, attrs, in_shape, va, vb, batch):
    """For an op whose `shape` attribute differs between the traces at `batch` and batch + 1 in
    exactly one dim: the attributes that let the engine rescale it, or None when it cannot.
    view / reshape: -1 there (inferred from the size). expand: -1 where the input has the dim
    already; where the dim is new or expanded from 1, the batch itself, marked by batch_dim.
    full: the batch, marked by batch_dim."""
    diff = [j for j in range(len(va)) if va[j] != vb[j]]
    if len(diff) != 1:
        return None
    d = diff[0]
    out = dict(attrs)
    if kind in ("view", "reshape"):
        out["shape"] = [(-1 if j == d else x) for j, x in enumerate(va)]
        return out
    if kind == "expand":
        off = len(va) - len(in_shape)
        if d >= off and in_shape[d - off] == va[d]:
            out["shape"] = [(-1 if j == d else x) for j, x in enumerate(va)]
            return out
    if kind in ("expand", "full") and va[d] == batch and vb[d] == batch + 1:
        out["batch_dim"] = d
        return out
    return None
