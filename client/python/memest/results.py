"""Typed results: what Client.estimate, presets() and devices() return.

Every byte count is an int in bytes (the proto's fields, unrounded); `format_bytes` gives the
human form the reprs use ("2.36 GiB"). Phases are the proto's Phase without its prefix:
"data", "forward", "loss", "backward", "optimizer_step".
"""

import dataclasses
import html
from typing import List, Optional

from memest import v1

CATEGORIES = ("parameters", "gradients", "optimizer_state", "master_and_casts", "activations",
              "temporaries", "inputs", "kv_cache", "workspace", "communication",
              "allocator_overhead", "cuda_context", "nccl")

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n):
    """n bytes in binary units with three significant digits: "0 B", "512 B", "2.36 GiB"."""
    n = int(n)
    if abs(n) < 1024:
        return "%d B" % n
    value = float(n)
    for unit in _UNITS:
        value /= 1024.0
        if abs(value) < 1000 or unit == _UNITS[-1]:
            break
    if abs(value) >= 100:
        return "%.0f %s" % (value, unit)
    if abs(value) >= 10:
        return "%.1f %s" % (value, unit)
    return "%.2f %s" % (value, unit)


def _phase_name(phase):
    name = v1.Phase.Name(phase)
    return name[len("PHASE_"):].lower()


def _from_same_named_fields(cls, message):
    """A dataclass whose every field is the message's field of the same name."""
    return cls(**{f.name: getattr(message, f.name) for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class MemoryByCategory:
    """Bytes by category; the categories partition the memory a step needs (see the proto)."""

    parameters: int = 0
    gradients: int = 0
    optimizer_state: int = 0
    master_and_casts: int = 0
    activations: int = 0
    temporaries: int = 0
    inputs: int = 0
    kv_cache: int = 0
    workspace: int = 0
    communication: int = 0
    allocator_overhead: int = 0
    cuda_context: int = 0
    nccl: int = 0

    @classmethod
    def from_proto(cls, message):
        return cls(**{name: getattr(message, name) for name in CATEGORIES})

    def as_dict(self):
        """{category: bytes} in the proto's order."""
        return {name: getattr(self, name) for name in CATEGORIES}

    @property
    def total(self):
        """The sum over all categories."""
        return sum(self.as_dict().values())


@dataclasses.dataclass(frozen=True)
class Peak:
    """A peak moment: allocated and reserved bytes, by category (allocated only), and where."""

    phase: str
    allocated_bytes: int
    reserved_bytes: int
    by_category: MemoryByCategory
    op: str = ""
    scope: str = ""
    micro_batch: int = 0
    recompute: bool = False

    @classmethod
    def from_proto(cls, message):
        return cls(phase=_phase_name(message.phase), allocated_bytes=message.allocated_bytes,
                   reserved_bytes=message.reserved_bytes,
                   by_category=MemoryByCategory.from_proto(message.by_category), op=message.op,
                   scope=message.scope, micro_batch=message.micro_batch,
                   recompute=message.recompute)

    @property
    def where(self):
        """"op cross_entropy in h.3.mlp", or "" between ops."""
        text = ("op " + self.op) if self.op else ""
        if self.scope:
            text += (" in " if text else "in ") + self.scope
        if self.recompute:
            text += " (recomputation)"
        return text


@dataclasses.dataclass(frozen=True)
class LayerRow:
    """One module scope's contribution."""

    scope: str
    parameter_bytes: int
    saved_bytes: int
    output_bytes: int
    temporary_bytes: int

    from_proto = classmethod(_from_same_named_fields)


@dataclasses.dataclass(frozen=True)
class Fit:
    """Whether the step fits the requested device; required = peak reserved + CUDA context."""

    device: str
    capacity_bytes: int
    required_bytes: int
    fits: bool
    headroom_bytes: int

    from_proto = classmethod(_from_same_named_fields)

    def __str__(self):
        verdict = "fits" if self.fits else "does NOT fit"
        return "%s %s: needs %s of %s (headroom %s)" % (
            verdict, self.device, format_bytes(self.required_bytes),
            format_bytes(self.capacity_bytes), format_bytes(self.headroom_bytes))


@dataclasses.dataclass(frozen=True)
class Serving:
    """A model served by vLLM (docs/serving.md): its settings with the defaults filled in; the
    startup budget on one GPU (requested_bytes = total x gpu_memory_utilization, less the
    weights, the profile run's activation peak and what is allocated outside PyTorch, is
    kv_cache_bytes); its pages (num_blocks of block_size tokens, kv_tokens in all); the answers
    (max_concurrency at max_model_len, concurrent_requests of request_tokens, longest_request at
    `concurrency`, longest_single_request); whether vLLM starts, and its refusal if not."""

    gpu_memory_utilization: float
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    kv_cache_dtype: str
    profile_requests: int
    requested_bytes: int
    weights_bytes: int
    activation_peak_bytes: int
    non_torch_bytes: int
    kv_cache_bytes: int
    kv_bytes_per_token: int
    kv_layers: int
    num_blocks: int
    kv_tokens: int
    max_concurrency: float
    request_tokens: int
    concurrent_requests: int
    concurrency: int
    longest_request: int
    longest_single_request: int
    baseline_bytes: int
    starts: bool
    refusal: str
    lora_bytes: int

    from_proto = classmethod(_from_same_named_fields)

    def __str__(self):
        if not self.starts:
            return "vLLM does not start: " + self.refusal
        return ("served: %s tokens of KV cache (%s), %.2fx at %d tokens a request; %d requests "
                "of %d tokens at once" % (
                    "{:,}".format(self.kv_tokens), format_bytes(self.kv_cache_bytes),
                    self.max_concurrency, self.max_model_len, self.concurrent_requests,
                    self.request_tokens))


@dataclasses.dataclass(frozen=True)
class Advice:
    """A diagnosis (kind "peak", saving 0) or a fix and the bytes it would save at the peak."""

    kind: str
    message: str
    saving_bytes: int
    scope: str = ""

    from_proto = classmethod(_from_same_named_fields)


@dataclasses.dataclass(frozen=True)
class DataParallelRanks:
    """A data-parallel estimate's ranks: `rank` of `world` is the one estimated (the one that
    holds the most); bucket_bytes are DDP's gradient buckets; owned_elements, under ZeRO-1, the
    parameter elements each rank's optimizer steps; host_bytes, the host (CPU) memory the rank
    keeps outside the GPU (DeepSpeed's offloaded optimizer; 0 otherwise)."""

    world: int
    rank: int
    bucket_bytes: List[int]
    owned_elements: List[int]
    host_bytes: int = 0

    @classmethod
    def from_proto(cls, message):
        return cls(world=message.world, rank=message.rank,
                   bucket_bytes=list(message.bucket_bytes),
                   owned_elements=list(message.owned_elements),
                   host_bytes=message.host_bytes)


@dataclasses.dataclass(frozen=True)
class ExpertParallelRanks:
    """An expert-parallel group's ranks (Megatron-LM's expert_model_parallel_size): `rank` of
    `size` is the one estimated, the one whose experts receive the most token choices
    (received_rows per mixture-of-experts layer); least_rank receives the fewest. Each rank
    holds local_experts experts of every layer."""

    size: int
    rank: int
    local_experts: int
    received_rows: int
    least_rank: int
    least_received_rows: int

    @classmethod
    def from_proto(cls, message):
        return cls(size=message.size, rank=message.rank, local_experts=message.local_experts,
                   received_rows=message.received_rows, least_rank=message.least_rank,
                   least_received_rows=message.least_received_rows)


@dataclasses.dataclass(frozen=True)
class PipelineStage:
    """One pipeline stage's estimate: the blocks it runs [first_block, last_block], its
    parameters (elements) and its peak."""

    stage: int
    first_block: int
    last_block: int
    parameter_count: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_phase: str

    @classmethod
    def from_proto(cls, message):
        return cls(stage=message.stage, first_block=message.first_block,
                   last_block=message.last_block, parameter_count=message.parameter_count,
                   peak_allocated_bytes=message.peak_allocated_bytes,
                   peak_reserved_bytes=message.peak_reserved_bytes,
                   peak_phase=_phase_name(message.peak_phase))


@dataclasses.dataclass(frozen=True)
class PipelineStages:
    """A pipeline's stages, each estimated; the Estimate is worst_stage's (the most reserved)."""

    stages: int
    micro_batches: int
    worst_stage: int
    per_stage: List[PipelineStage]

    @classmethod
    def from_proto(cls, message):
        return cls(stages=message.stages, micro_batches=message.micro_batches,
                   worst_stage=message.worst_stage,
                   per_stage=[PipelineStage.from_proto(s) for s in message.per_stage])


@dataclasses.dataclass(frozen=True, repr=False)
class Estimate:
    """The answer to one estimate (EstimateResponse), with tables and a plot.

    breakdown: bytes by category at the overall peak, allocator overhead, CUDA context and NCCL
    included, so breakdown.total == peak_reserved_bytes + breakdown.cuda_context
    + breakdown.nccl.
    peak: the largest allocated moment; phases: one Peak per phase that ran, in order.
    fit: None unless the request named a device or a capacity.
    data_parallel: None unless the request named data parallelism.
    expert_parallel: None unless the request named expert parallelism; then the estimate is the
    rank that receives the most (results.ExpertParallelRanks).
    pipeline: None unless the request named pipeline stages; then the estimate is the stage
    that needs the most and pipeline.per_stage lists every stage's peak.
    serving: None unless the request set serving; then the rest is vLLM's profile run and
    serving says what its KV cache holds (memest.Serving).
    recompute_fraction: the share of forward ops checkpointing runs again;
    communicated_bytes_per_step: what this rank sends per step (docs/planning.md, "Costs").
    """

    breakdown: MemoryByCategory
    peak: Peak
    peak_reserved_bytes: int
    phases: List[Peak]
    layers: List[LayerRow]
    fit: Optional[Fit]
    advice: List[Advice]
    notes: List[str]
    parameter_count: int
    trainable_parameter_count: int
    micro_batch: int
    op_count: int
    saved_for_backward_bytes: int
    end_of_step: MemoryByCategory
    data_parallel: Optional[DataParallelRanks] = None
    pipeline: Optional[PipelineStages] = None
    recompute_fraction: float = 0.0
    communicated_bytes_per_step: int = 0
    serving: Optional[Serving] = None
    expert_parallel: Optional[ExpertParallelRanks] = None
    label: str = ""
    response: Optional[v1.EstimateResponse] = dataclasses.field(default=None, compare=False)
    # The server's id for the call (its log line repeats it): the caller's request_id, or one the
    # server made.
    request_id: str = dataclasses.field(default="", compare=False)

    @classmethod
    def from_proto(cls, response, label="", request_id=""):
        return cls(
            breakdown=MemoryByCategory.from_proto(response.breakdown),
            peak=Peak.from_proto(response.peak),
            peak_reserved_bytes=response.peak_reserved_bytes,
            phases=[Peak.from_proto(p) for p in response.phases],
            layers=[LayerRow.from_proto(row) for row in response.layers],
            fit=Fit.from_proto(response.fit) if response.HasField("fit") else None,
            advice=[Advice.from_proto(a) for a in response.advice],
            notes=list(response.notes),
            parameter_count=response.parameter_count,
            trainable_parameter_count=response.trainable_parameter_count,
            micro_batch=response.micro_batch,
            op_count=response.op_count,
            saved_for_backward_bytes=response.saved_for_backward_bytes,
            end_of_step=MemoryByCategory.from_proto(response.end_of_step),
            data_parallel=(DataParallelRanks.from_proto(response.data_parallel)
                           if response.HasField("data_parallel") else None),
            pipeline=(PipelineStages.from_proto(response.pipeline)
                      if response.HasField("pipeline") else None),
            recompute_fraction=response.recompute_fraction,
            communicated_bytes_per_step=response.communicated_bytes_per_step,
            serving=(Serving.from_proto(response.serving)
                     if response.HasField("serving") else None),
            expert_parallel=(ExpertParallelRanks.from_proto(response.expert_parallel)
                             if response.HasField("expert_parallel") else None),
            label=label,
            response=response,
            request_id=request_id,
        )

    @property
    def required_bytes(self):
        """What nvidia-smi would show at the peak: peak reserved + CUDA context + NCCL."""
        return self.peak_reserved_bytes + self.breakdown.cuda_context + self.breakdown.nccl

    def fixes(self):
        """The advice entries that are fixes (everything but the "peak" diagnosis)."""
        return [a for a in self.advice if a.kind != "peak"]

    # --- tables ---------------------------------------------------------------------------

    def to_dataframe(self, table="categories"):
        """A pandas DataFrame of one of the result's tables; byte columns are int64 bytes.

        table="categories": index `category` (the 13 categories, proto order); columns
            `bytes` (the breakdown at the peak) and `share` (fraction of breakdown.total).
        table="phases": index `phase` (the phases that ran, in order); one column per
            category (allocated bytes at that phase's peak; allocator_overhead,
            cuda_context and nccl are 0 there, as in the proto), then `allocated_bytes`,
            `reserved_bytes`, `op`, `scope`.
        table="layers": index `scope` (per-layer rows, the server's order); columns
            `parameter_bytes`, `saved_bytes`, `output_bytes`, `temporary_bytes`.
        """
        pd = _import_pandas()
        if table == "categories":
            total = self.breakdown.total
            rows = [{"category": name, "bytes": value,
                     "share": (value / total) if total else 0.0}
                    for name, value in self.breakdown.as_dict().items()]
            frame = pd.DataFrame(rows, columns=["category", "bytes", "share"])
            frame["bytes"] = frame["bytes"].astype("int64")
            return frame.set_index("category")
        if table == "phases":
            columns = ["phase", *CATEGORIES, "allocated_bytes", "reserved_bytes", "op", "scope"]
            rows = [{"phase": p.phase, **p.by_category.as_dict(),
                     "allocated_bytes": p.allocated_bytes, "reserved_bytes": p.reserved_bytes,
                     "op": p.op, "scope": p.scope} for p in self.phases]
            frame = pd.DataFrame(rows, columns=columns)
            for name in (*CATEGORIES, "allocated_bytes", "reserved_bytes"):
                frame[name] = frame[name].astype("int64")
            return frame.set_index("phase")
        if table == "layers":
            columns = ["scope", "parameter_bytes", "saved_bytes", "output_bytes",
                       "temporary_bytes"]
            frame = pd.DataFrame([dataclasses.asdict(row) for row in self.layers],
                                 columns=columns)
            for name in columns[1:]:
                frame[name] = frame[name].astype("int64")
            return frame.set_index("scope")
        raise ValueError('table: expected "categories", "phases" or "layers", got %r' % (table,))

    # --- plot -----------------------------------------------------------------------------

    def plot(self, top_layers=10, figsize=(13, 5.5)):
        """A matplotlib Figure: memory by category across the phases, and the top layers.

        Left: one stacked bar per phase (allocated bytes by category at that phase's peak,
        then allocator overhead up to the phase's reserved bytes and the CUDA context, so a
        bar's top is what nvidia-smi would show); the overall peak is marked and the device
        capacity is a dashed line when the request named a device (listed as off scale in
        the legend when it is over 3 times the tallest bar). Right: the `top_layers`
        layers that keep the most for backward.
        """
        from memest.plot import plot_estimate
        return plot_estimate(self, top_layers=top_layers, figsize=figsize)

    # --- reprs ----------------------------------------------------------------------------

    def _summary_lines(self):
        head = self.label + ": " if self.label else ""
        lines = ["%s%s parameters, micro-batch %d, %d ops" % (
            head, _count(self.parameter_count), self.micro_batch, self.op_count)]
        where = self.peak.where
        lines.append("peak %s allocated, %s reserved, in %s%s" % (
            format_bytes(self.peak.allocated_bytes), format_bytes(self.peak_reserved_bytes),
            self.peak.phase, (" (" + where + ")") if where else ""))
        if self.serving is not None:
            lines.append(str(self.serving))
        elif self.fit is not None:
            lines.append(str(self.fit))
        return lines

    def __repr__(self):
        lines = ["<memest.Estimate " + self._summary_lines()[0]]
        lines += ["  " + line for line in self._summary_lines()[1:]]
        total = self.breakdown.total
        lines.append("  at the peak, by category:")
        for name, value in self.breakdown.as_dict().items():
            if value:
                lines.append("    %-20s %10s %6.1f%%" % (name, format_bytes(value),
                                                         100.0 * value / total))
        fixes = self.fixes()
        if fixes:
            lines.append("  best fix: %s" % fixes[0].message)
        return "\n".join(lines) + ">"

    def _repr_html_(self):
        e = html.escape
        total = self.breakdown.total
        parts = ["<div class='memest-estimate'>"]
        summary = self._summary_lines()
        parts.append("<b>memest estimate</b> &mdash; %s<br>" % e(summary[0]))
        parts.append("<b>%s</b><br>" % e(summary[1]))
        if self.fit is not None:
            color = "#1a7f37" if self.fit.fits else "#cf222e"
            parts.append("<span style='color:%s;font-weight:bold'>%s</span><br>"
                         % (color, e(summary[2])))
        parts.append("<table><tr><th>category</th><th>at the peak</th><th>share</th></tr>")
        for name, value in self.breakdown.as_dict().items():
            if value:
                parts.append("<tr><td>%s</td><td style='text-align:right'>%s</td>"
                             "<td style='text-align:right'>%.1f%%</td></tr>"
                             % (e(name), e(format_bytes(value)), 100.0 * value / total))
        parts.append("</table>")
        parts.append("<table><tr><th>phase</th><th>allocated</th><th>reserved</th>"
                     "<th>where</th></tr>")
        for p in self.phases:
            mark = " &#9664; peak" if p.phase == self.peak.phase else ""
            parts.append("<tr><td>%s%s</td><td style='text-align:right'>%s</td>"
                         "<td style='text-align:right'>%s</td><td>%s</td></tr>"
                         % (e(p.phase), mark, e(format_bytes(p.allocated_bytes)),
                            e(format_bytes(p.reserved_bytes)), e(p.where)))
        parts.append("</table>")
        if self.advice:
            parts.append("<ul>")
            for a in self.advice:
                saving = (" <i>(saves %s)</i>" % e(format_bytes(a.saving_bytes))
                          if a.saving_bytes else "")
                parts.append("<li>%s%s</li>" % (e(a.message), saving))
            parts.append("</ul>")
        parts.append("</div>")
        return "".join(parts)


@dataclasses.dataclass(frozen=True)
class PresetParam:
    name: str
    default_value: int
    description: str


@dataclasses.dataclass(frozen=True)
class PresetInfo:
    """A built-in model and its integer parameters."""

    name: str
    family: str
    description: str
    params: List[PresetParam]

    @classmethod
    def from_proto(cls, message):
        return cls(name=message.name, family=message.family, description=message.description,
                   params=[PresetParam(p.name, p.default_value, p.description)
                           for p in message.params])


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """A GPU of the device catalog."""

    name: str
    description: str
    capacity_bytes: int
    cuda_context_bytes: int
    cublas_workspace_bytes: int
    compute_capability: int

    from_proto = classmethod(_from_same_named_fields)


def _count(n):
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return "%.3g%s" % (n / size, unit)
    return str(n)


def _import_pandas():
    try:
        import pandas
    except ImportError:
        raise ImportError("to_dataframe() needs pandas: pip install 'memest[dataframe]'") \
            from None
    return pandas
