"""Validation results: what Client.validate returns.

A validation replays the estimated step on the server's GPU (memest-server --device N) and
measures it. Every Comparison holds the predicted and the measured bytes of one quantity and
rel_error = (predicted - measured) / measured; `measured` is False where the device could not
measure it (no NVML for the CUDA context, say).
"""

import dataclasses
from typing import List, Optional

from memest import v1
from memest.errors import MemestError
from memest.results import Estimate, _phase_name, format_bytes


@dataclasses.dataclass(frozen=True)
class Comparison:
    name: str
    predicted_bytes: int
    measured_bytes: int
    rel_error: float
    measured: bool

    @classmethod
    def from_proto(cls, m):
        return cls(m.name, m.predicted_bytes, m.measured_bytes, m.rel_error, m.measured)

    def __str__(self):
        measured = format_bytes(self.measured_bytes) if self.measured else "not measured"
        error = "%+.2f%%" % (100 * self.rel_error) if self.measured else "-"
        return "%s: predicted %s, measured %s (%s)" % (
            self.name, format_bytes(self.predicted_bytes), measured, error)


@dataclasses.dataclass(frozen=True)
class PhaseComparison:
    phase: str
    allocated: Comparison
    reserved: Comparison
    measured_device_bytes: int  # -1: not measured

    @classmethod
    def from_proto(cls, m):
        return cls(_phase_name(m.phase), Comparison.from_proto(m.allocated),
                   Comparison.from_proto(m.reserved), m.measured_device_bytes)


@dataclasses.dataclass(frozen=True)
class OpTiming:
    op: int
    kind: str
    scope: str
    phase: str
    recompute: bool
    kernels: List[str]
    milliseconds: float
    workspace_bytes: int
    memory_only: str

    @classmethod
    def from_proto(cls, m):
        return cls(m.op, m.kind, m.scope, _phase_name(m.phase), m.recompute, list(m.kernels),
                   m.milliseconds, m.workspace_bytes, m.memory_only)


@dataclasses.dataclass(frozen=True)
class Progress:
    """One progress event: stage is "queued", "probing", "planning", "replaying" or "finishing"."""

    stage: str
    queue_position: int
    ops_done: int
    ops_total: int
    message: str

    @classmethod
    def from_proto(cls, m):
        stage = v1.ValidateProgress.Stage.Name(m.stage)[len("STAGE_"):].lower()
        return cls(stage, m.queue_position, m.ops_done, m.ops_total, m.message)


class _Collector:
    """Takes the events of one Validate stream (sync or asyncio): progress goes to the
    callback, the result is kept for validation()."""

    def __init__(self, progress, label):
        self._progress, self._label, self._result = progress, label, None

    def take(self, event):
        if event.HasField("progress") and self._progress is not None:
            self._progress(Progress.from_proto(event.progress))
        if event.HasField("result"):
            self._result = event.result

    def validation(self):
        if self._result is None:
            raise MemestError("Validate ended without a result")
        return Validation.from_proto(self._result, label=self._label)


@dataclasses.dataclass(frozen=True, repr=False)
class Validation:
    """The answer to one validation (ValidationResult)."""

    device_name: str
    device_total_bytes: int
    batch_size: int
    scaled_down: bool
    scaled_down_note: str
    estimate: Estimate
    categories: List[Comparison]
    peak_allocated: Comparison
    peak_reserved: Comparison
    device_total: Comparison
    phases: List[PhaseComparison]
    ops: List[OpTiming]
    step_milliseconds: float
    ops_run: int
    ops_memory_only: int
    notes: List[str]
    result: Optional[v1.ValidationResult] = dataclasses.field(default=None, compare=False)

    @classmethod
    def from_proto(cls, r, label=""):
        return cls(
            device_name=r.device.name,
            device_total_bytes=r.device.total_bytes,
            batch_size=r.batch_size,
            scaled_down=r.scaled_down,
            scaled_down_note=r.scaled_down_note,
            estimate=Estimate.from_proto(r.estimate, label=label),
            categories=[Comparison.from_proto(c) for c in r.categories],
            peak_allocated=Comparison.from_proto(r.peak_allocated),
            peak_reserved=Comparison.from_proto(r.peak_reserved),
            device_total=Comparison.from_proto(r.device_total),
            phases=[PhaseComparison.from_proto(p) for p in r.phases],
            ops=[OpTiming.from_proto(o) for o in r.ops],
            step_milliseconds=r.step_milliseconds,
            ops_run=r.ops_run,
            ops_memory_only=r.ops_memory_only,
            notes=list(r.notes),
            result=r,
        )

    def to_dataframe(self, table="categories"):
        """A pandas DataFrame: table="categories" (index `name`: the peak quantities, then
        every category; columns predicted_bytes, measured_bytes, rel_error, measured),
        "phases" (index `phase`) or "ops" (one row per op run, slowest first)."""
        import pandas as pd
        if table == "categories":
            rows = [self.peak_allocated, self.peak_reserved, self.device_total, *self.categories]
            return pd.DataFrame([dataclasses.asdict(c) for c in rows]).set_index("name")
        if table == "phases":
            return pd.DataFrame([{
                "phase": p.phase,
                "allocated_predicted": p.allocated.predicted_bytes,
                "allocated_measured": p.allocated.measured_bytes,
                "reserved_predicted": p.reserved.predicted_bytes,
                "reserved_measured": p.reserved.measured_bytes,
                "device_measured": p.measured_device_bytes,
            } for p in self.phases]).set_index("phase")
        if table == "ops":
            frame = pd.DataFrame([dataclasses.asdict(o) for o in self.ops])
            return frame.sort_values("milliseconds", ascending=False).reset_index(drop=True)
        raise ValueError("table: one of 'categories', 'phases', 'ops', got %r" % (table,))

    def __repr__(self):
        lines = ["memest.Validation(%s on %s, batch %d)" % (
            self.estimate.label or "model", self.device_name, self.batch_size)]
        if self.scaled_down:
            lines.append("  scaled down: " + self.scaled_down_note)
        for c in (self.peak_allocated, self.peak_reserved, self.device_total):
            lines.append("  " + str(c))
        lines.append("  kernel time of the step: %.3f ms (%d ops ran, %d as memory only)" % (
            self.step_milliseconds, self.ops_run, self.ops_memory_only))
        return "\n".join(lines)
