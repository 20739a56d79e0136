// PlanRequest -> engine/plan/planner.h's PlanQuery, and a Plan -> ParallelPlan.
#include <string>

#include "server/convert.h"

namespace memest {
namespace {

constexpr int64_t kDefaultMaxGpus = 8;
constexpr int64_t kDefaultMaxPlans = 20;

v1::DataParallel StrategyToProto(DataSharding s) {
  switch (s) {
    case DataSharding::kNone:
      return v1::DATA_PARALLEL_UNSPECIFIED;
    case DataSharding::kDdp:
      return v1::DATA_PARALLEL_DDP;
    case DataSharding::kZero1:
      return v1::DATA_PARALLEL_ZERO1;
    case DataSharding::kDeepSpeedZero2:
      return v1::DATA_PARALLEL_DEEPSPEED_ZERO2;
    case DataSharding::kDeepSpeedZero1:
      return v1::DATA_PARALLEL_DEEPSPEED_ZERO1;
    case DataSharding::kDeepSpeedZero3:
      return v1::DATA_PARALLEL_DEEPSPEED_ZERO3;
    case DataSharding::kFsdp1:
      return v1::DATA_PARALLEL_FSDP1;
    case DataSharding::kFsdp2:
      return v1::DATA_PARALLEL_FSDP2;
    case DataSharding::kMegatronDdp:
      return v1::DATA_PARALLEL_MEGATRON_DDP;
    case DataSharding::kMegatronDistOpt:
      return v1::DATA_PARALLEL_MEGATRON_DISTOPT;
  }
  return v1::DATA_PARALLEL_UNSPECIFIED;
}

v1::CheckpointPolicy CheckpointToProto(CheckpointPolicy p) {
  switch (p) {
    case CheckpointPolicy::kNone:
      return v1::CHECKPOINT_POLICY_NONE;
    case CheckpointPolicy::kEveryBlock:
      return v1::CHECKPOINT_POLICY_EVERY_BLOCK;
    case CheckpointPolicy::kEveryKBlocks:
      return v1::CHECKPOINT_POLICY_EVERY_K_BLOCKS;
    case CheckpointPolicy::kSqrtBlocks:
      return v1::CHECKPOINT_POLICY_SQRT_BLOCKS;
    case CheckpointPolicy::kAttentionCore:
      return v1::CHECKPOINT_POLICY_ATTENTION_CORE;
    case CheckpointPolicy::kScopes:
      return v1::CHECKPOINT_POLICY_SCOPES;
  }
  return v1::CHECKPOINT_POLICY_UNSPECIFIED;
}

}  // namespace

StatusOr<PlanQuery> PlanQueryFromProto(const v1::PlanRequest& request, int64_t max_ops) {
  PlanQuery q;
  MEMEST_ASSIGN_OR_RETURN(q.model, ModelFromProto(request.model()));
  MEMEST_ASSIGN_OR_RETURN(q.run, RunConfigFromProto(request.config()));
  MEMEST_RETURN_IF_ERROR(ApplyModelHints(q.model, request.config(), &q.run));
  for (const std::string& d : request.devices()) q.devices.push_back(d);
  q.max_gpus = request.max_gpus() == 0 ? kDefaultMaxGpus : request.max_gpus();
  q.max_plans = request.max_plans() == 0 ? kDefaultMaxPlans : request.max_plans();
  q.host_bytes_per_gpu = request.host_memory_per_gpu_bytes();
  q.max_ops = max_ops;
  return q;
}

void PlanToProto(const Plan& p, v1::ParallelPlan* out) {
  out->set_device(p.device);
  out->set_gpus(p.gpus);
  v1::Parallelism* par = out->mutable_parallelism();
  par->set_data(p.parallelism.data);
  par->set_data_parallel(StrategyToProto(p.parallelism.sharding));
  par->set_pipeline(p.parallelism.pipeline);
  if (p.parallelism.tensor > 1) {
    par->set_tensor(p.parallelism.tensor);
    par->set_sequence_parallel(p.parallelism.sequence_parallel);
    if (p.parallelism.tensor_layers == TensorParallelLayers::kDTensor) {
      par->set_tensor_layers(v1::TENSOR_PARALLEL_LAYERS_DTENSOR);
    }
  }
  if (p.parallelism.pipeline > 1) {
    par->set_pipeline_schedule(p.parallelism.pipeline_schedule == PipelineSchedule::kGPipe
                                   ? v1::PIPELINE_SCHEDULE_GPIPE
                                   : v1::PIPELINE_SCHEDULE_1F1B);
    if (p.parallelism.pipeline_virtual_stages > 1) {
      par->set_pipeline_virtual_stages(p.parallelism.pipeline_virtual_stages);
    }
  }
  if (p.parallelism.expert > 1) par->set_expert(p.parallelism.expert);
  if (p.parallelism.data_shard > 0) par->set_data_shard(p.parallelism.data_shard);
  if (p.parallelism.context > 1) par->set_context(p.parallelism.context);
  par->set_offload_optimizer(p.parallelism.offload_optimizer);
  par->set_offload_param(p.parallelism.offload_param);
  par->set_fsdp_cpu_offload(p.parallelism.fsdp_cpu_offload);
  par->set_gpus_per_node(p.parallelism.gpus_per_node);  // the layout its NCCL figure assumes
  out->set_micro_batch(p.micro_batch);
  out->set_grad_accum_steps(p.grad_accum_steps);
  out->set_checkpoint(CheckpointToProto(p.checkpoint));
  out->set_required_bytes(static_cast<uint64_t>(p.required_bytes));
  out->set_capacity_bytes(static_cast<uint64_t>(p.capacity_bytes));
  out->set_headroom_bytes(p.headroom_bytes);
  out->set_recompute_fraction(p.recompute_fraction);
  out->set_bubble_fraction(p.bubble_fraction);
  out->set_communicated_bytes_per_step(static_cast<uint64_t>(p.communicated_bytes));
  out->set_host_bytes(static_cast<uint64_t>(p.host_bytes));
  out->set_host_transfer_bytes_per_step(static_cast<uint64_t>(p.host_transfer_bytes));
}

}  // namespace memest
