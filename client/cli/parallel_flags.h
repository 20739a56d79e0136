// The flags of a multi-GPU run (`--data-parallel 8 --dp-strategy zero1`): config.parallelism.
#ifndef MEMEST_CLIENT_CLI_PARALLEL_FLAGS_H_
#define MEMEST_CLIENT_CLI_PARALLEL_FLAGS_H_

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/ir/status.h"
#include "memest/v1/memest.pb.h"

namespace memest::cli {

struct ParallelismFlags {
  std::optional<int64_t> data;          // data-parallel ranks
  std::string strategy;                 // ddp | zero1 | deepspeed-zero1 | deepspeed-zero2 | ...
  std::optional<double> bucket_cap_mb;  // DistributedDataParallel(bucket_cap_mb=...)
  bool gradient_as_bucket_view = false;
  std::optional<int64_t> reduce_bucket_size;  // DeepSpeed ZeRO, elements
  bool overlap_comm = false;                  // DeepSpeed ZeRO
  bool offload_optimizer = false;             // DeepSpeed ZeRO-1/2/3
  bool offload_param = false;                 // DeepSpeed ZeRO-3
  bool no_reshard_after_forward = false;      // FSDP2
  bool keep_last_block_gathered = false;      // FSDP2
  bool fsdp_mixed_precision = false;          // FSDP2
  bool fsdp_cpu_offload = false;              // FSDP2
  std::optional<int64_t> pipeline;            // pipeline stages
  std::string pipeline_schedule;              // 1f1b | gpipe
  bool pipeline_keep_outputs = false;
  std::optional<int64_t> tensor;              // tensor-parallel ranks
  bool sequence_parallel = false;
  std::vector<std::string> tensor_plan;       // MODULE=colwise|rowwise
  std::string tensor_layers;                  // megatron | dtensor
  std::optional<int64_t> context;             // context-parallel ranks
  std::optional<int64_t> expert;              // expert-parallel ranks
  std::optional<int64_t> gpus_per_node;       // which groups NCCL connects within a node
  std::optional<int64_t> data_shard;          // HSDP: ranks per shard group
  std::optional<int64_t> stage3_prefetch;     // DeepSpeed ZeRO-3's stage3_* settings
  std::optional<int64_t> stage3_max_live;
  std::optional<int64_t> stage3_max_reuse;
  std::optional<int64_t> stage3_persistence;
  std::optional<int64_t> virtual_stages;      // interleaved 1F1B model chunks per stage
};

void AddParallelismFlags(CLI::App* app, ParallelismFlags* flags);

// Sets config.parallelism from the flags given (none: left unset). An unknown strategy is
// INVALID_ARGUMENT naming the flag; ranges are the engine's to judge.
Status ApplyParallelismFlags(const ParallelismFlags& flags, v1::RunConfig* config);

}  // namespace memest::cli

#endif  // MEMEST_CLIENT_CLI_PARALLEL_FLAGS_H_
