"""The labelled per-rank allocator trace of tests/parallel/fsdp2.py (PyTorch 2.x by hand, gloo,
the CPU): ranktrace.Trace (the conformance suite's allocator trace, by import) with a name for
every allocation FSDP2 makes, and the two things gloo needs so that the trace sees every free.

Labels. The probes (`install_probes`) wrap FSDP2's own functions without changing what they do
and name each buffer when FSDP2 makes or hands it over: the sharded parameters (after
fully_shard), the flat all-gather buffer (`AllGather.allocate`), the copy-in temporary of the
mixed-precision fast path (`_get_param_all_gather_inputs`), the unsharded parameters
(`FSDPParam.alloc_all_gather_outputs`), the unsharded gradients (at `post_backward`, before
FSDP2 takes them), the reduce-scatter input and output (`ReduceScatter.allocate`, in that
order), the sharded gradients (after `post_backward`). A label belongs to the allocation live
at that address when it is given (a later label is appended: "reduce-scatter output h.2 =
sharded grad h.2"). What gloo allocates is named by the op the profiler saw around it;
everything else by its op and the phase it was made in (activations, autograd's temporaries).

What gloo needs (the same problem as the 1.13 suite's, ranktrace.py, "Unseen frees").
- ProcessGroupGloo in 2.x runs a work item under the caller's thread-local state
  (`AsyncWork::execute`: `at::ThreadLocalStateGuard g(work->getTLS())`), so the profiler sees
  what the worker allocates and frees INSIDE a collective (the all-gather's flat output). The
  worker drops its reference to an item after `execute` returns, outside that state: when the
  worker's reference is the last one (the reduce-scatter's clone of its input, held by the
  all-reduce item it queued), the free is invisible, and it happens whenever the worker gets
  to it. So the default group is created with ONE worker thread (`install_gloo_one_thread`),
  and every FSDP2 all-gather and reduce-scatter is followed, before it returns, by `flush`: a
  one-element all-reduce queued behind it, whose completion means the worker has let go of
  the collective's item; the caller's references then go last, on the caller's thread, at
  the end of the collective. The flush's own bytes are excluded from the trace (a window).
"""
import bisect
import collections
import contextlib
import datetime
import time

import torch
import torch.distributed as dist

from ranktrace import Trace, storage_key  # tests/parallel (tests/conformance on the path)


# ---------------------------------------------------------------------------------------------
def install_gloo_one_thread(timeout_s=120):
    """Every gloo group created from now on (the default group, DeviceMesh's) has one worker
    thread (ProcessGroupGloo's default is two): collectives run in the order they are queued,
    which `flush` relies on."""
    from torch.distributed import distributed_c10d as c10d

    def create(opts, backend_options):
        o = dist.ProcessGroupGloo._Options()
        o._devices = [dist.ProcessGroupGloo.create_default_device()]
        o._threads = 1
        o._timeout = datetime.timedelta(seconds=timeout_s)
        pg = dist.ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, o)
        pg.options.global_ranks_in_group = opts.global_ranks_in_group
        pg.options.group_name = opts.group_id
        return pg
    c10d.Backend._ensure_backend_registered("gloo")  # entry point (2.15), or built in
    old = c10d.Backend._plugins.get("GLOO")
    if old is None:
        c10d._register_builtin_gloo_backend()
        old = c10d.Backend._plugins["GLOO"]
    c10d.Backend._plugins["GLOO"] = c10d.Backend._BackendPlugin(create, old.extended_api)


class LabelledTrace(Trace):
    """A case's trace on one rank: marks, labels, flush windows; `analyse()` after it closed."""

    def __init__(self):
        super().__init__()
        self.labels = []      # (time_ns, data pointer, label)
        self._flush = torch.zeros(1)

    def label(self, t, text):
        if t is None:
            return
        ptr, nb, _ = storage_key(t)
        if nb and ptr:
            self.labels.append((time.time_ns(), ptr, text))

    def flush(self, group):
        """Returns once the single gloo worker has let go of everything queued before."""
        t0 = time.time_ns()
        dist.all_reduce(self._flush, group=group)
        self.excluded.append((t0, time.time_ns()))

    def _events(self):
        """Allocations and frees in time order: (ns, bytes, address, op path), bytes < 0 for a
        free, the path every op and record_function the profiler saw around it, outermost first
        (the worker thread's collectives are roots of their own: "gloo:all_gather > ...")."""
        events = []

        def walk(n, path):
            ef = n.extra_fields
            if type(ef).__name__.endswith("Allocation"):
                events.append((n.start_time_ns, ef.alloc_size, ef.ptr, " > ".join(path) or "-"))
                return
            path = path + [n.name] if type(ef).__name__.endswith("TorchOp") else path
            for c in n.children:
                walk(c, path)
        for root in self.result_tree:
            walk(root, [])
        events.sort(key=lambda e: e[0])
        return events

    # -----------------------------------------------------------------------------------------
    def analyse(self, alive=()):
        """Replays the trace. Returns {"peaks": {mark: bytes}, "at_mark": {mark: live bytes when
        it began}, "peak_at": {mark: event index}, "unseen": [(bytes, label)]} and keeps what
        `live_set` and `lifetimes` need. `alive`: tensors the case still holds on purpose."""
        events = self._events()
        self._ev = events
        ex = sorted(self.excluded)
        ex_starts = [a for a, _ in ex]

        def excluded(t):
            i = bisect.bisect_right(ex_starts, t) - 1
            return i >= 0 and t <= ex[i][1]
        marks = sorted(self.marks)
        labels = sorted(self.labels)
        # merged timeline: (t, kind, payload); kind 0 = mark, 1 = label, 2 = event (marks and
        # labels at the same ns come first: a label names what is live when it is given)
        tl = [(t, 0, m) for t, m in marks] + [(t, 1, (p, s)) for t, p, s in labels] + \
             [(e[0], 2, i) for i, e in enumerate(events)]
        tl.sort(key=lambda x: (x[0], x[1]))
        live, sizes, skip = [0, 0], {}, set()  # live: [all, without gloo's copies]
        self.alloc_label = collections.defaultdict(list)   # event index -> [labels]
        self.free_at = {}                                    # alloc event index -> free event index
        self.alloc_phase, self.unknown_frees = {}, 0
        self.coll_group, coll = {}, "?"  # gloo's allocations: the group of the collective
        peaks, peak_at = ({}, {}), ({}, {})
        at_mark, phase, unseen = {}, None, []

        def add(j, nb):
            live[0] += nb
            if j not in self.coll_group:
                live[1] += nb
        for t, kind, x in tl:
            if kind == 0:
                phase = x
                at_mark[phase] = live[0]
                for v in (0, 1):
                    peaks[v][phase], peak_at[v][phase] = live[v], ("mark", x)
                continue
            if kind == 1:
                p, s = x
                if p in sizes and s not in self.alloc_label[sizes[p][0]]:
                    self.alloc_label[sizes[p][0]].append(s)
                continue
            _, size, ptr, op = events[x]
            if size > 0:
                if excluded(t):
                    skip.add(ptr)
                    continue
                skip.discard(ptr)
                if "c10d::" in op:
                    coll = group_of(op)
                if op.startswith("gloo:") or "c10d::" in op:
                    self.coll_group[x] = coll
                if ptr in sizes:  # its free happened where the trace cannot see
                    j, old = sizes.pop(ptr)
                    unseen.append((old, j))
                    add(j, -old)
                sizes[ptr] = (x, size)
                self.alloc_phase[x] = phase
                add(x, size)
            else:
                if ptr in skip:
                    skip.discard(ptr)
                    continue
                if ptr in sizes:
                    j, old = sizes.pop(ptr)
                    self.free_at[j] = x
                    add(j, -old)
                else:
                    self.unknown_frees += 1
            for v in (0, 1):
                if phase is not None and live[v] > peaks[v][phase]:
                    peaks[v][phase], peak_at[v][phase] = live[v], ("event", x)
        keep = {storage_key(t)[0] for t in alive}
        for ptr, (j, size) in sizes.items():
            if ptr not in keep:
                unseen.append((size, j))
        self.peaks, self.peak_at = peaks[0], peak_at[0]
        self.peaks_nccl, self.peak_at_nccl = peaks[1], peak_at[1]
        self.at_mark = at_mark
        self._marks, self._times = marks, [e[0] for e in events]
        self.unseen = [[nb, self.name(j)] for nb, j in sorted(unseen, key=lambda u: -u[0])]
        return self

    def name(self, j):
        """What allocation j is: its labels, or where the profiler saw it made."""
        if self.alloc_label.get(j):
            return " = ".join(self.alloc_label[j])
        op = self._ev[j][3]
        if "gloo:" in op or "c10d::" in op:
            return gloo_name(op, self.coll_group.get(j, "?"))
        ph = (self.alloc_phase.get(j) or "?").split(".")[-1]
        return f"{'activation' if ph in ('FORWARD', 'LOSS') else 'temporary'} [{short(op)}] ({ph.lower()})"

    def peak_index(self, mark, nccl=False):
        """The event at which `mark`'s peak was reached (the last one before the mark when the
        peak is what was live as it began)."""
        kind, x = (self.peak_at_nccl if nccl else self.peak_at)[mark]
        if kind == "mark":
            t = next(t for t, m in self._marks if m == mark)
            return bisect.bisect_left(self._times, t) - 1
        return x

    def peak_where(self, mark, nccl=False):
        """Where `mark`'s peak was reached: the op path of the allocation that made it (or of
        the last event before the mark began)."""
        i = self.peak_index(mark, nccl)
        return short(self._ev[i][3]) if i >= 0 else "-"

    def live_set(self, mark, nccl=False):
        """What was live at `mark`'s peak: {name: bytes}, merged by name, largest first; with
        nccl, at the peak of the figure without gloo's copies, and without them."""
        idx = self.peak_index(mark, nccl)
        out = collections.Counter()
        for j, e in enumerate(self._ev[:idx + 1]):
            if e[1] > 0 and j in self.alloc_phase and self.free_at.get(j, len(self._ev)) > idx:
                if not (nccl and j in self.coll_group):
                    out[self.name(j)] += e[1]
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))

    def lifetimes(self, marks):
        """FSDP2's buffers, what else is made inside FSDP2's hooks, and gloo's copies, made while
        one of `marks` lasted: [name, bytes,
        count, phase made, where, phase freed, where], allocations with the same name, phases
        and places merged (a group's unsharded parameters are one line), in order of making.
        Phase and place of the free are None for what outlived the trace."""
        marks_t = [t for t, _ in self._marks]

        def phase_at(t):
            i = bisect.bisect_right(marks_t, t) - 1
            return self._marks[i][1] if i >= 0 else None
        rows = {}
        for j, e in enumerate(self._ev):
            if e[1] <= 0 or self.alloc_phase.get(j) not in marks:
                continue
            nm = self.name(j)
            if not (self.alloc_label.get(j) or nm.startswith("gloo") or "FSDP::" in e[3]) or nm == "input":
                continue
            f = self.free_at.get(j)
            key = (nm, self.alloc_phase[j], short(e[3]), phase_at(self._ev[f][0]) if f is not None else None,
                   short(self._ev[f][3]) if f is not None else None)
            r = rows.setdefault(key, [0, 0])
            r[0] += e[1]
            r[1] += 1
        return [[k[0], v[0], v[1], *k[1:]] for k, v in rows.items()]


def group_of(path):
    """The FSDP2 group whose collective an op path is in: "FSDP::all_gather (h.1)" -> h.1,
    the root's record_functions carry no name."""
    for q in reversed(path.split(" > ")):
        if q.startswith(("FSDP::all_gather", "FSDP::post_backward_reduce")):
            return q[q.index("(") + 1:-1] if "(" in q else "root"
    return "?"


GLOO_COPIES = (
    ("c10d::_allgather_base_", "gloo all-gather: flat output copy for the flight recorder"),
    ("c10d::allgather_", "gloo all-gather: flat output copy for the flight recorder"),  # FSDP1's list form
    ("gloo:all_gather", "gloo all-gather: worker's flat output"),
    ("c10d::_reduce_scatter_base_", "gloo reduce-scatter: clone of the input"),
    ("gloo:all_reduce", "gloo all-reduce (AVG): divisor scalars"),
)


def gloo_name(path, group):
    """What gloo allocates inside a collective, by the op it is made in (ProcessGroupGloo.cpp:
    `enqueue` records `work->getOutputTensors()` in the FlightRecorder, which for an
    all-gather is `newLikeFlat(outputs[0])`; AsyncAllgatherWork::allgather gathers into
    `newLikeFlat(outputs[0])` and copies out; `reduce_scatter_tensor_coalesced` all-reduces
    `inputTensors[i].clone()` and copies this rank's chunk out)."""
    for op, name in GLOO_COPIES:
        if op in path:
            return f"{name} {group}"
    return f"gloo [{short(path)}] {group}"


def short(path):
    """An op path as the documents cite it (FSDP1's own record_functions, which name no unit,
    left out): FSDP2's record_functions, the fsdp::, c10d:: and
    gloo ops, the optimizer's step and autograd's node, then the first two ops below the last of
    those (the first two ops when there is none of them)."""
    parts = [q for q in path.split(" > ") if not q.startswith("FullyShardedDataParallel.")]  # FSDP1's own
    keep, last = [], -1
    for i, q in enumerate(parts):
        if q.startswith(("FSDP::", "fsdp::", "c10d::", "gloo:", "Optimizer.")):
            keep.append(q)
            last = i
        elif q.startswith("autograd::engine::evaluate_function: "):
            keep.append(q.split(": ", 1)[1])
            last = i + 1 if i + 1 < len(parts) and parts[i + 1] == keep[-1] else i
    return " > ".join(keep + [q for q in parts[last + 1:last + 3] if q != "-"]) or "-"


# ---------------------------------------------------------------------------------------------
class Probes:
    """FSDP2's functions wrapped to name what they allocate (see the module docstring) and to
    flush gloo after each collective. `trace` is the trace of the case running (or None)."""

    def __init__(self):
        self.trace = None
        self.group = []          # the FSDPParamGroup being worked on (innermost last)
        self._rs_next = "input"

    def g(self):
        return (self.group[-1]._module_fqn or "root") if self.group else "?"

    def label(self, t, s):
        if self.trace is not None:
            self.trace.label(t, s)

    @contextlib.contextmanager
    def in_group(self, pg):
        self.group.append(pg)
        try:
            yield
        finally:
            self.group.pop()

    def install(self):
        from torch.distributed.fsdp._fully_shard import _fsdp_collectives as C
        from torch.distributed.fsdp._fully_shard import _fsdp_param as P
        from torch.distributed.fsdp._fully_shard import _fsdp_param_group as G
        pr = self

        def wrap_group_method(name):
            orig = getattr(G.FSDPParamGroup, name)

            def f(self, *a, **k):
                with pr.in_group(self):
                    return orig(self, *a, **k)
            setattr(G.FSDPParamGroup, name, f)
        for name in ("unshard", "wait_for_unshard", "reshard"):
            wrap_group_method(name)

        orig_post_backward = G.FSDPParamGroup.post_backward

        def post_backward(self, *a):
            with pr.in_group(self):
                for fp in self.fsdp_params:
                    up = getattr(fp, "_unsharded_param", None)
                    if up is not None and up.grad is not None:
                        pr.label(up.grad, f"unsharded grad {pr.g()}")
                out = orig_post_backward(self, *a)
                for fp in self.fsdp_params:
                    gr = fp.sharded_param.grad
                    if gr is not None:
                        pr.label(gr._local_tensor, f"sharded grad {pr.g()}")
                return out
        G.FSDPParamGroup.post_backward = post_backward

        orig_ag_alloc = C.DefaultAllGather.allocate

        def ag_allocate(self, size, *, dtype, device):
            out = orig_ag_alloc(self, size, dtype=dtype, device=device)
            pr.label(out, f"all-gather buffer {pr.g()}")
            return out
        C.DefaultAllGather.allocate = ag_allocate

        def ag_call(self, output_tensor, input_tensor, group, async_op=False):
            work = dist.all_gather_single(output_tensor, input_tensor, group=group, async_op=True)
            if async_op:
                return work
            work.wait()
            pr.trace.flush(group)
            return None
        C.DefaultAllGather.__call__ = ag_call

        orig_inputs = C._get_param_all_gather_inputs

        def get_inputs(fsdp_params):
            res = orig_inputs(fsdp_params)
            for fp, ts in zip(fsdp_params, res):
                for t in ts:
                    if storage_key(t)[0] != storage_key(fp._sharded_param_data)[0]:
                        pr.label(t, f"copy-in temporary {pr.g()}")
            return res
        C._get_param_all_gather_inputs = get_inputs

        orig_alloc_out = P.FSDPParam.alloc_all_gather_outputs

        def alloc_outputs(self):
            orig_alloc_out(self)
            for t in self.all_gather_outputs:
                pr.label(t, f"unsharded param {pr.g()}")
        P.FSDPParam.alloc_all_gather_outputs = alloc_outputs

        orig_rs_alloc = C.DefaultReduceScatter.allocate

        def rs_allocate(self, size, *, dtype, device):
            out = orig_rs_alloc(self, size, dtype=dtype, device=device)
            pr.label(out, f"reduce-scatter {pr._rs_next} {pr.g()}")
            pr._rs_next = "output" if pr._rs_next == "input" else "input"
            return out
        C.DefaultReduceScatter.allocate = rs_allocate

        def rs_call(self, output_tensor, input_tensor, group, op, async_op=False):
            work = dist.reduce_scatter_single(output=output_tensor, input=input_tensor, group=group,
                                              op=op, async_op=True)
            if async_op:
                return work
            work.wait()
            pr.trace.flush(group)
            return None
        C.DefaultReduceScatter.__call__ = rs_call
        return self
