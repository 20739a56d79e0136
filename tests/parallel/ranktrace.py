"""The per-rank allocator trace of tests/parallel (imported through common.py, which puts
tests/conformance on the path first).

Every rank is measured the way the conformance suite measures one process
(tests/conformance/measure.py, reused by import): the CPU allocator's own trace from
torch.profiler (profile_memory=True), every allocation and free with its address and a
nanosecond time stamp, phases marked on the same clock, over a baseline of the tensors that
exist when the trace starts (the parameters). One trace per case and rank spans the
construction of the wrappers (DDP, ZeroRedundancyOptimizer) and every step, so that what a
wrapper allocates once (DDP's buckets) and frees later (their rebuild) is in the trace.

What the trace cannot see: allocations made on gloo's own worker threads (the profiler's
memory reporter is thread-local), and gloo's scratch, which it takes with new[] outside
PyTorch's allocator. The cases therefore only use collectives that work in place on tensors
the calling thread allocated (all_reduce, broadcast, send, recv); the all-gather and
reduce-scatter that Megatron calls are written on top of an in-place all_reduce
(common.all_gather_into_tensor, common.reduce_scatter_tensor), which allocates what NCCL's
collectives allocate: the output the caller passes, nothing else.

Unseen frees. A gloo work item holds its tensors, and the worker thread lets go of an item it
ran only once it has taken the next one (observed with 1.13: DDP's last bucket, dropped at the
end of a case, is freed on the worker thread unless another collective follows). When the
caller's reference is the other last one (a temporary of a collective), the storage is freed on
the worker thread and the trace never sees the free. So every case runs on common.GROUP, a gloo
process group with ONE worker thread, and a collective on a temporary is followed by
common.flush(): a
one-element all_reduce on a tensor that lives as long as the group, queued behind it, whose
completion means the worker has let go of the earlier item. DDP's constructor broadcasts the
parameters from rank 0 with a flat temporary copy (comm.cpp broadcast_coalesced);
common.ddp_construction() runs it through common.broadcast_coalesced, the same algorithm written
in Python with the flush. What remains unseen are a few small tensors inside DDP's constructor and
bucket rebuild (8 to 640 bytes), reported per rank as `unseen_frees` and left out of every
figure (Trace.analyse); run.py allows for them (PEAK_SLACK).

Blocks allocated before profiling: c10's ProfiledCPUMemoryReporter reports the free of a block
only if it saw the allocation, so the parameters are made under the profiler (common.record).
"""
import measure  # tests/conformance
from measure import AllocTracker

# The conformance suite's phases, and GRAD_SYNC: Megatron's finalize_model_grads under SP.
PHASES = ("DATA", "FORWARD", "LOSS", "BACKWARD", "GRAD_SYNC", "OPTIMIZER_STEP")


# ---------------------------------------------------------------------------------------------
class Trace(AllocTracker):
    """The conformance suite's allocator trace over a whole case: `mark(label)` starts a phase;
    `analyse()` gives, per label, the peak live bytes while it lasted and the live bytes when it
    began; `explain()` what was live at each peak."""

    def mark(self, label):
        self.set_phase(label)

    # The profiler as torch.profiler.profile(activities=[CPU], profile_memory=True) runs it,
    # without the Python-side parsing of every op event on exit (seconds per case here): only
    # the allocation events of the raw result are read.
    @staticmethod
    def profiler_config():
        from torch.autograd import ProfilerConfig, ProfilerState
        from torch._C._profiler import _ExperimentalConfig
        return ProfilerConfig(ProfilerState.KINETO, False, True, False, False, False, _ExperimentalConfig())

    def __enter__(self):
        from torch.autograd import ProfilerActivity, _enable_profiler, _prepare_profiler
        measure._TRACKERS.append(self)
        _prepare_profiler(self.profiler_config(), {ProfilerActivity.CPU})
        _enable_profiler(self.profiler_config(), {ProfilerActivity.CPU})
        return self

    def __exit__(self, *a):
        from torch.autograd import _disable_profiler
        self.result_tree = _disable_profiler().experimental_event_tree()
        measure._TRACKERS.remove(self)

    def _events(self):
        """Allocations and frees in time order: (ns, bytes, address, op), bytes < 0 for a free,
        op the outermost and the innermost op the profiler saw around it."""
        events = []

        def walk(n, top):
            ef = n.extra_fields
            if type(ef).__name__.endswith("Allocation"):
                inner = n.parent.name if n.parent is not None else "-"
                events.append((n.start_time_ns, ef.alloc_size, ef.ptr,
                               top if top == inner else f"{top} > {inner}"))
            for c in n.children:
                walk(c, top or n.name)
        for root in self.result_tree:
            walk(root, root.name if type(root.extra_fields).__name__.endswith("TorchOp") else None)
        events.sort(key=lambda e: e[0])
        return events

    def _replay(self, events, ignore=frozenset(), snapshot_at=None):
        """Live bytes through the trace. Returns (peaks, at_mark, live at the end, what is still
        live at the end {address: (event, bytes, phase)}, allocations whose free the trace did
        not see {event: (bytes, phase)}, the event at which each phase reached its peak).
        With snapshot_at (an event index, -1 for the trace's start), returns instead what is
        live just after that event: [(bytes, phase it was made in, op)]."""
        live = sum(self.baseline.values())
        baseline = dict(self.baseline)
        sizes, skip = {}, set()
        peaks, at_mark, unseen, peak_at = {}, {}, {}, {}
        marks = sorted(self.marks)
        mi, phase = 0, None

        def snapshot():
            return [(nb, "before the trace", "parameters and what else the trace started with")
                    for nb in baseline.values()] + \
                   [(nb, ph, events[j][3]) for j, nb, ph in sizes.values()]

        def enter_marks(t, i):
            nonlocal mi, phase
            while mi < len(marks) and marks[mi][0] <= t:
                phase = marks[mi][1]
                at_mark[phase] = live
                if live > peaks.get(phase, -1):
                    peaks[phase], peak_at[phase] = live, i - 1
                mi += 1
        if snapshot_at == -1:
            return snapshot()
        for i, (t, size, ptr, _) in enumerate(events):
            enter_marks(t, i)
            if size > 0:
                if i in ignore or any(t0 <= t <= t1 for t0, t1 in self.excluded):
                    skip.add(ptr)
                    continue
                skip.discard(ptr)
                if ptr in sizes:  # its free happened on another thread
                    j, old, ph = sizes.pop(ptr)
                    unseen[j] = (old, f"{ph} (address reused in {phase})")
                sizes[ptr] = (i, size, phase)
                live += size
            else:
                if ptr in skip:
                    skip.discard(ptr)
                    continue
                if ptr in sizes:
                    live -= sizes.pop(ptr)[1]
                elif ptr in baseline:
                    live -= baseline.pop(ptr)
            if phase is not None and live > peaks.get(phase, -1):
                peaks[phase], peak_at[phase] = live, i
            if snapshot_at == i:
                return snapshot()
        enter_marks(float("inf"), len(events))
        return peaks, at_mark, live, sizes, unseen, peak_at

    UNSEEN_LIMIT = 1024  # bytes: a larger allocation whose free the trace missed is an error

    def analyse(self, alive=()):
        """Peaks per mark, live bytes at each mark and at the end. Call it after the case has let
        go of everything but the tensors in `alive` (parameters, and what it still holds on
        purpose). An allocation whose free the trace did not see (its address handed out again
        while it was live, or still live at the end and not in `alive`) is left out of every
        figure and reported in `unseen_frees` [(bytes, phase)]: small tensors that DDP's
        constructor and bucket rebuild hand to gloo (8 to 640 bytes). A larger one would make
        the figures wrong for as long as it was counted: it raises."""
        events = self._events()
        left, unseen = self._replay(events)[3:5]
        keep = {storage_key(t)[0] for t in alive}
        for ptr, (i, size, ph) in left.items():
            if ptr not in keep:
                unseen[i] = (size, f"{ph} (alive at the end)")
        big = [u for u in unseen.values() if u[0] > self.UNSEEN_LIMIT]
        if big:
            raise RuntimeError(f"the trace missed the free of {big} (bytes, phase): a reference "
                               "outlived the case, or a free happened on gloo's worker thread")
        self._ignore = frozenset(unseen)
        self._events_cache = events
        peaks, at_mark, live, _, _, self._peak_at = self._replay(events, self._ignore)
        self.unseen_frees = sorted(unseen.values(), key=lambda x: -x[0])
        return peaks, at_mark, live

    def explain(self, phases):
        """For each phase label, what was live at its peak: [[bytes, count, phase made in, op]],
        largest first (identical allocations merged). After analyse()."""
        out = {}
        for ph in phases:
            items = self._replay(self._events_cache, self._ignore, self._peak_at[ph])
            merged = {}
            for nb, made, op in items:
                k = (nb, made, op)
                merged[k] = merged.get(k, 0) + 1
            out[ph] = sorted(([nb, n, made, op] for (nb, made, op), n in merged.items()),
                             key=lambda x: -x[0] * x[1])
        return out


class StepPhases:
    """What a Recorder in run mode calls its tracker: phases become "<step>.<PHASE>" marks of
    the case's Trace; inputs are seen by the trace itself."""

    def __init__(self, trace, step):
        self.trace, self.step = trace, step

    def set_phase(self, phase):
        self.trace.mark(f"{self.step}.{phase}")

    def register(self, t, label):
        pass


def step_results(peaks, at_mark, steps):
    """Per step: the peak of each phase, the step's peak, and the live bytes at its end."""
    out = []
    for s in range(1, steps + 1):
        ph = {p: peaks[f"{s}.{p}"] for p in PHASES if f"{s}.{p}" in peaks}
        out.append({"step": s, "phases": ph, "peak": max(ph.values()), "live_at_end": at_mark[f"{s}.END"]})
    return out


def storage_key(t):
    st = t.storage()
    return st.data_ptr(), st.nbytes(), st
