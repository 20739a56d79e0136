"""A dual-mode model builder: each conformance case is written once, as `forward(r, batch)`.

The case calls methods of a Recorder `r` (`r.input`, `r.param`, `r.linear`, `r.relu`, ...).
Every method runs the real PyTorch op and also records it in memest's op-graph vocabulary
(engine/rules/op_rules.h: kinds, inputs, outputs, attribute names). Methods return `Value` handles,
never tensors, so the case itself holds no tensor: the recorder drops its reference to a tensor
right after the tensor's last use in the graph, unless the case says the program holds it
longer: `with r.frame() as local: x = local(r.linear(...))` keeps x until the frame ends, as a
local variable lives until its function returns (recorded in the model file's `held`).

Two passes use the same case function:

  * record (`Recorder(store, plan=None)`): runs the ops once (under no_grad) to learn the graph:
    tensor declarations with roles, shapes and dtypes, the ops, the loss, each tensor's last
    use and the first op of the loss. `to_model_json()` writes memest's model file (the proto
    JSON mapping of memest.v1.Model, `ops` variant).
  * run (`Recorder(store, plan=<the recorded plan>, tracker=...)`): replays the case for
    measurement. Inputs and targets are made up front by `make_inputs()` (memest's data phase),
    the tracker's phase switches to "LOSS" at the first op of the loss, and tensors are released
    at their last use (or their frame's end). The loss (training) or the last op's outputs
    (inference) stay held, as memest pins them; with `hold_outputs`, the model's outputs too
    (the forward's tensors the loss reads: memest's default outputs), which the measuring loop
    takes with `take_outputs()` and keeps as `outputs = model(**batch)` does.

Checkpointing: `r.checkpoint(fn, *values)` runs `fn` under reentrant torch.utils.checkpoint in
the run pass (recorded as plain ops; memest gets the policy from --checkpoint), and
`r.checkpoint_segment(L)` says how many blocks one checkpoint wraps under the run's policy.

Parameters and buffers live in a `ParamStore`, created once (nn.Parameter) and reused by every
pass and every step, so the optimizer sees the same tensors.
"""
import contextlib
import importlib.util
import json
import math
import os

import torch
import torch.nn.functional as F

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "bool": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

ROLE = {
    "input": "TENSOR_ROLE_INPUT",
    "target": "TENSOR_ROLE_TARGET",
    "parameter": "TENSOR_ROLE_PARAMETER",
    "buffer": "TENSOR_ROLE_BUFFER",
    "activation": "TENSOR_ROLE_ACTIVATION",
}


class Value:
    """A handle on a tensor of the case's graph (the case never sees the tensor)."""

    __slots__ = ("name", "_rec")

    def __init__(self, name, rec):
        self.name = name
        self._rec = rec

    @property
    def shape(self):
        return list(self._rec._shapes[self.name])

    @property
    def dtype(self):
        return self._rec._dtypes[self.name]

    def __repr__(self):
        return f"Value({self.name}, {self.shape})"


class ParamStore:
    """Parameters and buffers of one case, created once and shared by all passes and steps."""

    def __init__(self, seed=0):
        self.params = {}   # name -> nn.Parameter (insertion order = declaration order)
        self.buffers = {}  # name -> tensor
        self.gen = torch.Generator().manual_seed(seed)

    def trainable(self):
        return [p for p in self.params.values() if p.requires_grad]

    def storages(self):
        """Storage data pointers of every parameter and buffer."""
        ptrs = set()
        for t in list(self.params.values()) + list(self.buffers.values()):
            ptrs.add(t.storage().data_ptr())
        return ptrs


def _load_model_json():
    """memest's shared model-JSON helpers, loaded from the package's source by path: this
    harness runs under /usr/bin/python3, where the memest package need not be installed."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client",
                        "python", "memest", "model_json.py")
    spec = importlib.util.spec_from_file_location("memest_model_json", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_attr = _load_model_json().attr_value


def _make_leaf(shape, dtype, init, gen, high=None):
    """A leaf tensor made with exactly one allocation (no temporaries: the allocator-level
    measurement sees every allocation of the data phase)."""
    dt = DTYPES[dtype]
    if dt == torch.bool:
        return torch.empty(shape, dtype=dt).bernoulli_(0.5, generator=gen)
    if not dt.is_floating_point:
        return torch.randint(0, high or 2, shape, generator=gen, dtype=dt)
    if init == "ones":
        return torch.ones(shape, dtype=dt)
    if init == "zeros":
        return torch.zeros(shape, dtype=dt)
    return torch.empty(shape, dtype=dt).normal_(0.0, 0.1, generator=gen)


class Recorder:
    def __init__(self, store, plan=None, tracker=None, training=True, checkpoint="none", checkpoint_k=0,
                 non_reentrant=False, hold_outputs=False):
        self.store = store
        self.hold_outputs = hold_outputs and training  # the loop keeps the model's outputs
        # The checkpoint policy of the run (memest's --checkpoint, --checkpoint-k): cases ask
        # `checkpoint_segment(L)` how many consecutive blocks one torch.utils.checkpoint wraps.
        self.checkpoint_policy = checkpoint
        self.checkpoint_k = checkpoint_k
        self.non_reentrant = non_reentrant  # use_reentrant=False
        self._replaying = False  # run mode: inside a checkpoint's recomputation (backward)
        self.plan = plan
        self.tracker = tracker
        self.training = training
        self.recording = plan is None
        # graph
        self.decls = []     # tensor declarations (dicts in the proto JSON mapping)
        self.ops = []       # op declarations
        self._shapes = {}
        self._dtypes = {}
        self._roles = {}
        self._leaf_spec = {}  # name -> (shape, dtype, high) for inputs and targets
        self._scope = []
        self.blocks = []
        # execution
        self._vals = {}     # name -> live tensor held by the recorder
        self._op_index = 0
        self._names = set()
        self._prepared = {}  # run mode: inputs/targets made in the data phase
        self._held_until = {}  # record mode: name -> the op its frame ended after
        # Record mode: every op as (fn, input names, output names), the torch code a replay
        # runs on other tensors (run.py --via-tracer: the case as an nn.Module).
        self.tape = []
        # Record mode: the tape ranges [first, last] run under r.checkpoint, and the name of
        # what each returns (a replay wraps them in torch.utils.checkpoint).
        self.tape_checkpoints = []

    # ------------------------------------------------------------------ scopes
    @contextlib.contextmanager
    def scope(self, name, block=False):
        self._scope.append(name)
        full = ".".join(self._scope)
        if block and self.recording and full not in self.blocks:
            self.blocks.append(full)
        try:
            yield
        finally:
            self._scope.pop()

    @contextlib.contextmanager
    def frame(self):
        """A function of the model's code: `local(v)` (what the context yields) keeps value v
        referenced until the frame ends, as a local variable lives until its function returns;
        recorded as held until the frame's last op."""
        kept = []

        def local(v):
            kept.append(v.name)
            return v
        yield local
        if self.recording:
            for nm in kept:
                self._held_until[nm] = max(self._held_until.get(nm, -1), self._op_index - 1)

    # ------------------------------------------------------------------ checkpointing
    def checkpoint_segment(self, num_blocks):
        """Blocks per torch.utils.checkpoint segment under the run's policy (0: no checkpointing),
        as memest's PlanCheckpoints groups them: consecutive runs of k blocks, the last one
        possibly shorter."""
        p = self.checkpoint_policy
        if p == "none":
            return 0
        if p == "every-block":
            return 1
        if p == "every-k":
            return self.checkpoint_k
        if p == "sqrt":
            return max(1, int(math.floor(math.sqrt(num_blocks) + 0.5)))  # llround
        raise ValueError(f"unsupported checkpoint policy {p}")

    def checkpoint(self, fn, *values):
        """`fn(*values)` (a function of Values returning a Value) under
        torch.utils.checkpoint.checkpoint (reentrant, 1.13's default, or use_reentrant=False as
        the run says; preserve_rng_state=True).
        Record mode: fn's ops are recorded as usual (memest is told the policy by flags). Run
        mode: forward runs fn under no_grad keeping only the tensor inputs; backward reruns fn on
        detached inputs with grad, as PyTorch does. Parameters are fetched inside fn (closure),
        not passed as inputs, as in a module."""
        if self.recording:
            first = len(self.tape)
            out = fn(*values)
            self.tape_checkpoints.append((first, len(self.tape) - 1, out.name))
            return out
        if not self.training:
            return fn(*values)
        import torch.utils.checkpoint as tcp
        i0 = self._op_index
        names = [v.name for v in values]
        state = {}

        def run(*ts):
            if "out" not in state:  # forward, under no_grad (inside CheckpointFunction)
                for nm, t in zip(names, ts):
                    self._vals[nm] = t
                del ts
                out = fn(*values)
                state["out"] = out.name
                return self._vals.pop(out.name)
            # backward: recompute with grad on the detached inputs, in a scratch copy of the
            # recorder's tensors that dies when the recomputation returns
            outer, outer_index = self._vals, self._op_index
            self._vals = dict(outer)
            self._op_index = i0
            self._replaying = True
            try:
                for nm, t in zip(names, ts):
                    self._vals[nm] = t
                del ts
                out = fn(*values)
                return self._vals.pop(out.name)
            finally:
                self._replaying = False
                self._vals, self._op_index = outer, outer_index

        ts = [self._t(v) for v in values]
        out_t = tcp.checkpoint(run, *ts, use_reentrant=not self.non_reentrant)
        del ts
        self._vals[state["out"]] = out_t
        return Value(state["out"], self)

    # ------------------------------------------------------------------ leaves
    def _declare(self, name, t, role, batch_dim=None, frozen=False):
        if self._replaying:  # a checkpoint's recomputation fetches parameters again
            return Value(name, self)
        if name in self._names:
            raise ValueError(f"duplicate tensor name {name}")
        self._names.add(name)
        self._shapes[name] = tuple(t.shape)
        self._dtypes[name] = DTYPE_NAMES[t.dtype]
        self._roles[name] = role
        if self.recording:
            d = {"name": name, "shape": list(t.shape), "dtype": DTYPE_NAMES[t.dtype], "role": ROLE[role]}
            if batch_dim is not None and batch_dim != 0:
                d["batchDim"] = batch_dim
            if frozen:
                d["frozen"] = True
            self.decls.append(d)
        return Value(name, self)

    def input(self, name, shape, dtype="float32", high=None, batch_dim=0):
        """A data-batch tensor (memest role input). Integer inputs are drawn from [0, high)."""
        return self._leaf(name, shape, dtype, high, "input", batch_dim)

    def target(self, name, shape, dtype="int64", high=None, batch_dim=0):
        """A target (memest role target; the first op reading it starts the loss phase)."""
        return self._leaf(name, shape, dtype, high, "target", batch_dim)

    def _leaf(self, name, shape, dtype, high, role, batch_dim):
        if self.recording:
            t = _make_leaf(shape, dtype, "randn", self.store.gen, high)
            self._leaf_spec[name] = (list(shape), dtype, high)
        else:
            t = self._prepared.pop(name)
        self._vals[name] = t
        return self._declare(name, t, role, batch_dim=batch_dim)

    def make_inputs(self):
        """Run mode: creates every input and target of the plan (memest's data phase)."""
        assert not self.recording
        from measure import untracked  # the tracker must not see the random-number temporaries
        for name, (shape, dtype, high) in self.plan["leaves"].items():
            with untracked():
                t = _make_leaf(shape, dtype, "randn", self.store.gen, high)
            self._prepared[name] = t
            if self.tracker is not None:
                self.tracker.register(t, f"input {name}")

    def param(self, name, shape, init="randn", frozen=False):
        """A parameter (nn.Parameter, created once per case and reused)."""
        p = self.store.params.get(name)
        if p is None:
            p = torch.nn.Parameter(_make_leaf(shape, "float32", init, self.store.gen),
                                   requires_grad=not frozen)
            self.store.params[name] = p
        self._vals[name] = p
        return self._declare(name, p, "parameter", frozen=frozen)

    def buffer(self, name, shape, dtype="float32", init="zeros", value=None):
        """A module buffer (BatchNorm running statistics, a causal mask)."""
        b = self.store.buffers.get(name)
        if b is None:
            b = value if value is not None else _make_leaf(shape, dtype, init, self.store.gen)
            self.store.buffers[name] = b
        self._vals[name] = b
        return self._declare(name, b, "buffer")

    # ------------------------------------------------------------------ ops
    def _t(self, v):
        return self._vals[v.name]

    def _op(self, kind, inputs, attrs, fn, n_out=1, name=None):
        """Runs one op: fn(*input tensors) -> tensor or tuple of tensors."""
        i = self._op_index
        self._op_index += 1
        if not self.recording and self.tracker is not None and i == self.plan["loss_begin"]:
            self.tracker.set_phase("LOSS")
        ts = [self._t(v) for v in inputs]
        if self.recording:
            with torch.no_grad():
                out = fn(*ts)
        else:
            out = fn(*ts)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        assert len(outs) == n_out, (kind, len(outs), n_out)
        del ts, out
        values = []
        for j, t in enumerate(outs):
            nm = name if (name and n_out == 1) else (f"{name}.{j}" if name else f"{kind}_{i}" + (f".{j}" if n_out > 1 else ""))
            if self.recording:
                if nm in self._names:
                    raise ValueError(f"duplicate tensor name {nm}")
                self._names.add(nm)
            self._shapes[nm] = tuple(t.shape)
            self._dtypes[nm] = DTYPE_NAMES[t.dtype]
            self._roles[nm] = "activation"
            self._vals[nm] = t
            values.append(Value(nm, self))
        del outs
        if self.recording:
            op = {"kind": kind, "inputs": [v.name for v in inputs], "outputs": [v.name for v in values]}
            a = {k: _attr(v) for k, v in attrs.items() if v is not None}
            if a:
                op["attrs"] = a
            if self._scope:
                op["scope"] = ".".join(self._scope)
            self.ops.append(op)
            self.tape.append((fn, list(op["inputs"]), list(op["outputs"])))
        else:
            self._release(i)
        return values[0] if n_out == 1 else values

    def _release(self, i):
        """Run mode: drops every tensor whose last use is op i (and is not held)."""
        for nm in self.plan["dies_after"].get(i, ()):
            self._vals.pop(nm, None)

    def release_all(self):
        """End of the micro-batch: the loop drops the batch and what it still holds."""
        self._vals.clear()

    def take(self, v):
        """The tensor of a held value (the loss), for the measuring loop."""
        return self._vals[v.name]

    def take_outputs(self):
        """The model's outputs the loop holds (hold_outputs), for the measuring loop."""
        return [self._vals[nm] for nm in self.plan["outputs"]]

    # linear algebra
    def linear(self, x, w, b=None):
        ins = [x, w] + ([b] if b is not None else [])
        return self._op("linear", ins, {}, lambda *t: F.linear(*t))

    def matmul(self, a, b):
        return self._op("matmul", [a, b], {}, torch.matmul)

    def bmm(self, a, b):
        return self._op("bmm", [a, b], {}, torch.bmm)

    def baddbmm(self, s, a, b, beta=1.0, alpha=1.0):
        attrs = {"beta": float(beta) if beta != 1 else None, "alpha": float(alpha) if alpha != 1 else None}
        return self._op("baddbmm", [s, a, b], attrs, lambda s_, a_, b_: torch.baddbmm(s_, a_, b_, beta=beta, alpha=alpha))

    def addmm(self, bias, a, b):
        return self._op("addmm", [bias, a, b], {}, torch.addmm)

    def einsum(self, equation, a, b=None):
        ins = [a] + ([b] if b is not None else [])
        return self._op("einsum", ins, {"equation": equation}, lambda *t: torch.einsum(equation, *t))

    def _conv(self, kind, fn, x, w, b, stride, padding, dilation, groups):
        ins = [x, w] + ([b] if b is not None else [])
        attrs = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
        return self._op(kind, ins, attrs, lambda x_, w_, b_=None: fn(x_, w_, b_, stride, padding, dilation, groups))

    def conv1d(self, x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
        return self._conv("conv1d", F.conv1d, x, w, b, stride, padding, dilation, groups)

    def conv2d(self, x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
        return self._conv("conv2d", F.conv2d, x, w, b, stride, padding, dilation, groups)

    def _conv_transpose(self, kind, fn, x, w, b, stride, padding, output_padding, dilation, groups):
        ins = [x, w] + ([b] if b is not None else [])
        attrs = {"stride": stride, "padding": padding, "output_padding": output_padding,
                 "dilation": dilation, "groups": groups}
        return self._op(kind, ins, attrs, lambda x_, w_, b_=None: fn(x_, w_, b_, stride, padding,
                                                                     output_padding, groups, dilation))

    def conv_transpose1d(self, x, w, b=None, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
        return self._conv_transpose("conv_transpose1d", F.conv_transpose1d, x, w, b, stride, padding,
                                    output_padding, dilation, groups)

    def conv_transpose2d(self, x, w, b=None, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
        return self._conv_transpose("conv_transpose2d", F.conv_transpose2d, x, w, b, stride, padding,
                                    output_padding, dilation, groups)

    def upsample(self, x, mode, scale_factor=None, size=None, align_corners=None):
        """F.interpolate of a 4-D tensor, mode "nearest" or "bilinear"."""
        kind = {"nearest": "upsample_nearest2d", "bilinear": "upsample_bilinear2d"}[mode]
        h, w = x.shape[2:]
        out = list(size) if size else [int(h * scale_factor), int(w * scale_factor)]
        attrs = {"output_size": out, "align_corners": 1 if align_corners else None}
        return self._op(kind, [x], attrs, lambda t: F.interpolate(
            t, size=size, scale_factor=scale_factor, mode=mode, align_corners=align_corners))

    # pooling
    def max_pool2d(self, x, kernel_size, stride=None, padding=0, ceil_mode=False):
        """memest's max_pool2d has two outputs (out, indices); the indices are unused here."""
        s = stride if stride is not None else kernel_size
        attrs = {"kernel_size": kernel_size, "stride": stride, "padding": padding,
                 "ceil_mode": 1 if ceil_mode else None}
        out, _ = self._op("max_pool2d", [x], attrs,
                          lambda t: F.max_pool2d(t, kernel_size, s, padding, ceil_mode=ceil_mode,
                                                 return_indices=True), n_out=2)
        return out

    def avg_pool2d(self, x, kernel_size, stride=None, padding=0, ceil_mode=False):
        s = stride if stride is not None else kernel_size
        attrs = {"kernel_size": kernel_size, "stride": stride, "padding": padding,
                 "ceil_mode": 1 if ceil_mode else None}
        return self._op("avg_pool2d", [x], attrs, lambda t: F.avg_pool2d(t, kernel_size, s, padding, ceil_mode))

    def adaptive_avg_pool2d(self, x, output_size):
        return self._op("adaptive_avg_pool2d", [x], {"output_size": output_size},
                        lambda t: F.adaptive_avg_pool2d(t, output_size))

    # normalisation
    def layer_norm(self, x, w=None, b=None, normalized_ndim=1, eps=1e-5):
        ins = [x] + [v for v in (w, b) if v is not None]
        if w is None and b is not None:
            raise ValueError("layer_norm with a bias needs a weight")

        def fn(t, *wb):
            return F.layer_norm(t, t.shape[t.dim() - normalized_ndim:], *wb, eps=eps)
        return self._op("layer_norm", ins, {"normalized_ndim": normalized_ndim if normalized_ndim != 1 else None}, fn)

    def batch_norm(self, x, w, b, running_mean, running_var, eps=1e-5):
        def fn(t, w_, b_, rm, rv):
            return F.batch_norm(t, rm, rv, w_, b_, training=self.training, eps=eps)
        return self._op("batch_norm", [x, w, b, running_mean, running_var], {}, fn)

    def group_norm(self, x, num_groups, w=None, b=None, eps=1e-5):
        ins = [x] + [v for v in (w, b) if v is not None]
        return self._op("group_norm", ins, {"num_groups": num_groups},
                        lambda t, *wb: F.group_norm(t, num_groups, *wb, eps=eps))

    def rms_norm(self, x, w=None, eps=1e-6):
        """memest's rms_norm (upcast=0), run as HF's LlamaRMSNorm writes it for float32."""
        ins = [x] + ([w] if w is not None else [])

        def fn(t, *w_):
            h = t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps)
            return w_[0] * h if w_ else h
        return self._op("rms_norm", ins, {}, fn)

    # pointwise
    def relu(self, x, inplace=False):
        if inplace:
            return self._op("relu", [x], {"inplace": 1}, torch.relu_)
        return self._op("relu", [x], {}, torch.relu)

    def gelu(self, x, approximate="none"):
        return self._op("gelu", [x], {"approximate": approximate if approximate != "none" else None},
                        lambda t: F.gelu(t, approximate=approximate))

    def silu(self, x, inplace=False):
        if inplace:
            return self._op("silu", [x], {"inplace": 1}, lambda t: F.silu(t, inplace=True))
        return self._op("silu", [x], {}, F.silu)

    def hardtanh(self, x, min_val=-1.0, max_val=1.0, inplace=False):
        """F.hardtanh; F.relu6 is hardtanh(0, 6)."""
        attrs = {"min_val": float(min_val), "max_val": float(max_val), "inplace": 1 if inplace else None}
        return self._op("hardtanh", [x], attrs, lambda t: F.hardtanh(t, min_val, max_val, inplace=inplace))

    def hardswish(self, x, inplace=False):
        return self._op("hardswish", [x], {"inplace": 1 if inplace else None},
                        lambda t: F.hardswish(t, inplace=inplace))

    def hardsigmoid(self, x, inplace=False):
        return self._op("hardsigmoid", [x], {"inplace": 1 if inplace else None},
                        lambda t: F.hardsigmoid(t, inplace=inplace))

    def sigmoid(self, x, inplace=False):
        if inplace:
            return self._op("sigmoid", [x], {"inplace": 1}, torch.sigmoid_)
        return self._op("sigmoid", [x], {}, torch.sigmoid)

    def tanh(self, x, inplace=False):
        if inplace:
            return self._op("tanh", [x], {"inplace": 1}, torch.tanh_)
        return self._op("tanh", [x], {}, torch.tanh)

    def exp(self, x):
        return self._op("exp", [x], {}, torch.exp)

    def rsqrt(self, x):
        return self._op("rsqrt", [x], {}, torch.rsqrt)

    def sqrt(self, x):
        return self._op("sqrt", [x], {}, torch.sqrt)

    def neg(self, x):
        return self._op("neg", [x], {}, torch.neg)

    def log1p(self, x):
        return self._op("log1p", [x], {}, torch.log1p)

    def pow(self, x, exponent=2.0):
        return self._op("pow", [x], {"exponent": float(exponent)}, lambda t: t.pow(exponent))

    def softmax(self, x, dim=-1):
        return self._op("softmax", [x], {"dim": dim}, lambda t: torch.softmax(t, dim))

    def log_softmax(self, x, dim=-1):
        return self._op("log_softmax", [x], {"dim": dim}, lambda t: torch.log_softmax(t, dim))

    def dropout(self, x, p=0.1, inplace=False):
        return self._op("dropout", [x], {"p": float(p), "inplace": 1 if inplace else None},
                        lambda t: F.dropout(t, p, training=self.training, inplace=inplace))

    def stochastic_depth(self, x, p, mode="row"):
        """torchvision.ops.stochastic_depth (ConvNeXt, EfficientNet, Swin blocks)."""
        from torchvision.ops import stochastic_depth
        return self._op("stochastic_depth", [x], {"p": float(p), "mode": mode},
                        lambda t: stochastic_depth(t, p, mode, training=self.training))

    def recurrent(self, kind, x, weights, state=(), num_layers=1, bidirectional=False,
                  batch_first=False, dropout=0.0, bias=True):
        """nn.LSTM / nn.GRU's call: torch._VF.lstm / gru on `weights` (_flat_weights' order),
        starting from `state` (h0[, c0]) or, as nn.LSTM does without one, from zeros made here.
        Returns output, h_n[, c_n]."""
        n_state = 2 if kind == "lstm" else 1
        attrs = {"num_layers": num_layers if num_layers != 1 else None,
                 "bidirectional": 1 if bidirectional else None,
                 "batch_first": 1 if batch_first else None, "bias": None if bias else 0,
                 "dropout": float(dropout) if dropout and self.training else None}
        ins = [x] + list(weights) + list(state)
        dirs = 2 if bidirectional else 1

        def fn(x_, *rest):
            ws, st = list(rest[:len(weights)]), list(rest[len(weights):])
            if not st:
                b_ = x_.shape[0] if batch_first else x_.shape[1]
                shape = (num_layers * dirs, b_, ws[1].shape[1])
                st = [torch.zeros(shape, dtype=x_.dtype) for _ in range(n_state)]
            hx = tuple(st) if kind == "lstm" else st[0]
            f = torch._VF.lstm if kind == "lstm" else torch._VF.gru
            out = f(x_, hx, ws, bias, num_layers, float(dropout), self.training, bidirectional, batch_first)
            return tuple(out)
        return self._op(kind, ins, attrs, fn, n_out=n_state + 1)

    def embedding_bag(self, w, idx, offsets=None, mode="mean", per_sample_weights=None):
        """F.embedding_bag: 2-D indices (bags of rows) or 1-D indices with offsets."""
        ins = [w, idx] + ([offsets] if offsets is not None else []) + \
            ([per_sample_weights] if per_sample_weights is not None else [])

        def fn(w_, i_, *rest):
            o_ = rest[0] if offsets is not None else None
            p_ = rest[-1] if per_sample_weights is not None else None
            return F.embedding_bag(i_, w_, o_, mode=mode, per_sample_weights=p_)
        return self._op("embedding_bag", ins, {"mode": mode}, fn)

    def index(self, x, idx, dim=0):
        """aten.index(x, [None] * dim + [idx]): x[:, ..., idx] with an integer index tensor, without
        the full slices Python's x[:, idx] also records (cases record those as slice ops)."""
        return self._op("index", [x, idx], {"dim": dim if dim else None},
                        lambda t, i: torch.ops.aten.index(t, [None] * dim + [i]))

    def index_many(self, x, idxs, dim=0):
        """x[:, ..., i1, i2, ...]: integer index tensors for consecutive dims from `dim`."""
        return self._op("index", [x] + list(idxs), {"dim": dim if dim else None},
                        lambda t, *i: torch.ops.aten.index(t, [None] * dim + list(i)))

    def index_put_(self, x, idx, values, dim=0):
        """x[:, ..., idx] = values, in place."""
        return self._op("index_put_", [x, idx, values], {"dim": dim if dim else None},
                        lambda t, i, v: torch.ops.aten.index_put_(t, [None] * dim + [i], v))

    def index_add_(self, x, idx, source, dim=0):
        """x.index_add_(dim, idx, source), in place (MoE layers gather their experts' outputs)."""
        return self._op("index_add_", [x, idx, source], {"dim": dim if dim else None},
                        lambda t, i, v: t.index_add_(dim, i, v))

    def one_hot(self, ids, num_classes):
        return self._op("one_hot", [ids], {"num_classes": num_classes},
                        lambda t: F.one_hot(t, num_classes))

    def nonzero(self, x):
        """x.nonzero(): int64 [count, rank]; the count is the data's (read off x here)."""
        return self._op("nonzero", [x], {"count": int((self._t(x) != 0).sum())}, torch.nonzero)

    def topk(self, x, k, dim=-1):
        return self._op("topk", [x], {"k": k, "dim": dim}, lambda t: torch.topk(t, k, dim), n_out=2)

    def sort(self, x, dim=-1, descending=False, stable=False):
        """torch.sort; stable=True as argsort(stable=True) runs it (memest has no stable attr:
        the same tensors)."""
        if stable:
            return self._op("sort", [x], {"dim": dim, "descending": 1 if descending else None},
                            lambda t: torch.sort(t, dim=dim, descending=descending, stable=True),
                            n_out=2)
        return self._op("sort", [x], {"dim": dim, "descending": 1 if descending else None},
                        lambda t: torch.sort(t, dim, descending), n_out=2)

    # Megatron-LM's mixture-of-experts layer (megatron_fns.py, engine/rules/moe_dispatch.cc)
    def index_select(self, x, idx, dim=0):
        """x.index_select(dim, idx) (Megatron's permute gathers its tokens so)."""
        return self._op("index_select", [x, idx], {"dim": dim if dim else None},
                        lambda t, i: t.index_select(dim, i))

    def scatter(self, x, idx, src=None, dim=0, value=0.0):
        """x.scatter(dim, idx, src) out of place, or x.scatter(dim, idx, value) without src."""
        if src is None:
            return self._op("scatter", [x, idx], {"dim": dim, "value": float(value)},
                            lambda t, i: t.scatter(dim, i, value))
        return self._op("scatter", [x, idx, src], {"dim": dim},
                        lambda t, i, s: t.scatter(dim, i, s))

    def scatter_add_(self, x, idx, src, dim=0):
        """x.scatter_add_(dim, idx, src), in place (Megatron's unpermute)."""
        return self._op("scatter_add_", [x, idx, src], {"dim": dim if dim else None},
                        lambda t, i, s: t.scatter_add_(dim, i, s))

    def remainder(self, x, other):
        """x % other with a number (remainder.Scalar)."""
        return self._op("remainder", [x], {"other": float(other)}, lambda t: t % other)

    def ep_all_to_all(self, x, rows, experts, top_k, role):
        """Megatron's _AllToAll over an expert-parallel group of one rank (megatron_fns.py)."""
        from megatron_fns import AllToAllOneRank
        attrs = {"ep": 1, "rows": rows, "experts": experts, "top_k": top_k, "role": role}
        return self._op("ep_all_to_all", [x], attrs, AllToAllOneRank.apply)

    def megatron_swiglu(self, x, weights=None):
        """Megatron's SwiGLUFunction, or WeightedSwiGLUFunction with per-token weights [.., 1]
        (megatron_fns.py)."""
        from megatron_fns import SwiGLU, WeightedSwiGLU
        if weights is None:
            return self._op("megatron_swiglu", [x], {}, SwiGLU.apply)
        return self._op("megatron_swiglu", [x, weights], {}, WeightedSwiGLU.apply)

    def max_all(self, x):
        return self._op("max", [x], {}, torch.max)

    def log2(self, x):
        return self._op("log2", [x], {}, torch.log2)

    def floor(self, x):
        return self._op("floor", [x], {}, torch.floor)

    def bitwise(self, kind, a, b):
        return self._op(kind, [a, b], {}, getattr(torch, kind))

    def stack(self, xs, dim=0):
        """torch.stack, recorded as memest.trace records it: each input unsqueezed (a view), then
        cat. The run calls torch.stack itself (on the views squeezed back: views again), so the
        tracer meets aten.stack."""
        views = [self._op("unsqueeze", [x], {"dim": dim}, lambda t: t.unsqueeze(dim)) for x in xs]
        return self._op("cat", views, {"dim": dim},
                        lambda *t: torch.stack([v.squeeze(dim) for v in t], dim))

    def nms(self, boxes, scores, iou_threshold):
        """torchvision.ops.nms; the count kept is the data's (run here once to read it)."""
        import torchvision
        count = len(torchvision.ops.nms(self._t(boxes), self._t(scores).detach(), iou_threshold))
        return self._op("nms", [boxes, scores], {"iou_threshold": iou_threshold, "count": count},
                        lambda b_, s_: torchvision.ops.nms(b_, s_.detach(), iou_threshold))

    def roi_align(self, x, rois, output_size, spatial_scale=1.0, sampling_ratio=-1, aligned=False):
        import torchvision
        attrs = {"output_size": list(output_size), "spatial_scale": spatial_scale,
                 "sampling_ratio": sampling_ratio, "aligned": 1 if aligned else None}
        return self._op("roi_align", [x, rois], attrs, lambda x_, r_: torchvision.ops.roi_align(
            x_, r_, output_size, spatial_scale, sampling_ratio, aligned))

    def embedding(self, w, idx):
        return self._op("embedding", [w, idx], {}, lambda w_, i_: F.embedding(i_, w_))

    def _binary(self, kind, a, b, fn):
        if isinstance(b, (int, float)):
            s = float(b)
            return self._op(kind, [a], {"scalar": s}, lambda t: fn(t, s))
        return self._op(kind, [a, b], {}, fn)

    def add(self, a, b):
        return self._binary("add", a, b, lambda x, y: x + y)

    def sub(self, a, b):
        return self._binary("sub", a, b, lambda x, y: x - y)

    def mul(self, a, b):
        return self._binary("mul", a, b, lambda x, y: x * y)

    def div(self, a, b):
        return self._binary("div", a, b, lambda x, y: x / y)

    def add_(self, a, b):
        return self._op("add_", [a, b], {}, lambda x, y: x.add_(y))

    def mul_(self, a, b):
        return self._op("mul_", [a, b], {}, lambda x, y: x.mul_(y))

    def div_(self, a, b):
        return self._op("div_", [a, b], {}, lambda x, y: x.div_(y))

    def masked_fill(self, x, mask, value):
        return self._op("masked_fill", [x, mask], {"value": float(value)},
                        lambda t, m: t.masked_fill(m, value))

    def where(self, cond, a, b):
        return self._op("where", [cond, a, b], {}, torch.where)

    def compare(self, kind, a, b):
        """eq / ne / lt / le / gt / ge of two values, or of a value and a number: a bool tensor."""
        fn = getattr(torch, kind)
        if isinstance(b, (int, float)):
            return self._op(kind, [a], {"scalar": float(b)}, lambda t: fn(t, b))
        return self._op(kind, [a, b], {}, fn)

    def maximum(self, a, b):
        return self._op("maximum", [a, b], {}, torch.maximum)

    def minimum(self, a, b):
        return self._op("minimum", [a, b], {}, torch.minimum)

    def cumsum(self, x, dim):
        return self._op("cumsum", [x], {"dim": dim}, lambda t: torch.cumsum(t, dim))

    def full(self, shape, dtype="float32", value=0.0):
        """A tensor the forward makes from a constant (torch.full): no gradient."""
        return self._op("full", [], {"shape": list(shape), "dtype": dtype},
                        lambda: torch.full(list(shape), value, dtype=DTYPES[dtype]))

    def copy_(self, dst, src):
        return self._op("copy_", [dst, src], {}, lambda d, s: d.copy_(s))

    # reductions
    def sum(self, x, dim=None, keepdim=False):
        attrs = {"dim": list(dim) if dim is not None else None, "keepdim": 1 if keepdim else None}
        if dim is None:
            return self._op("sum", [x], attrs, lambda t: t.sum())
        return self._op("sum", [x], attrs, lambda t: t.sum(list(dim), keepdim=keepdim))

    def all(self, x, dim=None, keepdim=False, kind="all"):
        """all / any of x (torch.all, torch.any): a bool tensor, reduced over dim or entirely."""
        fn = getattr(torch, kind)
        attrs = {"dim": [dim] if dim is not None else None, "keepdim": 1 if keepdim else None}
        if dim is None:
            return self._op(kind, [x], attrs, lambda t: fn(t))
        return self._op(kind, [x], attrs, lambda t: fn(t, dim, keepdim=keepdim))

    def any(self, x, dim=None, keepdim=False):
        return self.all(x, dim, keepdim, kind="any")

    def mean(self, x, dim=None, keepdim=False):
        attrs = {"dim": list(dim) if dim is not None else None, "keepdim": 1 if keepdim else None}
        if dim is None:
            return self._op("mean", [x], attrs, lambda t: t.mean())
        return self._op("mean", [x], attrs, lambda t: t.mean(list(dim), keepdim=keepdim))

    # views and copies
    def view(self, x, shape):
        return self._op("view", [x], {"shape": list(shape)}, lambda t: t.view(list(shape)))

    def reshape(self, x, shape):
        return self._op("reshape", [x], {"shape": list(shape)}, lambda t: t.reshape(list(shape)))

    def transpose(self, x, dim0, dim1):
        return self._op("transpose", [x], {"dim0": dim0, "dim1": dim1}, lambda t: t.transpose(dim0, dim1))

    def permute(self, x, dims):
        return self._op("permute", [x], {"dims": list(dims)}, lambda t: t.permute(list(dims)))

    def expand(self, x, shape):
        return self._op("expand", [x], {"shape": list(shape)}, lambda t: t.expand(list(shape)))

    def unsqueeze(self, x, dim):
        return self._op("unsqueeze", [x], {"dim": dim}, lambda t: t.unsqueeze(dim))

    def squeeze(self, x, dim=None):
        if dim is None:
            return self._op("squeeze", [x], {}, lambda t: t.squeeze())
        return self._op("squeeze", [x], {"dim": dim}, lambda t: t.squeeze(dim))

    def slice(self, x, dim, start, end, step=1):
        if step != 1:
            idx = (slice(None),) * dim + (slice(start, end, step),)
            return self._op("slice", [x], {"dim": dim, "start": start, "end": end, "step": step},
                            lambda t: t[idx])
        return self._op("slice", [x], {"dim": dim, "start": start, "end": end},
                        lambda t: t.narrow(dim, start, end - start))

    def norm(self, x, dim, keepdim=False):
        """The 2-norm over `dim` (1.13's Tensor.norm; F.normalize's first step)."""
        return self._op("norm", [x], {"dim": list(dim), "keepdim": 1 if keepdim else None},
                        lambda t: t.norm(2.0, list(dim), keepdim))

    def clamp(self, x, min=None, max=None):
        return self._op("clamp", [x], {"min": min, "max": max},
                        lambda t: torch.clamp(t, min, max))

    def clone(self, x):
        return self._op("clone", [x], {}, lambda t: t.clone())

    def pad(self, x, pad):
        return self._op("pad", [x], {"pad": list(pad)}, lambda t: F.pad(t, list(pad)))

    def roll(self, x, shifts, dims):
        return self._op("roll", [x], {"shifts": list(shifts), "dims": list(dims)},
                        lambda t: torch.roll(t, tuple(shifts), tuple(dims)))

    def split(self, x, dim, sizes):
        return self._op("split", [x], {"dim": dim, "sizes": list(sizes)},
                        lambda t: t.split(list(sizes), dim), n_out=len(sizes))

    def flatten(self, x, start_dim=0, end_dim=-1):
        return self._op("flatten", [x], {"start_dim": start_dim, "end_dim": end_dim},
                        lambda t: t.flatten(start_dim, end_dim))

    def contiguous(self, x):
        return self._op("contiguous", [x], {}, lambda t: t.contiguous())

    def to(self, x, dtype):
        return self._op("to", [x], {"dtype": dtype}, lambda t: t.to(DTYPES[dtype]))

    def cat(self, xs, dim=0):
        return self._op("cat", list(xs), {"dim": dim}, lambda *t: torch.cat(t, dim))

    def arange(self, end, start=0, step=1):
        return self._op("arange", [], {"end": end, "start": start or None, "step": step if step != 1 else None},
                        lambda: torch.arange(start, end, step))

    # losses
    def cross_entropy(self, logits, target, reduction="mean"):
        return self._op("cross_entropy", [logits, target], {"reduction": reduction if reduction != "mean" else None},
                        lambda x, t: F.cross_entropy(x, t, reduction=reduction))

    def mse_loss(self, a, b):
        return self._op("mse_loss", [a, b], {}, F.mse_loss)

    # ------------------------------------------------------------------ the plan
    def finish(self, result):
        """Record mode: closes the graph with the case's result (the loss in training, the
        output in inference) and returns the plan the run mode replays."""
        assert self.recording
        result_names = [v.name for v in (result if isinstance(result, (list, tuple)) else [result])]
        self.result = result_names
        last_use = {}
        for i, op in enumerate(self.ops):
            for nm in op["inputs"]:
                last_use[nm] = i
            for nm in op["outputs"]:
                last_use.setdefault(nm, i)
        # A local referenced past its last use: held in the model file, released at its frame's end.
        self.held = {nm: i for nm, i in self._held_until.items()
                     if self._roles.get(nm) == "activation" and i > last_use.get(nm, -1)}
        last_use.update(self.held)
        held = set()
        if self.training:
            held.update(result_names)  # the loss, held by the loop across backward
        elif self.ops:
            held.update(self.ops[-1]["outputs"])  # inference: the model's output
        # Inputs and targets live until the end of the micro-batch; parameters and buffers
        # belong to the store.
        for nm, role in self._roles.items():
            if role != "activation":
                held.add(nm)
        dies_after = {}
        for nm, i in last_use.items():
            if nm not in held:
                dies_after.setdefault(i, []).append(nm)
        loss_begin = -1
        if self.training:
            targets = {nm for nm, role in self._roles.items() if role == "target"}
            for i, op in enumerate(self.ops):
                if any(nm in targets for nm in op["inputs"]) or any(nm in result_names for nm in op["outputs"]):
                    loss_begin = i
                    break
        # The model's outputs as memest takes them by default: what the forward made that the
        # loss reads.
        made_before = {nm for op in self.ops[:max(loss_begin, 0)] for nm in op["outputs"]}
        outputs = list(dict.fromkeys(nm for op in self.ops[max(loss_begin, 0):] for nm in op["inputs"]
                                     if nm in made_before)) if loss_begin > 0 else []
        if self.hold_outputs:
            for i in list(dies_after):
                dies_after[i] = [nm for nm in dies_after[i] if nm not in outputs]
        self._vals.clear()
        return {
            "leaves": dict(self._leaf_spec),
            "dies_after": dies_after,
            "loss_begin": loss_begin,
            "result": result_names,
            "outputs": outputs,
        }

    def to_model_json(self, batch, declare_outputs=True):
        """memest.v1.Model (ops variant) in the proto JSON mapping."""
        tensors = list(self.decls)
        if declare_outputs:
            # Declared op outputs are checked by memest against its shape inference.
            for op in self.ops:
                for nm in op["outputs"]:
                    tensors.append({"name": nm, "shape": list(self._shapes[nm]), "dtype": self._dtypes[nm],
                                    "role": ROLE["activation"]})
        g = {"tensors": tensors, "ops": self.ops, "tracedBatch": batch}
        if self.held:
            g["held"] = [{"tensor": nm, "untilOp": i} for nm, i in self.held.items()]
        if self.training:
            g["loss"] = self.result[0]
        if self.blocks:
            g["blocks"] = list(self.blocks)
        return {"ops": g}

    def dumps(self, batch):
        return json.dumps(self.to_model_json(batch), indent=1)
