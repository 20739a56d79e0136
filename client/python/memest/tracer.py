"""memest.trace: a torch.nn.Module turned into memest's model description (an op graph).

`trace(module, example_inputs, ...)` runs the module once on the example inputs under a
TorchDispatchMode, which sees the aten ops that actually run below autograd, and records each
in memest's op vocabulary (engine/rules/op_rules.h; the mapping is in `_aten_map.py`): its
inputs and outputs (by tensor identity: views and in-place results are tracked as their own
tensors), their shapes and dtypes, and the scalar arguments memest's rule reads. Parameters
and buffers are declared by their names in `named_parameters()` / `named_buffers()`; each op
carries the module path it ran in (`blocks.3.attn`), and repeated children of an
nn.ModuleList / nn.Sequential are listed as `blocks`. After the forward, the requested loss is
applied in the same mode.

The trace records structure only: it never measures memory; every number comes from the engine.

Where it runs: first on the meta device (a deep copy of the module moved to "meta", meta
inputs: no real memory or compute); when an op has no meta kernel in this PyTorch version, on
real tensors (a deep copy on the CPU, so the caller's module is untouched). The returned
dict's `path` attribute says which ("meta" or "real").

Batch sizes: the module is traced twice, at the example batch B and at B + 1. Every dim that
differs between the two is a batch dim: shape attributes (view, reshape, expand) get -1 there,
or, where -1 cannot say it (a size-1 dim expanded to the batch, a tensor made at the batch's
size), keep B and name the dim with attrs.batch_dim; `tracedBatch` is set to B so the engine can
rescale the graph to another batch size. When
the two traces differ in a way the engine cannot rescale (a batch-dependent scalar, a split of
the batch dim), or the module does not run at B + 1 (a reshape to a fixed size, a target whose
first dim is not the batch), `tracedBatch` is left out, with a warning: the graph is then valid
at B only.

Lifetimes: every tensor the trace records is watched with a weak reference, so the graph also
says when the module's Python code lets go of each one (`held`: a local that outlives the
tensor's last use, until an op) and what the module returned (`outputs`); see
_trace_lifetimes.py. The tracer keeps no recorded tensor alive itself.

Refused (UnsupportedOp, naming the aten op and the module scope): any op of the graph that the
engine has no rule for, and any op the tracer fails to map (never another exception). Never
silently dropped. Elided: ops that allocate nothing and have no memest kind (detach, alias,
lift_fresh). Static tensors, made without reading the graph (buffers, factories, masks and tables
computed from them, in-place bookkeeping on buffers such as BatchNorm's num_batches_tracked += 1),
are not recorded as they are made; an op of the graph that reads one gets it as a view of its
buffer or as a `full` op (a tensor of the forward), see _trace_static.py. Tied weights are
declared once. A float input that requires grad keeps requiring it (`requiresGrad`).
"""
import contextlib
import copy
import inspect
import json
import warnings

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from memest.model_json import attr_value

try:
    from . import (_aten_map, _trace_clones, _trace_fastpath, _trace_fused, _trace_lifetimes,
                   _trace_linear, _trace_random, _trace_static)
    from ._trace_leaves import _module_on_meta
    from ._trace_static import Statics, batch_attr
except ImportError:  # loaded on its own, outside the memest package
    import _aten_map
    import _trace_clones
    import _trace_fastpath
    import _trace_fused
    import _trace_lifetimes
    import _trace_linear
    import _trace_random
    from _trace_leaves import _module_on_meta
    import _trace_static
    from _trace_static import Statics, batch_attr

__all__ = ["trace", "save", "UnsupportedOp", "TracedModel"]

_ROLE = {
    "input": "TENSOR_ROLE_INPUT",
    "target": "TENSOR_ROLE_TARGET",
    "parameter": "TENSOR_ROLE_PARAMETER",
    "buffer": "TENSOR_ROLE_BUFFER",
    "activation": "TENSOR_ROLE_ACTIVATION",
}
_SHAPE_ATTR_KINDS = ("view", "reshape", "expand")


class UnsupportedOp(Exception):
    """An aten op that memest's engine has no rule for (or an argument form it does not take).

    Attributes: `op` (the aten name, e.g. "aten.cumsum.default"), `scope` (the module path it
    ran in, "" for the top level), `detail` (what about it is unsupported, or None)."""

    def __init__(self, op, scope, detail=None):
        self.op = op
        self.scope = scope
        self.detail = detail
        where = f" in module '{scope}'" if scope else " at the top level"
        what = f" ({detail})" if detail else ""
        super().__init__(f"memest has no rule for {op}{what}{where}; the op graph cannot be "
                         f"traced without it")


class TracedModel(dict):
    """The traced model: a dict in the proto JSON mapping of memest.v1.Model ({"ops": {...}}),
    with `path` ("meta" or "real": where the trace ran) and `notes` (what the trace assumed)."""

    path = None
    notes = ()


class _MetaUnsupported(Exception):
    pass


def _key(func):
    return f"{func.overloadpacket.__name__}.{func._overloadname}"


def _aten_name(func):
    return f"aten.{_key(func)}"


def _flat_tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for e in x for t in _flat_tensors(e)]
    return []


class _Recording(TorchDispatchMode):
    """One forward + loss, recorded. Tensors are known by id(); the tracer forgets an id when
    its object dies (_trace_lifetimes.Lifetimes), so that a reused id is never mistaken."""

    def __init__(self, tracer):
        super().__init__()
        self.tr = tracer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.tr.paused:
            self.tr.record_op(func, args, kwargs, out)
        return out


class _Tracer:
    def __init__(self, module, meta):
        self.meta = meta
        self._keep = []          # declared leaves (the module and the caller hold them anyway)
        self._names = {}         # id(tensor) -> graph name
        self.statics = Statics(self)  # tensors made without reading the graph (_trace_static)
        self._internal = {}      # id -> aten op: outputs memest folds into its op (stats, masks)
        self._noise = {}         # id -> dropout noise state {"x": tensor, "keep": float}
        self._deferred = {}      # id -> (aten name, record()): ops recorded when first read
        self._shapes = {}        # name -> (shape list, dtype name)
        self._roles = {}
        self.decls = []
        self.ops = []
        self._n_const = 0
        self._n_fresh = 0
        self.scope_stack = []
        self._current = None     # aten name of the op being recorded (for errors)
        self.paused = 0          # > 0: ops run without being recorded (inside a fused op)
        self.region = None       # the torch.utils.checkpoint call being recorded (an id)
        self.region_reentrant = {}  # region id -> use_reentrant
        self.life = _trace_lifetimes.Lifetimes(lambda: len(self.ops), self._forget)
        self._params = {}
        for name, p in module.named_parameters():
            self._declare(p, name, "parameter", frozen=not p.requires_grad)
        for name, b in module.named_buffers():
            if b is not None and id(b) not in self._names:
                self._declare(b, name, "buffer")

    def _forget(self, oid):
        """The object with id `oid` died: its id may be reused from now on."""
        self._names.pop(oid, None)
        self.statics.forget(oid)
        self._internal.pop(oid, None)
        self._noise.pop(oid, None)
        self._deferred.pop(oid, None)
        _trace_random.forget(self, oid)

    # ------------------------------------------------------------ names
    @property
    def scope(self):
        return self.scope_stack[-1] if self.scope_stack else ""

    def _declare(self, t, name, role, batch_dim=None, frozen=False, requires_grad=False):
        self._keep.append(t)
        self._names[id(t)] = name
        dt = _aten_map.DTYPE_NAMES.get(t.dtype)
        if dt is None:
            raise UnsupportedOp(f"tensor of dtype {t.dtype}", self.scope, f"'{name}'")
        self._shapes[name] = (list(t.shape), dt)
        self._roles[name] = role
        d = {"name": name, "shape": list(t.shape), "dtype": dt, "role": _ROLE[role]}
        if batch_dim is not None and batch_dim != 0:
            d["batchDim"] = batch_dim
        if frozen:
            d["frozen"] = True
        if requires_grad:  # an input that requires grad (its gradient is computed and kept)
            d["requiresGrad"] = True
        self.decls.append(d)
        return name

    def fresh_name(self, prefix):
        self._n_fresh += 1
        return f"{prefix}_{len(self.ops)}_{self._n_fresh}"

    def _name_of(self, t):
        """Graph name of an input tensor (a constant read by the graph becomes a buffer)."""
        if isinstance(t, str):
            return t
        n = self._names.get(id(t))
        if n is not None:
            return n
        deferred = self._deferred.pop(id(t), None)
        if deferred is not None:  # recorded now, before the op that reads it
            if deferred["name"] is None:
                current, self._current = self._current, deferred["aten"]
                deferred["name"] = deferred["record"]()
                self._current = current
            self._names[id(t)] = deferred["name"]
            self.life.name(t, deferred["name"])
            return deferred["name"]
        if id(t) in self._internal:
            self.unsupported(f"an op reading the internal output of {self._internal[id(t)]}")
        if id(t) in self._noise:
            self.unsupported("dropout noise used other than by mul")
        n = self.statics.name_of(t)  # a view of a buffer, or a tensor made in forward
        if n is not None:
            return n
        # A tensor the trace never saw made (a tensor attribute that is not a registered
        # buffer): module state, declared as a buffer.
        self._n_const += 1
        return self._declare(t, f"const.{self._n_const}", "buffer")

    def scalar_of(self, v):
        """The Python number of a scalar operand (a number, or a wrapped 0-dim CPU tensor that
        the graph does not know), else None."""
        if isinstance(v, bool):
            return float(v)
        if isinstance(v, (int, float)):
            return float(v)
        if (isinstance(v, torch.Tensor) and v.dim() == 0 and id(v) not in self._names
                and v.device.type == "cpu"):
            return float(v.item())
        return None

    def _is_graph(self, t):
        return (id(t) in self._names or id(t) in self._internal or id(t) in self._noise
                or id(t) in self._deferred)

    # ------------------------------------------------------------ emitting
    def unsupported(self, detail=None):
        raise UnsupportedOp(self._current, self.scope, detail)

    def alias(self, out, x):
        self.life.watch(out)
        if isinstance(x, torch.Tensor) and id(x) in self._deferred:  # still held back
            self._deferred[id(out)] = self._deferred[id(x)]
            return
        if isinstance(x, torch.Tensor) and id(x) in self._internal and id(x) not in self._names:
            # a view of an output memest folds into its op (group_norm's detached mean/rstd,
            # which autograd saves): folded too
            self._internal[id(out)] = self._internal[id(x)]
            return
        self._names[id(out)] = self._name_of(x)
        self.life.name(out, self._names[id(out)])

    def defer(self, t, record, info=None):
        """Records the op that made `t` only when an op of the graph reads `t` (or an alias of
        it): `record()` (which emits it and returns its output's name) runs then, first. Until
        then `t` is held back, with `info` for handlers that fold it into another op
        (embedding_bag takes the offsets an arange made as its bag size). Nothing here keeps
        `t` alive."""
        self.life.watch(t)
        self._deferred[id(t)] = {"aten": self._current, "record": record, "name": None,
                                 "info": info}

    def deferred_info(self, t):
        """The `info` of a held-back tensor (or of an alias of one), else None."""
        d = self._deferred.get(id(t)) if isinstance(t, torch.Tensor) else None
        return d["info"] if d is not None else None

    def internal(self, outs):
        for o in outs:
            if isinstance(o, torch.Tensor):
                self.life.watch(o)
                self._internal[id(o)] = self._current

    def emit(self, kind, inputs, outputs, attrs, shape_attr=None, out_shapes=None):
        in_names = [self._name_of(t) for t in inputs]
        i = len(self.ops)
        out_names = []
        for j, o in enumerate(outputs):
            if isinstance(o, str):
                nm = o
                shape, dtype = out_shapes[nm]
            else:
                nm = f"{kind}_{i}" + (f".{j}" if len(outputs) > 1 else "")
                shape, dtype = list(o.shape), o.dtype
                self._names[id(o)] = nm  # an in-place result takes the new name from here on
                self.life.name(o, nm)
                self._internal.pop(id(o), None)
                self.statics.forget(id(o))  # written by an op of the graph: no longer static
            dt = _aten_map.DTYPE_NAMES.get(dtype)
            if dt is None:
                self.unsupported(f"output dtype {dtype}")
            self._shapes[nm] = (list(shape), dt)
            self._roles[nm] = "activation"
            out_names.append(nm)
        op = {"kind": kind, "inputs": in_names, "outputs": out_names}
        if attrs:
            op["attrs"] = dict(attrs)
        if self.scope:
            op["scope"] = self.scope
        op["_shape_attr"] = shape_attr
        op["_aten"] = self._current
        op["_seq"] = i  # its index as recorded (fusions drop ops; lifetimes count these)
        if self.region is not None:
            op["_checkpoint"] = self.region
        self.ops.append(op)

    def record_sdpa(self, q, k, v, attn_mask, dropout_p, is_causal, out):
        """F.scaled_dot_product_attention as one op: PyTorch 2.x runs a fused kernel for it
        (flash or memory-efficient; on the CPU flash), which the meta device would not show."""
        self._current = "scaled_dot_product_attention"
        inputs = [q, k, v] + ([attn_mask] if isinstance(attn_mask, torch.Tensor) else [])
        for t in inputs + [out]:
            self.life.watch(t)
        attrs = {"fused": 1, "is_causal": int(bool(is_causal))}
        if dropout_p:
            attrs["dropout_p"] = float(dropout_p)
        self.emit("scaled_dot_product_attention", inputs, [out], attrs)

    # ------------------------------------------------------------ recording
    def record_op(self, func, args, kwargs, out):
        """record(), where any failure to map the op is an UnsupportedOp naming it and its
        scope: the tracer never fails with another exception on an op it was given."""
        try:
            self.record(func, args, kwargs, out)
        except UnsupportedOp:
            raise
        except Exception as e:
            raise UnsupportedOp(self._current or _aten_name(func), self.scope,
                                f"the tracer could not map its arguments: {type(e).__name__}: {e}") from e

    def record(self, func, args, kwargs, out):
        key = _key(func)
        self._current = _aten_name(func)
        ins = _flat_tensors(list(args) + list(kwargs.values()))
        outs = _flat_tensors(out)
        for t in ins + outs:
            self.life.watch(t)

        if self._dropout_pattern(key, args, kwargs, out):
            return
        if _trace_random.stochastic_depth(self, key, args, kwargs, out):
            return
        if _trace_linear.bias_add(self, key, args, kwargs, out):
            return
        # Made without reading the graph (factories, masks cut from buffers, bookkeeping on a
        # buffer, fills of a constant): recorded when, and as what, an op of the graph reads it.
        # An arange with a step is F.embedding_bag's offsets: held back for embedding_bag.
        if not _aten_map.is_stepped_arange(key, args) and \
                self.statics.absorb(func, key, args, kwargs, ins, outs):
            return
        handler = _aten_map.HANDLERS.get(key)
        if handler is None:
            self.unsupported()
        handler(self, args, kwargs, out)

    def _dropout_pattern(self, key, args, kwargs, out):
        """PyTorch 1.13's CPU dropout: noise = empty_like(x).bernoulli_(1-p).div_(1-p);
        out = x * noise. Recorded as one dropout op."""
        if key == "empty_like.default" and id(args[0]) in self._names:
            self.life.watch(out)
            self._noise[id(out)] = {"x": id(args[0]), "keep": None, "scaled": False}
            return True
        if key == "bernoulli_.float" and id(args[0]) in self._noise:
            # p is left out of args when it is the schema's default (0.5: nn.Dropout(0.5))
            self._noise[id(args[0])]["keep"] = float(_aten_map._arg(args, kwargs, 1, "p", 0.5))
            return True
        if key == "div_.Scalar" and id(args[0]) in self._noise:
            st = self._noise[id(args[0])]
            if st["keep"] is None or abs(float(args[1]) - st["keep"]) > 1e-12:
                self.unsupported("a dropout-like pattern with an unexpected scale")
            st["scaled"] = True
            return True
        if key in ("mul.Tensor", "mul_.Tensor") and len(args) == 2:  # mul_: Dropout(inplace=True)
            a, b = args
            for x, n in ((a, b), (b, a)):
                st = self._noise.get(id(n)) if isinstance(n, torch.Tensor) else None
                if st is not None and st["scaled"] and st["x"] == id(x):
                    attrs = {"p": 1.0 - st["keep"]}
                    if key == "mul_.Tensor":
                        attrs["inplace"] = 1
                    self.emit("dropout", [x], [out], attrs)
                    return True
        return False


# ---------------------------------------------------------------- module scopes and blocks

class _ScopeHooks:
    def __init__(self, root, tracer):
        self.paths = {id(m): name for name, m in root.named_modules() if name}
        self.tracer = tracer
        self.handles = []

    def __enter__(self):
        reg_pre = torch.nn.modules.module.register_module_forward_pre_hook
        reg_post = torch.nn.modules.module.register_module_forward_hook
        self.handles = [reg_pre(self._pre), reg_post(self._post)]
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()

    def _pre(self, module, inputs):
        p = self.paths.get(id(module))
        if p is not None:
            self.tracer.scope_stack.append(p)

    def _post(self, module, inputs, output):
        p = self.paths.get(id(module))
        if p is not None and self.tracer.scope_stack and self.tracer.scope_stack[-1] == p:
            self.tracer.scope_stack.pop()


def _blocks(module, scopes_used):
    """Children of the nn.ModuleList / nn.Sequential with the most repeated children of one
    class (at least two), in order, that ran ops."""
    best = []
    for name, m in module.named_modules():
        if not isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        kids = list(m.named_children())
        if len(kids) < 2 or len({type(c) for _, c in kids}) != 1:
            continue
        if isinstance(kids[0][1], (torch.nn.ModuleList, torch.nn.Sequential)) or \
                not any(True for _ in kids[0][1].children()):
            continue  # blocks are modules with their own children (layers of a block)
        paths = [f"{name}.{k}" if name else k for k, _ in kids]
        ran = [p for p in paths if any(s == p or s.startswith(p + ".") for s in scopes_used)]
        if len(ran) > len(best):
            best = ran
    return best if len(best) >= 2 else []


# ---------------------------------------------------------------- one recording

def _input_names(module, n):
    try:
        params = [p for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    if len(params) >= n:
        return [p.name for p in params[:n]]
    return ["input"] if n == 1 else [f"input{i}" for i in range(n)]


def _first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        if isinstance(out.get("logits"), torch.Tensor):
            return out["logits"]
        vals = list(out.values())
    elif isinstance(out, (list, tuple)):
        vals = list(out)
    else:
        vals = [getattr(out, "logits", None)]
    for v in vals:
        if isinstance(v, torch.Tensor):
            return v
    raise TypeError(f"the module's output {type(out).__name__} holds no tensor to apply a loss to")


def _make_target(out, loss, target, device, batch):
    """The target tensor for the loss (on `device`), or None."""
    if target is not None:
        t = target
        if isinstance(t, torch.Tensor):
            if batch is not None and t.dim() > 0 and t.shape[0] != batch[1]:
                t = _resize_batch(t, 0, batch[1])
            return t.to(device)
        return t
    if loss == "cross_entropy":
        shape = list(out.shape[:-1]) if out.dim() > 2 else list(out.shape[:1])
        n_classes = out.shape[-1] if out.dim() > 2 else out.shape[1]
        if device == "meta":
            return torch.empty(shape, dtype=torch.int64, device="meta")
        return torch.randint(0, n_classes, shape, dtype=torch.int64)
    if loss == "mse":
        if device == "meta":
            return torch.empty(out.shape, dtype=out.dtype, device="meta")
        return torch.randn(out.shape, dtype=out.dtype)
    return None


def _apply_loss(out, loss, tgt):
    if loss == "cross_entropy":
        if out.dim() > 2:  # language-model logits [.., V]: classes in the last dim
            return F.cross_entropy(out.reshape(-1, out.shape[-1]), tgt.reshape(-1))
        return F.cross_entropy(out, tgt)
    if loss == "mse":
        return F.mse_loss(out, tgt)
    if loss == "sum":
        return out.sum()
    if callable(loss):
        return loss(out, tgt) if tgt is not None else loss(out)
    raise ValueError(f"loss must be 'cross_entropy', 'mse', 'sum', a callable or None, got {loss!r}")


def _resize_batch(t, dim, n):
    """`t` with its `dim` resized to n (rows repeated cyclically), same device and dtype."""
    if t.device.type == "meta":
        shape = list(t.shape)
        shape[dim] = n
        return torch.empty(shape, dtype=t.dtype, device="meta")
    idx = torch.arange(n) % t.shape[dim]
    return t.index_select(dim, idx)


@contextlib.contextmanager
def _checkpoints_as_regions(tracer):
    """While recording, torch.utils.checkpoint runs its function straight through, and the ops
    it records are marked as one checkpoint region (memest then schedules the region as
    checkpointed: only its inputs kept, recomputed in backward). Reentrant calls go through
    CheckpointFunction.apply; non-reentrant ones through _checkpoint_without_reentrant (1.13) or
    the _checkpoint_without_reentrant_generator(_impl) that checkpoint() steps around the
    function (2.x). A checkpoint inside a checkpoint belongs to the outer region."""
    from torch.utils import checkpoint as cp

    @contextlib.contextmanager
    def region(reentrant):
        if tracer.region is not None:
            yield
            return
        tracer.region = len(tracer.region_reentrant)
        tracer.region_reentrant[tracer.region] = reentrant
        try:
            yield
        finally:
            tracer.region = None

    def apply(function, preserve_rng_state, *args):
        with region(True):
            return function(*args)

    def without_reentrant(function, preserve_rng_state=True, *args):  # 1.13
        with region(False):
            return function(*args)

    def generator(*args, **kwargs):  # 2.x: checkpoint() runs the function between two next()s
        with region(False):
            yield

    patches = [(cp.CheckpointFunction, "apply", staticmethod(apply))]
    for name, fn in (("_checkpoint_without_reentrant", without_reentrant),
                     ("_checkpoint_without_reentrant_generator", generator),
                     ("_checkpoint_without_reentrant_generator_impl", generator)):
        if hasattr(cp, name):
            patches.append((cp, name, fn))
    saved = [(obj, name, obj.__dict__.get(name, _MISSING)) for obj, name, _ in patches]
    for obj, name, fn in patches:
        setattr(obj, name, fn)
    try:
        yield
    finally:
        for obj, name, old in saved:
            if old is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, old)


_MISSING = object()


def _checkpoint_regions(ops, reentrant):
    """[{firstOp, lastOp[, nonReentrant]}] from the ops' region marks (after the fusions)."""
    regions = []
    for i, op in enumerate(ops):
        r = op.get("_checkpoint")
        if r is None:
            continue
        if regions and regions[-1][0] == r and regions[-1][2] == i - 1:
            regions[-1][2] = i
        else:
            regions.append([r, i, i])
    out = []
    for r, first, last in regions:
        d = {"firstOp": first, "lastOp": last}
        if not reentrant[r]:
            d["nonReentrant"] = True
        out.append(d)
    return out


def _record(module, inputs, batch_dims, *, device, target, loss, scopes, training, batch):
    """Records one forward + loss of a deep copy of `module` on `device` ("meta" or "cpu")."""
    m = copy.deepcopy(module)  # keeps tied weights tied (one object, the deep copy's memo)
    m = _module_on_meta(m) if device == "meta" else m
    m.train(training)
    names = _input_names(module, len(inputs))
    args = []
    tracer = _Tracer(m, device == "meta")
    for nm, x, bd in zip(names, inputs, batch_dims):
        if not isinstance(x, torch.Tensor):
            args.append(x)
            continue
        if batch is not None and bd >= 0:
            x = _resize_batch(x, bd, batch[1])
        grad = training and x.is_floating_point() and x.requires_grad
        if device == "meta":
            x = torch.empty(x.shape, dtype=x.dtype, device="meta")
        elif x.is_floating_point():
            x = x.detach()  # a leaf of its own (the caller's graph is not touched)
        if grad:  # an input that requires grad keeps requiring it
            x.requires_grad_(True)
        tracer._declare(x, nm, "input", batch_dim=bd, requires_grad=grad)
        args.append(x)
    hooks = _ScopeHooks(m, tracer) if scopes else None
    loss_name = None
    grad = torch.enable_grad() if training else torch.no_grad()
    with grad, _trace_lifetimes.watching(tracer.life):
        if hooks:
            hooks.__enter__()
        try:
            with _Recording(tracer), _trace_fused.sdpa_as_one_op(tracer), \
                    _trace_fused.recurrent_as_one_op(tracer), _trace_fused.one_hot_as_one_op(tracer), \
                    _trace_fastpath.encoder_fast_path(tracer), \
                    _checkpoints_as_regions(tracer), \
                    _trace_clones.user_clones(tracer), _trace_linear.bias_added_in_place(tracer), \
                    _trace_static.tensors_made_in_forward(tracer):
                out = m(*args)
        except UnsupportedOp:
            raise
        except Exception as e:  # on meta: no meta kernel, or code that needs real tensors
            if device == "meta":  # (autocast(device_type="meta") in HF's rotary embeddings)
                raise _MetaUnsupported(f"{type(e).__name__}: {e}") from e
            raise
        finally:
            if hooks:
                hooks.__exit__(None, None, None)
        if loss is not None:
            y = _first_tensor(out)
            tgt = _make_target(y, loss, target, device, batch)
            if isinstance(tgt, torch.Tensor):
                tracer._declare(tgt, "target", "target", batch_dim=0 if tgt.dim() > 0 else -1)
            tracer.scope_stack = ["loss"] if scopes else []
            try:
                with _Recording(tracer):
                    l = _apply_loss(y, loss, tgt)
            except UnsupportedOp:
                raise
            except Exception as e:
                if device == "meta":
                    raise _MetaUnsupported(f"{type(e).__name__}: {e}") from e
                raise
            tracer.scope_stack = []
            loss_name = tracer._names.get(id(l))
            if loss_name is None or l.dim() != 0:
                raise ValueError("the loss must be a scalar computed from the module's output")
    outs = _trace_lifetimes.output_tensors(out)
    tracer.output_names = [tracer._names[id(t)] for t in outs if id(t) in tracer._names]
    tracer.recorded_ops = len(tracer.ops)
    tracer.life.stop()  # what dies from here on dies with the trace, not in the module's code
    tracer.loss_name = loss_name
    tracer.module_copy = m
    return tracer


# ---------------------------------------------------------------- batch rescaling

def _batch_attrs(a, b, batch):
    """Compares the traces at B and B+1 op by op; returns (ops whose shape attributes name the
    batch: -1 or batch_dim, see _trace_static.batch_attr; rescalable, reason)."""
    if len(a.ops) != len(b.ops):
        return a.ops, False, "the op sequence depends on the batch size"
    out = []
    for i, (oa, ob) in enumerate(zip(a.ops, b.ops)):
        if oa["kind"] != ob["kind"] or len(oa["inputs"]) != len(ob["inputs"]):
            return a.ops, False, f"op {i} ({oa['kind']}) differs between batch sizes"
        attrs = dict(oa.get("attrs", {}))
        for k, va in list(attrs.items()):
            vb = ob.get("attrs", {}).get(k)
            if va == vb:
                continue
            if k == oa["_shape_attr"] and isinstance(va, list) and len(va) == len(vb):
                in_shape = a._shapes[oa["inputs"][0]][0] if oa["inputs"] else []
                scaled = batch_attr(oa["kind"], attrs, in_shape, va, vb, batch)
                if scaled is not None:
                    attrs = scaled
                    continue
            return a.ops, False, (f"op {i} ({oa['kind']}, {oa['_aten']}) has attribute '{k}' "
                                  f"that depends on the batch size ({va} vs {vb})")
        op = dict(oa)
        if attrs:
            op["attrs"] = attrs
        out.append(op)
    return out, True, None


def _leaf_batch_ok(a, b):
    """Leaves other than inputs and targets must not depend on the batch size."""
    for da, db in zip(a.decls, b.decls):
        if da["role"] in (_ROLE["input"], _ROLE["target"]):
            continue
        if da["shape"] != db["shape"]:
            return False, f"'{da['name']}' has a batch-dependent shape"
    if len(a.decls) != len(b.decls):
        return False, "the declared tensors depend on the batch size"
    return True, None


# ---------------------------------------------------------------- fusions

def _fuse_linear(ops, roles):
    """t(W) read only by addmm(b, x, W^T) or mm(x, W^T), W a parameter -> memest's
    linear(x, W[, b]).

    F.linear on a 2-D input runs as exactly these aten ops in 1.13 (and 2.x's decomposition);
    memest's linear rule models them, the weight's gradient included (mm's [in, out] result
    transposed back onto W.grad). Recorded apart, the transpose of a parameter is an activation
    whose gradient memest would hold as a tensor of its own."""
    readers = {}
    for op in ops:
        for nm in op["inputs"]:
            readers[nm] = readers.get(nm, 0) + 1
    producer = {}
    for i, op in enumerate(ops):
        for nm in op["outputs"]:
            producer[nm] = i
    drop, out = set(), []
    for i, op in enumerate(ops):
        if op["kind"] in ("addmm", "matmul") and not op.get("attrs"):
            wt = op["inputs"][-1]
            j = producer.get(wt)
            src = ops[j] if j is not None else None
            if (src is not None and src["kind"] == "transpose" and readers.get(wt) == 1
                    and roles.get(src["inputs"][0]) == "parameter"
                    and sorted((src.get("attrs") or {}).values()) == [0, 1]
                    and (op["kind"] == "addmm" or len(op["inputs"]) == 2)):
                drop.add(j)
                fused = dict(op)
                fused["kind"] = "linear"
                x = op["inputs"][1] if op["kind"] == "addmm" else op["inputs"][0]
                bias = [op["inputs"][0]] if op["kind"] == "addmm" else []
                fused["inputs"] = [x, src["inputs"][0]] + bias
                fused["_aten"] = f"{src['_aten']} + {op['_aten']}"
                out.append((i, fused))
                continue
        out.append((i, op))
    return [op for i, op in out if i not in drop]


def _fuse_cross_entropy(ops, loss_name):
    """log_softmax(x, dim=1) read only by nll_loss(., target) -> memest's cross_entropy(x, target).

    F.cross_entropy runs as these two aten ops; memest's cross_entropy rule is exactly that
    pair (engine/rules/loss.cc), and, being one op that reads the target, it starts the loss phase
    where F.cross_entropy starts: recorded as two ops, the log_softmax (which reads no target)
    would count in the forward phase."""
    readers = {}
    for op in ops:
        for nm in op["inputs"]:
            readers[nm] = readers.get(nm, 0) + 1
    producer = {op["outputs"][0]: i for i, op in enumerate(ops) if op["outputs"]}
    drop, out = set(), []
    for i, op in enumerate(ops):
        if op["kind"] == "nll_loss":
            lp = op["inputs"][0]
            j = producer.get(lp)
            src = ops[j] if j is not None else None
            if (src is not None and src["kind"] == "log_softmax" and len(src["outputs"]) == 1
                    and src.get("attrs", {}).get("dim") == 1 and "half_to_float" not in src.get("attrs", {})
                    and readers.get(lp) == 1 and lp != loss_name and j == i - 1):
                drop.add(j)
                fused = dict(op)
                fused["kind"] = "cross_entropy"
                fused["inputs"] = [src["inputs"][0], op["inputs"][1]]  # nll_loss's attrs stay
                fused["_aten"] = f"{src['_aten']} + {op['_aten']}"
                out.append((i, fused))
                continue
        out.append((i, op))
    return [op for i, op in out if i not in drop]


# ---------------------------------------------------------------- public API

def trace(module, example_inputs, *, target=None, loss="cross_entropy", batch_dim=0, scopes=True,
          training=True):
    """memest's model description of `module` (proto JSON mapping of memest.v1.Model).

    module: a torch.nn.Module (not modified: the trace runs on a deep copy).
    example_inputs: a tensor or a tuple/list of forward's positional arguments (non-tensors are
      passed as they are).
    target: the loss target (default: made up, an int64 class per sample for cross_entropy, a
      tensor like the output for mse).
    loss: "cross_entropy" (logits [N, C], or [.., V] flattened as language models do), "mse",
      "sum", a callable (output[, target]) -> scalar, or None (no loss: inference only).
    batch_dim: the batch dim of every tensor input, or one per input (-1: none).
    scopes: record module paths as op scopes and repeated blocks.
    training: module.train(training), with autograd on.

    torch.utils.checkpoint calls in the module's code are recorded as checkpoint regions
    ("checkpoints"): memest schedules them as checkpointed, and the estimate's checkpoint policy
    must then be left unset.

    Returns a TracedModel (a dict): {"ops": {tensors, ops, loss, blocks, tracedBatch, checkpoints,
    held, outputs}}, with
    `.path` ("meta" or "real") and `.notes`. Raises UnsupportedOp for an op memest has no
    rule for."""
    inputs = list(example_inputs) if isinstance(example_inputs, (tuple, list)) else [example_inputs]
    if isinstance(batch_dim, int):
        bds = [batch_dim if isinstance(x, torch.Tensor) and x.dim() > 0 else -1 for x in inputs]
    else:
        bds = [int(d) for d in batch_dim]
        if len(bds) != len(inputs):
            raise ValueError("batch_dim: one per example input, or one int for all")
    sizes = {x.shape[d] for x, d in zip(inputs, bds) if isinstance(x, torch.Tensor) and d >= 0}
    if len(sizes) > 1:
        raise ValueError(f"example inputs disagree on the batch size: {sorted(sizes)}")
    batch = sizes.pop() if sizes else None
    if loss is None and training:
        raise ValueError("training needs a loss ('cross_entropy', 'mse', 'sum' or a callable)")

    notes = []
    kw = dict(target=target, loss=loss, scopes=scopes, training=training)
    path = "meta"
    try:
        main = _record(module, inputs, bds, device="meta", batch=None, **kw)
    except _MetaUnsupported as e:
        notes.append(f"meta device failed ({str(e).splitlines()[0][:200]}); traced on real tensors")
        path = "real"
        main = _record(module, inputs, bds, device="cpu", batch=None, **kw)
    ops, rescalable = main.ops, False
    if batch is not None:
        try:
            other = _record(module, inputs, bds, device="meta" if path == "meta" else "cpu",
                            batch=(batch, batch + 1), **kw)
        except UnsupportedOp:
            raise
        except Exception as e:  # the module (or its loss) does not run at batch B + 1
            other, rescalable = None, False
            why = (f"the module does not run at batch {batch + 1} ({type(e).__name__}: "
                   f"{str(e).splitlines()[0][:200] if str(e) else ''})")
        if other is not None:
            ops, rescalable, why = _batch_attrs(main, other, batch)
            if rescalable:
                rescalable, why = _leaf_batch_ok(main, other)
        if not rescalable:
            ops = main.ops
            msg = f"tracedBatch left out: {why}; the graph is valid at batch {batch} only"
            warnings.warn(msg)
            notes.append(msg)

    ops = _fuse_linear(ops, main._roles)
    ops = _fuse_cross_entropy(ops, main.loss_name)
    checkpoints = _checkpoint_regions(ops, main.region_reentrant)
    held, outputs = _trace_lifetimes.held_and_outputs(ops, main.life, main.output_names,
                                                      main.loss_name, main.recorded_ops)
    graph_ops = []
    for op in ops:
        o = {k: v for k, v in op.items() if not k.startswith("_")}
        if "attrs" in o:
            o["attrs"] = {k: attr_value(v) for k, v in o["attrs"].items()}
        graph_ops.append(o)
    tensors = list(main.decls)
    for op in graph_ops:  # declared outputs are checked by the engine against its inference
        for nm in op["outputs"]:
            shape, dt = main._shapes[nm]
            tensors.append({"name": nm, "shape": shape, "dtype": dt, "role": _ROLE["activation"]})
    g = {"tensors": tensors, "ops": graph_ops}
    if main.loss_name is not None:
        g["loss"] = main.loss_name
    if scopes:
        blocks = _blocks(main.module_copy, {op.get("scope", "") for op in graph_ops})
        if blocks:
            g["blocks"] = blocks
    if rescalable:
        g["tracedBatch"] = batch
    if checkpoints:
        g["checkpoints"] = checkpoints
    if held:
        g["held"] = held
    if outputs:
        g["outputs"] = outputs
    result = TracedModel({"ops": g})
    result.path = path
    result.notes = tuple(notes)
    return result


def save(model_dict, path):
    """Writes a traced model (or any memest.v1.Model in the proto JSON mapping) to `path`, the
    form `memest estimate --model FILE.json` reads."""
    with open(path, "w") as f:
        json.dump(dict(model_dict), f, indent=1)
        f.write("\n")
