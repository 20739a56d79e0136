"""memest.trace's record of when the module's Python code lets go of each tensor.

PyTorch frees a tensor when its last reference dies. The op graph says when the graph is done
with a tensor (its last reader), and memest's op rules say what autograd keeps; the rest is the
program's own references: a local variable lives until its function returns (a hand-written
attention's `dot`), a module's input until the module returns (nn.Module.__call__ holds its
arguments), the caller's variable until it is rebound (ResNet's `x = self.layer1(x)` keeps the
stem's output while layer1 runs). `Lifetimes` watches every tensor the trace records with a
weak reference (weakref.finalize) and notes, when the last object carrying a graph name dies,
how many ops had been recorded: the name was referenced until the op before.

The tracer must not keep what it watches alive: it knows tensors by id() and forgets an id when
its object dies (`forget` callbacks), and while recording, autograd's saved tensors are packed
into nothing (`watching`): a tensor autograd saves would otherwise live to the end of
the trace, and what autograd keeps is the engine's to model, not the program's. A view keeps
its base alive (its `_base`), as it keeps the storage: that is the program's too.

The result (`held_and_outputs`) is the op graph's `held` (a name and the op after which its
last reference died, where that is later than the graph's last use of it) and `outputs` (the
names the module returned).
"""
import contextlib
import weakref

import torch

__all__ = ["Lifetimes", "watching", "output_tensors", "held_and_outputs"]


class Lifetimes:
    """Live objects per graph name, and when each name's last object died.

    `clock()` is the number of ops recorded so far; `forget(oid)` is called when the object
    with id `oid` dies (the tracer drops the id from its maps)."""

    def __init__(self, clock, forget):
        self._clock = clock
        self._forget = forget
        self._watched = {}   # id -> weakref.finalize of a live object
        self._name_of = {}   # id -> the graph name its object carries
        self._count = {}     # name -> live objects carrying it
        self.died = {}       # name -> ops recorded when its last object died
        self.stopped = False

    def watch(self, t):
        """Watches tensor `t` until it dies (once per object)."""
        oid = id(t)
        if self.stopped or oid in self._watched:
            return
        self._watched[oid] = weakref.finalize(t, self._died, oid)

    def name(self, t, name):
        """Object `t` now carries graph name `name` (an op's output, an in-place op's new
        name for its input, a view the graph does not record)."""
        self.watch(t)
        oid = id(t)
        if oid not in self._watched:
            return
        old = self._name_of.get(oid)
        if old == name:
            return
        if old is not None:
            self._release(old)
        self._name_of[oid] = name
        self._count[name] = self._count.get(name, 0) + 1
        self.died.pop(name, None)

    def alive(self):
        """Names with a live object."""
        return {n for n, c in self._count.items() if c > 0}

    def stop(self):
        """Stops watching: later deaths are not recorded (the trace is over)."""
        self.stopped = True
        for f in list(self._watched.values()):
            f.detach()
        self._watched.clear()

    def _release(self, name):
        self._count[name] -= 1
        if self._count[name] == 0:
            self.died[name] = self._clock()

    def _died(self, oid):
        if self.stopped:
            return
        self._watched.pop(oid, None)
        name = self._name_of.pop(oid, None)
        if name is not None:
            self._release(name)
        self._forget(oid)


@contextlib.contextmanager
def watching(lifetimes):
    """The recording: autograd packs what it saves into nothing (the trace never runs backward),
    so that no tensor outlives the program's references because backward would need it; on an
    error the watch stops (no callback outlives a failed recording)."""
    try:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: None, lambda packed: None):
            yield
    except BaseException:
        lifetimes.stop()
        raise


def output_tensors(out):
    """The tensors of a module's output: a tensor, or tensors inside tuples, lists, dicts (a
    Hugging Face ModelOutput is one) and dataclass-like objects with `to_tuple()`."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in output_tensors(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in output_tensors(v)]
    if hasattr(out, "to_tuple"):
        return output_tensors(out.to_tuple())
    return []


def held_and_outputs(ops, lifetimes, output_names, loss_name, recorded_ops):
    """The op graph's `held` and `outputs` for `ops` (the final ops, each with "_seq": the index
    it was recorded at; fusions drop some recorded ops). `output_names` are the names the module
    returned, `recorded_ops` how many ops the trace recorded.

    A name whose last object died after recorded op k is held until the last final op recorded
    at or before k, where that is later than the graph's last reader of it. A name still alive
    when the trace ends that the module did not return (module state, a global) is held until
    the graph's last op."""
    made = {}
    last_use = {}
    for j, op in enumerate(ops):
        for nm in op["outputs"]:
            made.setdefault(nm, j)
            last_use.setdefault(nm, j)
        for nm in op["inputs"]:
            last_use[nm] = j
    # final op index of every recorded index: the last final op recorded at or before it
    at_or_before = [-1] * (recorded_ops + 1)
    seqs = [op["_seq"] for op in ops]
    j = -1
    for k in range(recorded_ops + 1):
        while j + 1 < len(seqs) and seqs[j + 1] <= k:
            j += 1
        at_or_before[k] = j
    outputs = [nm for nm in dict.fromkeys(output_names) if nm in made or nm in last_use]
    alive = lifetimes.alive()
    held = []
    for nm, j_made in made.items():
        if nm == loss_name or nm in outputs:
            continue
        if nm in alive:
            until = len(ops) - 1
        elif nm in lifetimes.died:
            k = lifetimes.died[nm]  # ops recorded when it died: referenced through op k - 1
            until = at_or_before[min(max(k - 1, 0), recorded_ops)] if k > 0 else -1
        else:
            continue
        if until > last_use[nm] and until >= j_made:
            held.append({"tensor": nm, "untilOp": until})
    return held, outputs
