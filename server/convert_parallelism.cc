// config.parallelism <-> engine/ir/config.h's ParallelismConfig, and the data-parallel ranks of a
// report.
#include <cmath>
#include <string>

#include "server/convert.h"

namespace memest {

StatusOr<ParallelismConfig> ParallelismFromProto(const v1::Parallelism& p) {
  ParallelismConfig out;
  out.data = p.data() == 0 ? 1 : p.data();  // the engine refuses a negative count, naming it
  switch (p.data_parallel()) {
    case v1::DATA_PARALLEL_UNSPECIFIED:
      out.sharding = out.data > 1 ? DataSharding::kDdp : DataSharding::kNone;
      break;
    case v1::DATA_PARALLEL_DDP:
      out.sharding = DataSharding::kDdp;
      break;
    case v1::DATA_PARALLEL_ZERO1:
      out.sharding = DataSharding::kZero1;
      break;
    case v1::DATA_PARALLEL_DEEPSPEED_ZERO2:
      out.sharding = DataSharding::kDeepSpeedZero2;
      break;
    case v1::DATA_PARALLEL_DEEPSPEED_ZERO1:
      out.sharding = DataSharding::kDeepSpeedZero1;
      break;
    case v1::DATA_PARALLEL_DEEPSPEED_ZERO3:
      out.sharding = DataSharding::kDeepSpeedZero3;
      break;
    case v1::DATA_PARALLEL_FSDP1:
      out.sharding = DataSharding::kFsdp1;
      break;
    case v1::DATA_PARALLEL_FSDP2:
      out.sharding = DataSharding::kFsdp2;
      break;
    case v1::DATA_PARALLEL_MEGATRON_DDP:
      out.sharding = DataSharding::kMegatronDdp;
      break;
    case v1::DATA_PARALLEL_MEGATRON_DISTOPT:
      out.sharding = DataSharding::kMegatronDistOpt;
      break;
    default:
      return InvalidArgument("config.parallelism.data_parallel: unknown value " +
                             std::to_string(p.data_parallel()));
  }
  if (p.has_bucket_cap_mb()) {
    const double mb = p.bucket_cap_mb();
    if (!std::isfinite(mb) || mb <= 0 || mb > double(kMaxBucketCapBytes >> 20)) {
      return InvalidArgument(
          "config.parallelism.bucket_cap_mb: must be positive and at most "
          "2^20 (MiB), got " +
          std::to_string(mb));
    }
    out.bucket_cap_bytes = static_cast<int64_t>(mb * 1024 * 1024);  // int(), as DDP does
    if (out.bucket_cap_bytes == 0) {
      return InvalidArgument("config.parallelism.bucket_cap_mb: " + std::to_string(mb) +
                             " MiB is less than one byte");
    }
    if (out.sharding == DataSharding::kNone) out.sharding = DataSharding::kDdp;
  }
  out.gradient_as_bucket_view = p.gradient_as_bucket_view();
  if (p.has_reduce_bucket_size()) {
    if (p.reduce_bucket_size() <= 0) {
      return InvalidArgument("config.parallelism.reduce_bucket_size: must be positive, got " +
                             std::to_string(p.reduce_bucket_size()));
    }
    out.reduce_bucket_elements = p.reduce_bucket_size();
  }
  out.overlap_comm = p.overlap_comm();
  out.offload_optimizer = p.offload_optimizer();
  out.offload_param = p.offload_param();
  out.reshard_after_forward = !p.has_reshard_after_forward() || p.reshard_after_forward();
  out.keep_last_block_gathered = p.keep_last_block_gathered();
  out.fsdp_mixed_precision = p.fsdp_mixed_precision();
  out.fsdp_cpu_offload = p.fsdp_cpu_offload();
  out.pipeline = p.pipeline() == 0 ? 1 : p.pipeline();  // the engine refuses a negative count
  switch (p.pipeline_schedule()) {
    case v1::PIPELINE_SCHEDULE_UNSPECIFIED:
    case v1::PIPELINE_SCHEDULE_1F1B:
      out.pipeline_schedule = PipelineSchedule::k1F1B;
      break;
    case v1::PIPELINE_SCHEDULE_GPIPE:
      out.pipeline_schedule = PipelineSchedule::kGPipe;
      break;
    default:
      return InvalidArgument("config.parallelism.pipeline_schedule: unknown value " +
                             std::to_string(p.pipeline_schedule()));
  }
  out.pipeline_keep_outputs = p.pipeline_keep_outputs();
  out.pipeline_virtual_stages = p.pipeline_virtual_stages() == 0 ? 1 : p.pipeline_virtual_stages();
  out.tensor = p.tensor() == 0 ? 1 : p.tensor();  // the engine refuses a negative count
  out.sequence_parallel = p.sequence_parallel();
  switch (p.tensor_layers()) {
    case v1::TENSOR_PARALLEL_LAYERS_UNSPECIFIED:
    case v1::TENSOR_PARALLEL_LAYERS_MEGATRON:
      out.tensor_layers = TensorParallelLayers::kMegatron;
      break;
    case v1::TENSOR_PARALLEL_LAYERS_DTENSOR:
      out.tensor_layers = TensorParallelLayers::kDTensor;
      break;
    default:
      return InvalidArgument("config.parallelism.tensor_layers: MEGATRON or DTENSOR, got " +
                             std::to_string(p.tensor_layers()));
  }
  out.context = p.context() == 0 ? 1 : p.context();  // the engine refuses a negative count
  out.expert = p.expert() == 0 ? 1 : p.expert();
  out.gpus_per_node = p.gpus_per_node() == 0 ? 8 : p.gpus_per_node();  // refused when negative
  out.data_shard = p.data_shard();  // the engine checks it against data and the strategy
  // The engine checks these too (range, and that the strategy is ZeRO-3).
  if (p.has_stage3_prefetch_bucket_size()) {
    out.stage3_prefetch_bucket_size = p.stage3_prefetch_bucket_size();
  }
  if (p.has_stage3_max_live_parameters()) {
    out.stage3_max_live_parameters = p.stage3_max_live_parameters();
  }
  if (p.has_stage3_max_reuse_distance()) {
    out.stage3_max_reuse_distance = p.stage3_max_reuse_distance();
  }
  if (p.has_stage3_param_persistence_threshold()) {
    out.stage3_param_persistence_threshold = p.stage3_param_persistence_threshold();
  }
  if (p.tensor_plan_size() > static_cast<int>(kMaxTensorPlanEntries)) {
    return InvalidArgument("config.parallelism.tensor_plan: at most " +
                           std::to_string(kMaxTensorPlanEntries) + " entries, got " +
                           std::to_string(p.tensor_plan_size()));
  }
  for (int i = 0; i < p.tensor_plan_size(); ++i) {
    const v1::TensorPlanEntry& e = p.tensor_plan(i);
    TensorPlanEntry entry;
    entry.module = e.module();
    switch (e.style()) {
      case v1::TENSOR_SHARD_STYLE_COLWISE:
        entry.style = TensorShardStyle::kColwise;
        break;
      case v1::TENSOR_SHARD_STYLE_ROWWISE:
        entry.style = TensorShardStyle::kRowwise;
        break;
      case v1::TENSOR_SHARD_STYLE_COLWISE_GATHERED:
        entry.style = TensorShardStyle::kColwiseGathered;
        break;
      default:
        return InvalidArgument("config.parallelism.tensor_plan[" + std::to_string(i) +
                               "].style: COLWISE, ROWWISE or COLWISE_GATHERED, got " +
                               std::to_string(e.style()));
    }
    out.tensor_plan.push_back(std::move(entry));
  }
  if (out.gradient_as_bucket_view && out.sharding == DataSharding::kNone) {
    out.sharding = DataSharding::kDdp;  // DDP on one GPU: its buckets exist all the same
  }
  return out;
}

void PipelineToProto(const PipelineReport& r, v1::PipelineStages* out) {
  out->set_stages(r.stages);
  out->set_micro_batches(r.micro_batches);
  out->set_worst_stage(r.worst_stage);
  for (const PipelineStageReport& s : r.per_stage) {
    v1::PipelineStage* p = out->add_per_stage();
    p->set_stage(s.stage);
    p->set_first_block(s.first_block);
    p->set_last_block(s.last_block);
    p->set_peak_allocated_bytes(static_cast<uint64_t>(s.peak_allocated_bytes));
    p->set_peak_reserved_bytes(static_cast<uint64_t>(s.peak_reserved_bytes));
    p->set_peak_phase(PhaseToProto(s.peak_phase));
    p->set_parameter_count(static_cast<uint64_t>(s.parameter_count));
  }
}

void DataParallelToProto(const DataParallelReport& r, v1::DataParallelRanks* out) {
  out->set_world(r.world);
  out->set_rank(r.rank);
  for (int64_t b : r.bucket_bytes) out->add_bucket_bytes(static_cast<uint64_t>(b));
  for (int64_t e : r.owned_elements) out->add_owned_elements(static_cast<uint64_t>(e));
  out->set_host_bytes(static_cast<uint64_t>(r.host_bytes));
}

}  // namespace memest
