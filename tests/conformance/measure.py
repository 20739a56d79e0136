"""Measures real PyTorch (1.13, CPU) for one conformance case and one run configuration.

What is measured, and how (see also docs/fidelity.md, "Method"):

* Saved for backward (`measure_saved`, its own pass, no dispatch mode): every tensor autograd
  packs during forward + loss goes through `torch.autograd.graph.saved_tensors_hooks`; at the end
  of the loss the distinct storages still alive are summed. Parameters and buffers are excluded;
  inputs and targets are included.
* Live bytes (`AllocTracker`, what the bounds are checked against): the CPU allocator's own
  trace from torch.profiler (profile_memory=True): every allocation and free, with address and a
  nanosecond time stamp; phases are marked with time stamps on the same clock. It sees scratch a
  kernel allocates inside itself and does not perturb autograd. Parameters, buffers, existing
  gradients and optimizer state are the baseline, counted from the tensors.
* Live bytes by op (`LiveTracker`, a `TorchDispatchMode`, for --explain): every storage an aten
  op returns that is not already tracked is a new allocation, counted once (views and in-place
  results share their base's storage); a `StorageWeakRef` on each storage tells when its last
  tensor is gone. It names the op behind each storage, but cannot see kernel-internal scratch,
  and an active dispatch mode makes 1.13 treat every tensor as a subclass
  (isTensorSubclassLike), which changes a few backward formulas.
* End of step: parameter (+ buffer), gradient and optimizer-state bytes from the tensors, as
  distinct storages.

Not counted: the `record_function` handles the optimizer's profiling hook makes
(`torch.zeros(1)` and `profiler::_record_function_enter`'s u8[288]), and in saved bytes the
wrapped Python scalars autograd keeps for `x * 2.0` (a 0-dim f64; host memory on a CUDA run).
Counted: the Adam/AdamW `step` counters (`torch.tensor(0.)`, 4 B each), real CPU memory that
memest's cpu-1.13 runtime models.

Step protocol (memest's, docs/step-model.md): zero_grad at the start of the step -> data (inputs
and targets made) -> forward -> loss -> backward -> [repeat per micro-batch] -> optimizer step.
The loop holds only the loss across backward; inputs, targets and the loss are dropped at the end
of each micro-batch. With `hold_outputs` (memest's --hold-outputs) the loop also keeps the
model's outputs as `outputs = model(**batch)` does: through backward and the optimizer step, and
into the next micro-batch (or step) until its forward and loss have returned. Step 1 is the
"first step", step 2 the "steady state".
"""
import contextlib
import dataclasses
import gc
import time

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.profiler import ProfilerActivity, profile
from torch.utils._pytree import tree_flatten

from recorder import ParamStore, Recorder

PHASES = ("DATA", "FORWARD", "LOSS", "BACKWARD", "OPTIMIZER_STEP")


@dataclasses.dataclass(frozen=True)
class Config:
    mode: str = "training"          # training | inference
    optimizer: str = "sgd"          # sgd | momentum | adam | adamw | hf-adamw | hf-adafactor
    impl: str = "for-loop"          # for-loop | foreach
    keep_grads: bool = False        # zero_grad(set_to_none=False)
    accum: int = 1                  # micro-batches per step
    weight_decay: float = 0.0
    checkpoint: str = "none"        # memest --checkpoint: none | every-block | every-k | sqrt
    checkpoint_k: int = 0           # memest --checkpoint-k (every-k)
    non_reentrant: bool = False     # memest --non-reentrant: torch.utils.checkpoint(use_reentrant=False)
    hold_outputs: bool = False      # memest --hold-outputs (else --no-hold-outputs): the loop keeps outputs

    @property
    def training(self):
        return self.mode == "training"

    def label(self):
        if not self.training:
            return "inference"
        parts = [self.optimizer, self.impl]
        if self.weight_decay:
            parts.append(f"wd={self.weight_decay:g}")
        parts.append("keep-grads" if self.keep_grads else "set-to-none")
        if self.accum > 1:
            parts.append(f"accum={self.accum}")
        if self.hold_outputs:
            parts.append("hold-outputs")
        if self.checkpoint != "none":
            parts.append(f"checkpoint={self.checkpoint}" + (f":{self.checkpoint_k}" if self.checkpoint == "every-k" else "")
                         + (",non-reentrant" if self.non_reentrant else ""))
        return ",".join(parts)


# ---------------------------------------------------------------------------------------------
# Host-side bookkeeping the tracker must not count.

_TRACKERS = []  # the active trackers (at most one of each kind)


@contextlib.contextmanager
def untracked():
    """Allocations the dispatch-mode tracker must not see as op outputs (the inputs, which the
    data phase registers itself)."""
    for t in _TRACKERS:
        t.suspended += 1
    try:
        yield
    finally:
        for t in _TRACKERS:
            t.suspended -= 1


@contextlib.contextmanager
def host_side():
    """Host-side bookkeeping no tracker counts (the optimizer's record_function handles)."""
    allocs = [t for t in _TRACKERS if isinstance(t, AllocTracker)]
    t0 = time.time_ns()
    for t in allocs:
        t._profiler_mark("memest.host.begin")
    with untracked():
        yield
    for t in allocs:
        t._profiler_mark("memest.host.end")
        t.excluded.append((t0, time.time_ns()))


def _patch_record_function():
    rf = torch.autograd.profiler.record_function
    if getattr(rf, "_memest_patched", False):
        return
    init, enter, exit_ = rf.__init__, rf.__enter__, rf.__exit__

    def _init(self, *a, **k):
        with host_side():
            init(self, *a, **k)

    def _enter(self):
        with host_side():
            return enter(self)

    def _exit(self, *a):
        with host_side():
            return exit_(self, *a)
    rf.__init__, rf.__enter__, rf.__exit__ = _init, _enter, _exit
    rf._memest_patched = True


_patch_record_function()


def _storage_key(t):
    st = t.storage()
    return st.data_ptr(), st.nbytes(), st


class SavedStorages:
    """What autograd saves for backward, by storage: a saved_tensors_hooks pack hook that notes
    each distinct storage (parameters', `param_storages`, and empty ones left out; wrapped Python
    scalars too) with the tensors saved from it, weakly, so that a storage freed again drops out."""

    def __init__(self, param_storages):
        self.pstores = param_storages
        self.saved = {}  # data pointer -> [StorageWeakRef, bytes, [descriptions]]

    def pack(self, t):
        if _is_wrapped_number(t):
            return t
        ptr, nb, st = _storage_key(t)
        if ptr in self.pstores or nb == 0:
            return t
        e = self.saved.get(ptr)
        if e is None or e[0].expired():
            self.saved[ptr] = [StorageWeakRef(st), nb, [_desc(t)]]
        else:
            e[2].append(_desc(t))
        return t.detach()

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)

    def alive(self):
        """(bytes, descriptions) of each storage still held."""
        return [(e[1], e[2]) for e in self.saved.values() if not e[0].expired()]


def _desc(t):
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"


# ---------------------------------------------------------------------------------------------
class LiveTracker(TorchDispatchMode):
    """Live storage bytes per phase, at aten-op granularity."""

    def __init__(self, keep_log=False):
        super().__init__()
        self.live = {}        # data_ptr -> [StorageWeakRef, nbytes, label, phase]
        self.bytes = 0
        self.phase = None
        self.peaks = {}
        self.peak_where = {}
        self.suspended = 0
        self.keep_log = keep_log
        self.log = []         # (phase, label, nbytes, live after) of every allocation
        self.ignored = {}     # data_ptr -> StorageWeakRef of host-side storages never counted

    def __enter__(self):
        _TRACKERS.append(self)
        return super().__enter__()

    def __exit__(self, *a):
        _TRACKERS.remove(self)
        return super().__exit__(*a)

    def purge(self):
        dead = [k for k, e in self.live.items() if e[0].expired()]
        for k in dead:
            e = self.live.pop(k)
            self.bytes -= e[1]
            if self.keep_log:
                self.log.append((self.phase, "free " + e[2], -e[1], self.bytes))

    def set_phase(self, phase):
        self.purge()
        self.phase = phase
        self.peaks[phase] = max(self.peaks.get(phase, 0), self.bytes)

    def ignore(self, t):
        ptr, nb, st = _storage_key(t)
        self.ignored[ptr] = StorageWeakRef(st)

    def register(self, t, label):
        ptr, nb, st = _storage_key(t)
        if nb == 0 or ptr == 0:
            return
        ign = self.ignored.get(ptr)
        if ign is not None:
            if not ign.expired():
                return
            del self.ignored[ptr]
        e = self.live.get(ptr)
        if e is not None:
            if not e[0].expired():
                return  # a view or an in-place result: already counted
            self.bytes -= e[1]
            del self.live[ptr]
        self.live[ptr] = [StorageWeakRef(st), nb, label, self.phase]
        self.bytes += nb
        if self.phase is not None and self.bytes > self.peaks.get(self.phase, 0):
            self.peaks[self.phase] = self.bytes
            self.peak_where[self.phase] = label
        if self.keep_log:
            self.log.append((self.phase, label, nb, self.bytes))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.purge()
        out = func(*args, **(kwargs or {}))
        if self.suspended:
            return out
        name = str(func)
        for o in tree_flatten(out)[0]:
            if isinstance(o, torch.Tensor):
                self.register(o, f"{name} -> {_desc(o)}")
        return out

    def snapshot(self):
        """Live storages now: [(label, nbytes, phase it was made in)]."""
        self.purge()
        return sorted(((e[2], e[1], e[3]) for e in self.live.values()), key=lambda x: -x[1])



class AllocTracker:
    """Live bytes per phase from the CPU allocator itself: every allocation and free the
    profiler's memory reporter sees (torch.profiler, profile_memory=True), with its address and
    a nanosecond time stamp. Unlike the dispatch mode, this sees the scratch a kernel allocates
    inside itself (e.g. native_layer_norm_backward's contiguous copy of its incoming gradient)
    and does not perturb autograd. Phases and host-side windows are marked by zero-length
    record_function events, which the profiler stamps on the allocation events' own clock.
    (Marks taken with Python's time.time_ns() were not stamped by the profiler: on a loaded CI
    machine they landed on the wrong side of a microsecond-short phase's allocations, and
    ops/add_scalar's first step read each phase's peak in the next phase.)"""

    def __init__(self):
        # The phases in the order marked (profiler event memest.phase.<i> is marks[i]'s), with
        # the Python clock's time, and the host-side windows on that clock, for the multi-rank
        # traces (tests/parallel/ranktrace.py), which replay them themselves.
        self.marks = []       # (time_ns, phase)
        self.excluded = []    # (t0, t1)
        self.suspended = 0
        self.baseline = {}    # data_ptr -> nbytes of what exists at the start of the step
        self.phase = None

    def register(self, t, label):
        if self.phase is None:  # the start of the step: parameters, grads, state
            ptr, nb, _ = _storage_key(t)
            if nb:
                self.baseline[ptr] = nb

    def set_phase(self, phase):
        self.phase = phase
        self.marks.append((time.time_ns(), phase))
        self._profiler_mark(f"memest.phase.{len(self.marks) - 1}")

    @staticmethod
    def _profiler_mark(name):
        """A zero-length event in the profiler's trace (it allocates nothing)."""
        handle = torch.ops.profiler._record_function_enter_new(name, None)
        torch.ops.profiler._record_function_exit._RecordFunction(handle)

    def purge(self):
        pass

    def __enter__(self):
        _TRACKERS.append(self)
        self.prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self.prof.__enter__()
        return self

    def __exit__(self, *a):
        self.prof.__exit__(*a)
        _TRACKERS.remove(self)

    def result(self):
        events, marks, windows = [], [], []

        def walk(n, host):
            ef = n.extra_fields
            if type(ef).__name__.endswith("Allocation"):
                events.append((n.start_time_ns, ef.alloc_size, ef.ptr, host))
            elif n.name.startswith("memest.phase."):
                marks.append((n.start_time_ns, self.marks[int(n.name.rsplit(".", 1)[1])][1]))
            elif n.name.startswith("memest.host."):
                windows.append((n.start_time_ns, n.name.endswith(".begin")))
            # The record_function handles (profiler::_record_function_enter's u8[288]) are
            # host-side bookkeeping wherever the clock puts them (the windows are the
            # fallback for the handle's zeros(1)).
            host = host or n.name.startswith("profiler::_record_function")
            for c in n.children:
                walk(c, host)
        for root in self.prof.profiler.kineto_results.experimental_event_tree():
            walk(root, False)
        events.sort(key=lambda e: e[0])
        marks.sort(key=lambda m: m[0])
        windows.sort(key=lambda w: w[0])
        live = sum(self.baseline.values())
        sizes, skip = {}, set()
        peaks, mi, wi, depth, phase = {}, 0, 0, 0, None
        for t, size, ptr, host in events:
            while mi < len(marks) and marks[mi][0] <= t:
                phase = marks[mi][1]
                peaks[phase] = max(peaks.get(phase, 0), live)
                mi += 1
            while wi < len(windows) and windows[wi][0] <= t:
                depth += 1 if windows[wi][1] else -1
                wi += 1
            if size > 0:
                if host or depth > 0:
                    skip.add(ptr)
                    continue
                sizes[ptr] = size
                live += size
            else:
                if ptr in skip:
                    skip.discard(ptr)
                    continue
                if ptr in sizes:
                    live -= sizes.pop(ptr)
                elif ptr in self.baseline:
                    live -= self.baseline.pop(ptr)
            if phase is not None:
                peaks[phase] = max(peaks.get(phase, 0), live)
        while mi < len(marks):
            peaks[marks[mi][1]] = max(peaks.get(marks[mi][1], 0), live)
            mi += 1
        return peaks, live


# ---------------------------------------------------------------------------------------------
def make_optimizer(cfg, params):
    foreach = cfg.impl == "foreach"
    wd = cfg.weight_decay
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=0.01, weight_decay=wd, foreach=foreach)
    if cfg.optimizer == "momentum":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=wd, foreach=foreach)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=1e-3, weight_decay=wd, foreach=foreach)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=wd, foreach=foreach)
    # transformers' own optimizers (a Python loop whatever `foreach` says), with their defaults.
    if cfg.optimizer == "hf-adamw":
        from transformers.optimization import AdamW
        return AdamW(params, lr=1e-3, weight_decay=wd, no_deprecation_warning=True)
    if cfg.optimizer == "hf-adafactor":
        from transformers.optimization import Adafactor
        return Adafactor(params, weight_decay=wd)  # lr=None: relative_step, scale_parameter
    raise ValueError(cfg.optimizer)


def _is_host_state(key, v):
    """Optimizer state that is not counted. None: 1.13's Adam/AdamW `step` counter
    (`torch.tensor(0.)`, a 0-dim f32 CPU tensor) is real memory on the CPU and memest's cpu-1.13
    runtime counts it (4 B per parameter); on a CUDA run it would be host memory."""
    return False


def _distinct_bytes(tensors):
    seen = {}
    for t in tensors:
        ptr, nb, _ = _storage_key(t)
        seen[ptr] = nb
    return sum(seen.values())


def end_of_step(store, opt):
    params = list(store.params.values()) + list(store.buffers.values())
    grads = [p.grad for p in store.params.values() if p.grad is not None]
    state = []
    if opt is not None:
        for st in opt.state.values():
            for k, v in st.items():
                if isinstance(v, torch.Tensor) and not _is_host_state(k, v):
                    state.append(v)
    return {
        "parameters": _distinct_bytes(params),
        "gradients": _distinct_bytes(grads),
        "optimizer_state": _distinct_bytes(state),
    }


def _baseline(tracker, store, opt):
    for n, p in store.params.items():
        tracker.register(p, f"parameter {n}")
        if p.grad is not None:
            tracker.register(p.grad, f"grad {n}")
    for n, b in store.buffers.items():
        tracker.register(b, f"buffer {n}")
    if opt is not None:
        for p, st in opt.state.items():
            for k, v in st.items():
                if isinstance(v, torch.Tensor):
                    if _is_host_state(k, v):
                        tracker.ignore(v)
                    else:
                        tracker.register(v, f"optimizer state {k}")


def _register_held(tracker, outputs):
    """The previous step's outputs the loop still holds, in the baseline (a function, so that no
    loop variable of the caller keeps one alive)."""
    for t in outputs:
        tracker.register(t, "the previous step's output")


def _is_wrapped_number(t):
    return t.dim() == 0 and t.dtype in (torch.float64, torch.int64) and t.grad_fn is None and not t.requires_grad


# ---------------------------------------------------------------------------------------------
class CaseRun:
    """One case under one configuration: the recorded graph and the measurements."""

    def __init__(self, fn, batch, cfg, seed=0):
        self.fn, self.batch, self.cfg = fn, batch, cfg
        torch.manual_seed(seed)
        self.store = ParamStore(seed)
        self.ckpt = {"checkpoint": cfg.checkpoint, "checkpoint_k": cfg.checkpoint_k,
                     "non_reentrant": cfg.non_reentrant, "hold_outputs": cfg.hold_outputs}
        rec = Recorder(self.store, training=cfg.training, **self.ckpt)
        result = fn(rec, batch)
        self.plan = rec.finish(result)
        self.model = rec.to_model_json(batch)
        self.n_ops = len(rec.ops)

    def measure_saved(self):
        """Distinct storages autograd holds at the end of forward + loss (bytes), with a list
        of them for diagnosis."""
        if not self.cfg.training:
            return 0, []
        saved = SavedStorages(self.store.storages())
        rec = Recorder(self.store, plan=self.plan, training=True, **self.ckpt)
        rec.make_inputs()
        with saved.hooks():
            result = self.fn(rec, self.batch)
        alive = saved.alive()
        total = sum(nb for nb, _ in alive)
        del result
        rec.release_all()
        del rec
        gc.collect()
        return total, sorted(alive, key=lambda x: -x[0])

    def run_steps(self, steps=2, method="allocator", keep_log=False):
        """Runs `steps` steps; returns one dict per step: peaks per phase, peak, end of step.
        method: "allocator" (AllocTracker, the truth the bounds are checked against) or
        "dispatch" (LiveTracker: names the op behind every storage, for --explain)."""
        cfg = self.cfg
        opt = make_optimizer(cfg, self.store.trainable()) if cfg.training else None
        results = []
        outputs = []  # what the loop's `outputs` variable holds (hold_outputs)
        for step in range(steps):
            if opt is not None:
                opt.zero_grad(set_to_none=not cfg.keep_grads)
            gc.collect()
            tracker = LiveTracker(keep_log=keep_log) if method == "dispatch" else AllocTracker()
            _baseline(tracker, self.store, opt)
            _register_held(tracker, outputs)  # the previous step's, still held
            with tracker, (contextlib.nullcontext() if cfg.training else torch.no_grad()):
                for mb in range(cfg.accum if cfg.training else 1):
                    tracker.set_phase("DATA")
                    rec = Recorder(self.store, plan=self.plan, tracker=tracker, training=cfg.training, **self.ckpt)
                    rec.make_inputs()
                    tracker.set_phase("FORWARD")
                    result = self.fn(rec, self.batch)
                    outputs = []  # `outputs = model(**batch)` returned: the previous ones go
                    if cfg.training:
                        loss = rec.take(result)
                        if cfg.hold_outputs:
                            outputs = rec.take_outputs()
                        tracker.set_phase("BACKWARD")
                        loss.backward()
                        del loss
                    del result
                    rec.release_all()
                    del rec
                    tracker.purge()
                if opt is not None:
                    tracker.set_phase("OPTIMIZER_STEP")
                    opt.step()
                tracker.purge()
            if method == "dispatch":
                peaks, live, where = dict(tracker.peaks), tracker.bytes, dict(tracker.peak_where)
            else:
                (peaks, live), where = tracker.result(), {}
            r = {
                "phases": peaks,
                "peak": max(peaks.values()),
                "peak_where": where,
                "end_of_step": end_of_step(self.store, opt),
                "live_at_end": live,
            }
            if keep_log:
                r["log"] = tracker.log
            results.append(r)
        return results
