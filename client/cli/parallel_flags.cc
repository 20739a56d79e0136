#include "client/cli/parallel_flags.h"

#include "client/cli/words.h"

namespace memest::cli {
namespace {

const Word<v1::DataParallel> kStrategies[] = {
    {"ddp", v1::DATA_PARALLEL_DDP},
    {"zero1", v1::DATA_PARALLEL_ZERO1},
    {"deepspeed-zero2", v1::DATA_PARALLEL_DEEPSPEED_ZERO2},
    {"deepspeed-zero1", v1::DATA_PARALLEL_DEEPSPEED_ZERO1},
    {"deepspeed-zero3", v1::DATA_PARALLEL_DEEPSPEED_ZERO3},
    {"fsdp1", v1::DATA_PARALLEL_FSDP1},
    {"fsdp2", v1::DATA_PARALLEL_FSDP2},
    {"megatron-ddp", v1::DATA_PARALLEL_MEGATRON_DDP},
    {"megatron-distopt", v1::DATA_PARALLEL_MEGATRON_DISTOPT},
};

const Word<v1::PipelineSchedule> kSchedules[] = {
    {"1f1b", v1::PIPELINE_SCHEDULE_1F1B},
    {"gpipe", v1::PIPELINE_SCHEDULE_GPIPE},
};

const Word<v1::TensorShardStyle> kStyles[] = {
    {"colwise", v1::TENSOR_SHARD_STYLE_COLWISE},
    {"rowwise", v1::TENSOR_SHARD_STYLE_ROWWISE},
    {"colwise-gathered", v1::TENSOR_SHARD_STYLE_COLWISE_GATHERED},
};
const Word<v1::TensorParallelLayers> kLayers[] = {
    {"megatron", v1::TENSOR_PARALLEL_LAYERS_MEGATRON},
    {"dtensor", v1::TENSOR_PARALLEL_LAYERS_DTENSOR},
};

}  // namespace

void AddParallelismFlags(CLI::App* app, ParallelismFlags* f) {
  const char* group = "Parallelism (one rank's view)";
  app->add_option("--data-parallel", f->data,
                  "data-parallel ranks (batch stays per rank); the estimate is the rank that "
                  "holds the most")
      ->group(group)->type_name("N");
  app->add_option("--dp-strategy", f->strategy,
                  "ddp (DistributedDataParallel, the default with --data-parallel), zero1 "
                  "(ZeroRedundancyOptimizer over DDP), deepspeed-zero1 or deepspeed-zero2 "
                  "(DeepSpeed ZeRO stage 1 or 2), fsdp1 (FullyShardedDataParallel wrapped by block), fsdp2 (fully_shard on each block and the root), megatron-ddp "
                  "(Megatron-LM's DDP and mixed-precision optimizer) or megatron-distopt (with "
                  "its distributed optimizer)")
      ->group(group);
  app->add_option("--bucket-cap-mb", f->bucket_cap_mb,
                  "DDP's bucket_cap_mb (default 25, with a 1 MiB first bucket)")
      ->group(group)->type_name("MIB");
  app->add_flag("--gradient-as-bucket-view", f->gradient_as_bucket_view,
                "DDP's gradient_as_bucket_view=True: .grad is a view into its bucket")
      ->group(group);
  app->add_option("--reduce-bucket-size", f->reduce_bucket_size,
                  "DeepSpeed ZeRO's reduce_bucket_size in elements (default 5e8)")
      ->group(group)->type_name("ELEMENTS");
  app->add_flag("--overlap-comm", f->overlap_comm,
                "DeepSpeed ZeRO's overlap_comm: a second ipg buffer")
      ->group(group);
  app->add_flag("--offload-optimizer", f->offload_optimizer,
                "DeepSpeed ZeRO's offload_optimizer device cpu: the fp32 master weights, "
                "their gradient and the optimizer state in host memory (shown as host bytes), "
                "the optimizer steps on the CPU")
      ->group(group);
  app->add_flag("--offload-param", f->offload_param,
                "DeepSpeed ZeRO-3's offload_param device cpu: the parameters' partitions in "
                "host memory, copied to the GPU when gathered")
      ->group(group);
  app->add_flag("--no-reshard-after-forward", f->no_reshard_after_forward,
                "FSDP2's fully_shard(block, reshard_after_forward=False), FSDP1's "
                "SHARD_GRAD_OP: blocks keep their gathered parameters from forward to backward")
      ->group(group);
  app->add_flag("--keep-last-block-gathered", f->keep_last_block_gathered,
                "FSDP2's fully_shard(last block, reshard_after_forward=False), the others "
                "resharding: torchtitan's default (backward needs the last block first)")
      ->group(group);
  app->add_flag("--fsdp-mixed-precision", f->fsdp_mixed_precision,
                "FSDP's MixedPrecision(Policy)(param_dtype=<--precision's 16-bit dtype>, "
                "reduce_dtype=float32) over a float32 model (with --precision bf16-pure or "
                "fp16-pure)")
      ->group(group);
  app->add_flag("--fsdp-cpu-offload", f->fsdp_cpu_offload,
                "FSDP's CPU offload (fsdp2: offload_policy=CPUOffloadPolicy(); fsdp1: "
                "cpu_offload=CPUOffload(offload_params=True)): shards, gradients and optimizer "
                "state in pinned host memory (shown as host bytes), the step on the CPU")
      ->group(group);
  app->add_option("--dp-shard", f->data_shard,
                  "hybrid sharding (FSDP1 HYBRID_SHARD, FSDP2 over a replicate x shard mesh): "
                  "shard within groups of N data ranks, replicate across --data-parallel / N "
                  "of them")
      ->group(group)->type_name("N");
  app->add_option("--stage3-prefetch-bucket-size", f->stage3_prefetch,
                  "DeepSpeed ZeRO-3's stage3_prefetch_bucket_size (elements, default 50000000)")
      ->group(group)->type_name("N");
  app->add_option("--stage3-max-live-parameters", f->stage3_max_live,
                  "DeepSpeed ZeRO-3's stage3_max_live_parameters (elements, default 1000000000)")
      ->group(group)->type_name("N");
  app->add_option("--stage3-max-reuse-distance", f->stage3_max_reuse,
                  "DeepSpeed ZeRO-3's stage3_max_reuse_distance (elements, default 1000000000)")
      ->group(group)->type_name("N");
  app->add_option("--stage3-param-persistence-threshold", f->stage3_persistence,
                  "DeepSpeed ZeRO-3's stage3_param_persistence_threshold (elements, default "
                  "100000)")
      ->group(group)->type_name("N");
  app->add_option("--pipeline", f->pipeline,
                  "pipeline stages: the model's blocks split evenly over them, --grad-accum "
                  "micro-batches; every stage is estimated, the report is the one that needs "
                  "the most")
      ->group(group)->type_name("STAGES");
  app->add_option("--pipeline-schedule", f->pipeline_schedule,
                  "1f1b (Megatron-LM's non-interleaved schedule, the default) or gpipe")
      ->group(group);
  app->add_flag("--pipeline-keep-outputs", f->pipeline_keep_outputs,
                "a stage keeps its sent output until its backward (torch.distributed."
                "pipelining); the default frees it once sent (Megatron's "
                "deallocate_output_tensor)")
      ->group(group);
  app->add_option("--tensor-parallel", f->tensor,
                  "tensor-parallel ranks: Megatron-LM's column- and row-parallel linears over "
                  "the plan's modules; the estimate is one rank")
      ->group(group)->type_name("N");
  app->add_flag("--sequence-parallel", f->sequence_parallel,
                "Megatron's sequence parallelism: outside the parallel linears each rank holds "
                "its share of the sequence")
      ->group(group);
  app->add_option("--tensor-plan", f->tensor_plan,
                  "MODULE=colwise|rowwise|colwise-gathered (repeatable): the modules to split, by "
                  "path pattern "
                  "('*' matches anything; 'attn.c_proj' matches h.3.attn.c_proj); default: "
                  "the Hugging Face names of the presets")
      ->group(group)->type_name("MODULE=STYLE");
  app->add_option("--tensor-layers", f->tensor_layers,
                  "which layers run tensor parallelism: megatron (Megatron-LM's, the default) "
                  "or dtensor (PyTorch's parallelize_module, as torchtitan runs it: "
                  "functional collectives, loss_parallel)")
      ->group(group)->type_name("megatron|dtensor");
  app->add_option("--virtual-stages", f->virtual_stages,
                  "Megatron-LM's interleaved 1F1B: model chunks per pipeline stage (its "
                  "virtual_pipeline_model_parallel_size)")
      ->group(group)->type_name("V");
  app->add_option("--context-parallel", f->context,
                  "context-parallel ranks: each holds its share of every sequence, attention "
                  "passes keys and values round a ring (TransformerEngine's, as Megatron-LM "
                  "runs it); needs a fused attention kernel")
      ->group(group)->type_name("N");
  app->add_option("--expert-parallel", f->expert,
                  "expert-parallel ranks (Megatron-LM's expert_model_parallel_size, with "
                  "--dp-strategy megatron-ddp or megatron-distopt): each holds its share of "
                  "every mixture-of-experts layer's experts, tokens travel to them by all-to-all; "
                  "must divide --data-parallel x --context-parallel")
      ->group(group)->type_name("N");
  app->add_option("--gpus-per-node", f->gpus_per_node,
                  "GPUs per node (default 8): which process groups NCCL connects over NVLink "
                  "and which across nodes, for NCCL's memory (groups in Megatron-LM's rank "
                  "order: tensor, context, data, pipeline)")
      ->group(group)->type_name("N");
}

Status ApplyParallelismFlags(const ParallelismFlags& f, v1::RunConfig* config) {
  if (!f.data && f.strategy.empty() && !f.bucket_cap_mb && !f.gradient_as_bucket_view &&
      !f.reduce_bucket_size && !f.overlap_comm && !f.offload_optimizer && !f.offload_param &&
      !f.no_reshard_after_forward && !f.keep_last_block_gathered &&
      !f.fsdp_mixed_precision && !f.fsdp_cpu_offload && !f.pipeline && f.pipeline_schedule.empty() &&
      !f.pipeline_keep_outputs && !f.tensor && !f.sequence_parallel && f.tensor_plan.empty() && f.tensor_layers.empty() &&
      !f.context &&
      !f.expert && !f.virtual_stages && !f.gpus_per_node && !f.data_shard && !f.stage3_prefetch &&
      !f.stage3_max_live && !f.stage3_max_reuse && !f.stage3_persistence) {
    return Status::Ok();
  }
  v1::Parallelism* p = config->mutable_parallelism();
  if (f.data) p->set_data(*f.data);
  if (!f.strategy.empty()) {
    MEMEST_ASSIGN_OR_RETURN(v1::DataParallel s, ParseWord("--dp-strategy", f.strategy, kStrategies));
    p->set_data_parallel(s);
  }
  if (f.bucket_cap_mb) p->set_bucket_cap_mb(*f.bucket_cap_mb);
  p->set_gradient_as_bucket_view(f.gradient_as_bucket_view);
  if (f.reduce_bucket_size) p->set_reduce_bucket_size(*f.reduce_bucket_size);
  p->set_overlap_comm(f.overlap_comm);
  p->set_offload_optimizer(f.offload_optimizer);
  p->set_offload_param(f.offload_param);
  if (f.no_reshard_after_forward) p->set_reshard_after_forward(false);
  p->set_keep_last_block_gathered(f.keep_last_block_gathered);
  p->set_fsdp_mixed_precision(f.fsdp_mixed_precision);
  p->set_fsdp_cpu_offload(f.fsdp_cpu_offload);
  if (f.pipeline) p->set_pipeline(*f.pipeline);
  if (!f.pipeline_schedule.empty()) {
    MEMEST_ASSIGN_OR_RETURN(v1::PipelineSchedule s,
                            ParseWord("--pipeline-schedule", f.pipeline_schedule, kSchedules));
    p->set_pipeline_schedule(s);
  }
  p->set_pipeline_keep_outputs(f.pipeline_keep_outputs);
  if (f.tensor) p->set_tensor(*f.tensor);
  if (f.context) p->set_context(*f.context);
  if (f.expert) p->set_expert(*f.expert);
  if (f.gpus_per_node) p->set_gpus_per_node(*f.gpus_per_node);
  if (f.data_shard) p->set_data_shard(*f.data_shard);
  if (f.stage3_prefetch) p->set_stage3_prefetch_bucket_size(*f.stage3_prefetch);
  if (f.stage3_max_live) p->set_stage3_max_live_parameters(*f.stage3_max_live);
  if (f.stage3_max_reuse) p->set_stage3_max_reuse_distance(*f.stage3_max_reuse);
  if (f.stage3_persistence) p->set_stage3_param_persistence_threshold(*f.stage3_persistence);
  if (f.virtual_stages) p->set_pipeline_virtual_stages(*f.virtual_stages);
  p->set_sequence_parallel(f.sequence_parallel);
  if (!f.tensor_layers.empty()) {
    MEMEST_ASSIGN_OR_RETURN(v1::TensorParallelLayers layers,
                            ParseWord("--tensor-layers", f.tensor_layers, kLayers));
    p->set_tensor_layers(layers);
  }
  for (const std::string& entry : f.tensor_plan) {
    const size_t eq = entry.rfind('=');
    if (eq == std::string::npos || eq == 0) {
      return InvalidArgument("--tensor-plan: MODULE=colwise, MODULE=rowwise or "
                             "MODULE=colwise-gathered, got '" + entry + "'");
    }
    MEMEST_ASSIGN_OR_RETURN(v1::TensorShardStyle style,
                            ParseWord("--tensor-plan", entry.substr(eq + 1), kStyles));
    v1::TensorPlanEntry* e = p->add_tensor_plan();
    e->set_module(entry.substr(0, eq));
    e->set_style(style);
  }
  return Status::Ok();
}

}  // namespace memest::cli
