"""The probes of tests/parallel/fsdp1.py: FSDP1 (FullyShardedDataParallel, PyTorch 2.x) named in
fsdp2_trace's labelled allocator trace (imported, with its gloo set-up and its flush).

`Probes.install()` wraps FSDP1's own functions without changing what they do, to
- name every buffer where FSDP1 makes or hands it over: `local shard u` (the sharded
  FlatParameter, `_local_shard`, after construction), `full_param_padded u`
  (`FlatParamHandle._alloc_padded_unsharded_flat_param`, the all-gather output), `mp shard u`
  (`_use_low_precision_shard`), `param grad u` (autograd's gradient of each parameter's view
  into the FlatParameter, as it reaches the view's grad_fn), `flat grad u` (autograd's unsharded gradient of the
  FlatParameter, at `_post_backward_hook`'s entry), `reduce-dtype grad u` (the copy
  `_post_backward_hook` makes when the gradient's dtype is not the reduce dtype), `padded grad u`
  (`_get_reduce_scatter_tensors`' F.pad copy), `new sharded grad u` (its output) and
  `saved grad shard u` (`_saved_grad_shard` after `_reduce_grad`), where u is the unit: `root`
  or `h.0`..`h.2`;
- give every FSDP1 hook a record_function that names its unit (`FSDP::pre_forward (h.1)`,
  `FSDP::unshard (h.0)`, `FSDP::reshard (h.1)`, `FSDP::post_backward (h.2)`,
  `FSDP::all_gather (h.0)`, `FSDP::post_backward_reduce (h.2)`, ...), so that a peak's place
  and a buffer's lifetime say which unit did what, and fsdp2_trace's `group_of` names gloo's
  copies by unit;
- follow every gloo collective FSDP1 issues (`dist.all_gather` on the CPU path of
  `_all_gather_flat_param`, `dist.reduce_scatter_single`, NO_SHARD's `dist.all_reduce`) by
  `LabelledTrace.flush` before it returns, as fsdp2_trace does for FSDP2 (the module
  docstring there says why): the modules' `dist` is replaced by a proxy that does that and
  passes everything else through.
"""
import contextlib
import functools

import torch
import torch.distributed as dist

from fsdp2_trace import storage_key


class _DistProxy:
    """torch.distributed for _flat_param.py and _runtime_utils.py: the three collectives FSDP1
    calls in these cases run under a record_function naming the unit and are flushed."""

    def __init__(self, probes):
        self._p = probes

    def __getattr__(self, name):
        return getattr(dist, name)

    def _run(self, kind, fn, *a, **k):
        k["async_op"] = True
        with torch.profiler.record_function(f"FSDP::{kind} ({self._p.unit()})"):
            work = fn(*a, **k)
            work.wait()
            if self._p.trace is not None:
                self._p.trace.flush(k.get("group"))
        return None

    def all_gather(self, tensor_list, tensor, group=None, async_op=False):
        return self._run("all_gather", dist.all_gather, tensor_list, tensor, group=group)

    def reduce_scatter_single(self, output, input, group=None, async_op=False):  # noqa: A002
        return self._run("post_backward_reduce", dist.reduce_scatter_single, output, input, group=group)

    def all_reduce(self, tensor, group=None, async_op=False):
        return self._run("post_backward_reduce", dist.all_reduce, tensor, group=group)


class Probes:
    """See the module docstring. `trace` is the running case's LabelledTrace (or None);
    `units` maps id(FlatParamHandle) to its unit's name (set by the case after wrapping)."""

    def __init__(self):
        self.trace = None
        self.units = {}
        self.stack = []          # the units being worked on, innermost last
        self._autograd_grad = {}  # unit -> data pointer of autograd's flat gradient

    def name(self, handle):
        return self.units.get(id(handle), "?") if handle is not None else "-"

    def unit(self):
        return self.stack[-1] if self.stack else "?"

    def label(self, t, s):
        if self.trace is not None and t is not None:
            self.trace.label(t, s)

    @contextlib.contextmanager
    def scope(self, what, handle):
        u = self.name(handle)
        self.stack.append(u)
        try:
            with torch.profiler.record_function(f"FSDP::{what} ({u})"):
                yield u
        finally:
            self.stack.pop()

    def install(self):
        from torch.distributed.fsdp import _flat_param as FP
        from torch.distributed.fsdp import _runtime_utils as R
        from torch.distributed.fsdp import fully_sharded_data_parallel as M
        pr = self
        FP.dist = R.dist = _DistProxy(self)

        def scoped(mod, fname, what, handle_arg):
            """mod.fname runs in scope(what, its handle argument)."""
            orig = getattr(mod, fname)

            @functools.wraps(orig)
            def f(*a, **k):
                with pr.scope(what, a[handle_arg]):
                    return orig(*a, **k)
            setattr(mod, fname, f)
        # (state, handle, ...) in the module that looks the name up when it calls it
        scoped(M, "_pre_forward", "pre_forward", 1)
        scoped(M, "_post_forward", "post_forward", 1)
        scoped(R, "_unshard", "unshard", 1)
        scoped(R, "_reshard", "reshard", 1)
        scoped(R, "_prefetch_handle", "prefetch", 1)
        scoped(R, "_pre_backward_hook", "pre_backward", 2)   # (state, module, handle, grad)
        scoped(R, "_reduce_grad_no_shard", "reduce_no_shard", 1)
        orig_root = M._root_pre_forward

        def root_pre_forward(state, *a, **k):  # every FSDP instance's forward calls it
            with pr.scope("root_pre_forward", state._handle):
                return orig_root(state, *a, **k)
        M._root_pre_forward = root_pre_forward

        orig_final = R._post_backward_final_callback

        def final_callback(state, module):
            with pr.scope("final_callback", state._handle):
                return orig_final(state, module)
        R._post_backward_final_callback = final_callback

        orig_post_bw = R._post_backward_hook

        def post_backward_hook(state, handle, *unused):
            with pr.scope("post_backward", handle) as u:
                g = handle.flat_param.grad
                if g is not None:
                    pr.label(g, f"flat grad {u}")
                    pr._autograd_grad[u] = storage_key(g)[0]
                return orig_post_bw(state, handle, *unused)
        R._post_backward_hook = post_backward_hook

        orig_reduce = R._reduce_grad

        def reduce_grad(state, handle):
            with pr.scope("reduce_grad", handle) as u:
                out = orig_reduce(state, handle)
                pr.label(getattr(handle.flat_param, "_saved_grad_shard", None), f"saved grad shard {u}")
                return out
        R._reduce_grad = reduce_grad

        orig_rs_tensors = R._get_reduce_scatter_tensors

        def get_rs_tensors(state, unsharded_grad):
            u = pr.unit()
            if storage_key(unsharded_grad)[0] != pr._autograd_grad.get(u):
                pr.label(unsharded_grad, f"reduce-dtype grad {u}")
            padded, new = orig_rs_tensors(state, unsharded_grad)
            if storage_key(padded)[0] != storage_key(unsharded_grad)[0]:
                pr.label(padded, f"padded grad {u}")
            pr.label(new, f"new sharded grad {u}")
            return padded, new
        R._get_reduce_scatter_tensors = get_rs_tensors

        orig_alloc = FP.FlatParamHandle._alloc_padded_unsharded_flat_param

        def alloc_padded(self):
            out = orig_alloc(self)
            pr.label(out, f"full_param_padded {pr.name(self)}")
            return out
        FP.FlatParamHandle._alloc_padded_unsharded_flat_param = alloc_padded

        orig_low = FP.FlatParamHandle._use_low_precision_shard

        def use_low_precision_shard(self):
            orig_low(self)
            pr.label(self.flat_param._mp_shard, f"mp shard {pr.name(self)}")
        FP.FlatParamHandle._use_low_precision_shard = use_low_precision_shard

        orig_views = FP.FlatParamHandle._use_unsharded_views

        def use_unsharded_views(self, as_params):
            orig_views(self, as_params)
            u = pr.name(self)

            def name_grads(grad_outputs):
                for g in grad_outputs:
                    pr.label(g, f"param grad {u}")
            for info in self.flat_param._param_infos:
                v = getattr(info.module, info.param_name, None)
                if isinstance(v, torch.Tensor) and v.grad_fn is not None:
                    v.grad_fn.register_prehook(name_grads)
        FP.FlatParamHandle._use_unsharded_views = use_unsharded_views

        orig_ag = FP.FlatParamHandle._all_gather_flat_param

        def all_gather_flat_param(self, padded):
            pr.stack.append(pr.name(self))
            try:
                return orig_ag(self, padded)
            finally:
                pr.stack.pop()
        FP.FlatParamHandle._all_gather_flat_param = all_gather_flat_param
        return self
