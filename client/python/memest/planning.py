"""Plans that fit (the Plan RPC, docs/planning.md): memest.Plan and the request Client.plan
sends."""

import dataclasses

from memest import v1
from memest.request import build_request, parse_capacity
from memest.results import format_bytes

STRATEGIES = {v1.DATA_PARALLEL_UNSPECIFIED: "none", v1.DATA_PARALLEL_DDP: "ddp",
              v1.DATA_PARALLEL_ZERO1: "zero1",
              v1.DATA_PARALLEL_DEEPSPEED_ZERO2: "deepspeed-zero2",
              v1.DATA_PARALLEL_DEEPSPEED_ZERO1: "deepspeed-zero1",
              v1.DATA_PARALLEL_DEEPSPEED_ZERO3: "deepspeed-zero3",
              v1.DATA_PARALLEL_FSDP1: "fsdp1", v1.DATA_PARALLEL_FSDP2: "fsdp2",
              v1.DATA_PARALLEL_MEGATRON_DDP: "megatron-ddp",
              v1.DATA_PARALLEL_MEGATRON_DISTOPT: "megatron-distopt"}
CHECKPOINTS = {v1.CHECKPOINT_POLICY_NONE: "none", v1.CHECKPOINT_POLICY_EVERY_BLOCK: "every-block"}


class PlanCollector:
    """The plans of a Plan call's events, in order, each handed to on_plan as it arrives."""

    def __init__(self, on_plan=None):
        self.plans = []
        self._on_plan = on_plan

    def take(self, event):
        if event.HasField("plan"):
            self.plans.append(Plan.from_proto(event.plan))
            if self._on_plan is not None:
                self._on_plan(self.plans[-1])


def plan_request(preset=None, model=None, *, devices=None, max_gpus=None, max_plans=None,
                 host_memory_per_gpu=None, **kwargs):
    """The PlanRequest for Client.plan's arguments: the model and the run as for estimate
    (batch_size is the global batch), GPU types, the GPU budget, the most plans, and the host
    memory each GPU's rank may take for CPU offload (bytes, or a size such as "256GiB"; None: no
    offload plans)."""
    kwargs.pop("advice", None)
    estimate = build_request(preset=preset, model=model, **kwargs)
    if isinstance(devices, str):
        devices = [devices]
    host = 0 if host_memory_per_gpu is None else parse_capacity(host_memory_per_gpu,
                                                                "host_memory_per_gpu")
    return v1.PlanRequest(model=estimate.model, config=estimate.config,
                          devices=list(devices or ()), max_gpus=max_gpus or 0,
                          max_plans=max_plans or 0, host_memory_per_gpu_bytes=host)


def _offload(par):
    if par.fsdp_cpu_offload:
        return "fsdp"
    if par.offload_optimizer:
        return "optimizer+param" if par.offload_param else "optimizer"
    return ""


@dataclasses.dataclass(frozen=True)
class Plan:
    """One way to run the job that fits: `gpus` of `device` as `data` data-parallel ranks
    (`strategy`) x `tensor` tensor-parallel ranks (`tensor_layers`: Megatron's linears, or
    DTensor's when the query asked for them; with `sequence_parallel`) x `pipeline` stages (of `virtual_stages` model chunks each: Megatron's
    interleaved 1F1B), `context` context-parallel ranks (ring attention: gpus = data x tensor x
    context x pipeline), `expert` of the data ranks Megatron's expert-parallel group, `data_shard`
    FSDP's hybrid sharding (shard groups of that many data ranks; 0: none), micro-batches
    of `micro_batch` with `grad_accum_steps` of
    them per rank, `checkpoint`; `required_bytes` of the worst rank out of `capacity_bytes`;
    and its costs: `recompute_fraction` (forward ops run again), `bubble_fraction` (a
    pipeline's idle share), `communicated_bytes_per_step` (what one rank sends). With CPU
    offload, `offload` names it ("optimizer", "optimizer+param" or "fsdp"; "" without),
    `host_bytes` is the host memory the rank takes and `host_transfer_bytes_per_step` the
    model-state bytes it copies between host and GPU."""

    device: str
    gpus: int
    data: int
    strategy: str
    pipeline: int
    micro_batch: int
    grad_accum_steps: int
    checkpoint: str
    required_bytes: int
    capacity_bytes: int
    headroom_bytes: int
    recompute_fraction: float
    bubble_fraction: float
    communicated_bytes_per_step: int
    tensor: int = 1
    sequence_parallel: bool = False
    virtual_stages: int = 1
    expert: int = 1
    context: int = 1
    data_shard: int = 0
    offload: str = ""
    host_bytes: int = 0
    host_transfer_bytes_per_step: int = 0
    tensor_layers: str = "megatron"

    @classmethod
    def from_proto(cls, p):
        par = p.parallelism
        return cls(device=p.device, gpus=p.gpus, data=par.data or 1,
                   strategy=STRATEGIES.get(par.data_parallel, "?"), pipeline=par.pipeline or 1,
                   micro_batch=p.micro_batch, grad_accum_steps=p.grad_accum_steps,
                   checkpoint=CHECKPOINTS.get(p.checkpoint, "?"),
                   required_bytes=p.required_bytes, capacity_bytes=p.capacity_bytes,
                   headroom_bytes=p.headroom_bytes, recompute_fraction=p.recompute_fraction,
                   bubble_fraction=p.bubble_fraction,
                   communicated_bytes_per_step=p.communicated_bytes_per_step,
                   tensor=par.tensor or 1, sequence_parallel=par.sequence_parallel,
                   virtual_stages=par.pipeline_virtual_stages or 1, expert=par.expert or 1,
                   context=par.context or 1,
                   data_shard=par.data_shard, offload=_offload(par), host_bytes=p.host_bytes,
                   host_transfer_bytes_per_step=p.host_transfer_bytes_per_step,
                   tensor_layers="dtensor" if par.tensor_layers == v1.TENSOR_PARALLEL_LAYERS_DTENSOR
                   else "megatron")

    def __str__(self):
        stages = "%d stages" % self.pipeline + (
            " of %d chunks" % self.virtual_stages if self.virtual_stages > 1 else "") + (
            " x %d context" % self.context if self.context > 1 else "")
        strategy = self.strategy + (
            ", %d expert-parallel" % self.expert if self.expert > 1 else "") + (
            ", sharded within groups of %d" % self.data_shard if self.data_shard else "") + (
            ", %s offloaded, %s of host memory" % (self.offload, format_bytes(self.host_bytes))
            if self.offload else "")
        return ("%d x %s: %d data (%s) x %d tensor x %s, micro-batch %d x %d, checkpoint "
                "%s, needs %s (headroom %s)" % (self.gpus, self.device, self.data, strategy,
                                      self.tensor, stages, self.micro_batch,
                                      self.grad_accum_steps,
                                      self.checkpoint, format_bytes(self.required_bytes),
                                      format_bytes(self.headroom_bytes)))
