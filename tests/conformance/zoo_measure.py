"""Measures a zoo model (a real torch.nn.Module) with the conformance suite's method (measure.py).

The same quantities, the same trackers and the same step protocol as a conformance case
(measure.CaseRun), on a module instead of a recorded case:

* saved for backward: distinct storages autograd packs during forward + loss
  (saved_tensors_hooks), still alive at the end of the loss; parameters and buffers excluded,
  inputs and targets included;
* peak live bytes per phase from the CPU allocator's own trace (measure.AllocTracker), over a
  baseline of the parameters, buffers, existing gradients and optimizer state;
* end of step: distinct storages of parameters (and buffers), gradients, optimizer state.

Step: zero_grad -> DATA (the inputs and the target, one allocation each) -> FORWARD
(`out = module(*inputs)`) -> LOSS (the loss memest.trace applies to the output, from its first
op) -> BACKWARD -> OPTIMIZER_STEP. The loop holds only the loss across backward: the module's
output is dropped once the loss is made, inputs and target at the end of the step, as memest's
step model assumes (docs/step-model.md); with the config's hold_outputs, every tensor of the
output is held until the next step's forward returns (memest --hold-outputs). Inference: module.eval(), torch.no_grad(), the output
held to the end.
"""
import contextlib
import gc

import torch
import torch.nn.functional as F

from measure import AllocTracker, SavedStorages, _baseline, _register_held, end_of_step, make_optimizer


def output_tensors(out):
    """Every tensor a model's output holds: itself, a model output's fields, nested tuples and
    lists (the legacy past_key_values), a cache's key_cache and value_cache."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        vals = list(out.values())
    elif isinstance(out, (tuple, list)):
        vals = list(out)
    elif hasattr(out, "key_cache"):
        vals = list(out.key_cache) + list(out.value_cache)
    else:
        return []
    return [t for v in vals for t in output_tensors(v)]


def first_tensor(out):
    """The tensor memest.trace applies the loss to (tracer._first_tensor): the output itself, a
    model output's `logits`, or its first tensor."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict) and isinstance(out.get("logits"), torch.Tensor):
        return out["logits"]
    if hasattr(out, "logits") and isinstance(out.logits, torch.Tensor):
        return out.logits
    vals = list(out.values()) if isinstance(out, dict) else list(out)
    for v in vals:
        if isinstance(v, torch.Tensor):
            return v
    raise TypeError(f"no tensor in the output ({type(out).__name__})")


def apply_loss(y, loss, tgt):
    """The loss memest.trace applies (tracer._apply_loss), on the measured run."""
    if loss == "cross_entropy":
        if y.dim() > 2:
            return F.cross_entropy(y.reshape(-1, y.shape[-1]), tgt.reshape(-1))
        return F.cross_entropy(y, tgt)
    if loss == "mse":
        return F.mse_loss(y, tgt)
    if loss == "sum":
        return y.sum()
    return loss(y, tgt) if tgt is not None else loss(y)


class _Store:
    def __init__(self, module):
        self.params = dict(module.named_parameters())
        self.buffers = {n: b for n, b in module.named_buffers() if b is not None}

    def trainable(self):
        return [p for p in self.params.values() if p.requires_grad]

    def storages(self):
        return {t.storage().data_ptr() for t in list(self.params.values()) + list(self.buffers.values())}


class ModuleRun:
    """One zoo model under one run configuration (measure.Config): the measurements."""

    def __init__(self, entry, cfg, seed=0):
        self.entry, self.cfg = entry, cfg
        torch.manual_seed(seed)
        self.module = entry.make()
        self.module.train(cfg.training)
        self.store = _Store(self.module)
        self.gen = torch.Generator().manual_seed(seed)

    def example(self):
        """The inputs and target (fresh tensors, as the data phase makes them)."""
        inputs = self.entry.inputs(self.entry.batch, self.gen)
        tgt = self.entry.target(self.entry.batch, self.gen) if self.entry.target and self.cfg.training else None
        return inputs, tgt

    def measure_saved(self):
        if not self.cfg.training:
            return 0
        saved = SavedStorages(self.store.storages())
        inputs, tgt = self.example()
        with saved.hooks():
            out = self.module(*inputs)
            y = first_tensor(out)
            del out
            loss = apply_loss(y, self.entry.loss, tgt)
            del y
        total = sum(nb for nb, _ in saved.alive())
        del loss, inputs, tgt
        gc.collect()
        return total

    def run_steps(self, steps=2):
        """One dict per step: peaks per phase, peak, end of step (measure.CaseRun.run_steps)."""
        cfg, entry = self.cfg, self.entry
        opt = make_optimizer(cfg, self.store.trainable()) if cfg.training else None
        results = []
        held = []  # the loop's `outputs` (cfg.hold_outputs): every tensor of the module's output
        for _ in range(steps):
            if opt is not None:
                opt.zero_grad(set_to_none=not cfg.keep_grads)
            gc.collect()
            tracker = AllocTracker()
            _baseline(tracker, self.store, opt)
            _register_held(tracker, held)  # the previous step's, still held
            with tracker, (contextlib.nullcontext() if cfg.training else torch.no_grad()):
                tracker.set_phase("DATA")
                inputs, tgt = self.example()
                tracker.set_phase("FORWARD")
                out = self.module(*inputs)
                if cfg.training:
                    y = first_tensor(out)
                    outputs = output_tensors(out) if cfg.hold_outputs else []
                    del out
                    tracker.set_phase("LOSS")
                    loss = apply_loss(y, entry.loss, tgt)
                    del y
                    # `outputs = model(**batch)` with the labels (the loss computed in the
                    # forward, as memest's step has it) returned: the previous ones go.
                    held = outputs
                    del outputs
                    tracker.set_phase("BACKWARD")
                    loss.backward()
                    del loss
                del inputs, tgt
                if not cfg.training:
                    del out
                if opt is not None:
                    tracker.set_phase("OPTIMIZER_STEP")
                    opt.step()
            peaks, live = tracker.result()
            results.append({"phases": peaks, "peak": max(peaks.values()),
                            "end_of_step": end_of_step(self.store, opt), "live_at_end": live})
        return results
