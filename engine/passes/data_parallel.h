// Data parallelism as one rank sees it: what DistributedDataParallel and
// ZeroRedundancyOptimizer add to, or take from, the single-GPU step (docs/parallelism.md).
//
// Every data-parallel rank runs the whole model on its own batch_size samples, so the graph of
// one rank is the single-GPU graph; what differs lives beside it:
// - DDP's gradient buckets: flat tensors, one per bucket, allocated when DDP is constructed and
//   kept for its life (torch/csrc/distributed/c10d/reducer.cpp, initialize_buckets). Each
//   gradient is copied into its bucket as it becomes ready and the bucket is all-reduced in
//   place. With gradient_as_bucket_view, .grad becomes a view into the bucket (the gradient
//   autograd made is dropped after the copy); without it, .grad stays a tensor of its own.
// - ZeroRedundancyOptimizer: each rank's optimizer steps only the parameters it owns, so only
//   those have optimizer state and step temporaries on it; the updated parameters are
//   broadcast in place.
// - DeepSpeed ZeRO stages 1 and 2, with or without optimizer offload: engine/passes/
//   deepspeed_zero.h.
// Ranks differ only in what their optimizer owns; PlanDataParallel picks the rank with the
// most optimizer elements, the one that runs out first.
#ifndef MEMEST_ENGINE_PASSES_DATA_PARALLEL_H_
#define MEMEST_ENGINE_PASSES_DATA_PARALLEL_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/ir/config.h"
#include "engine/ir/graph.h"
#include "engine/ir/status.h"
#include "engine/passes/deepspeed_zero.h"
#include "engine/passes/deepspeed_zero3.h"
#include "engine/passes/fsdp.h"
#include "engine/passes/fsdp1.h"
#include "engine/passes/megatron_ddp.h"
#include "engine/report/report.h"

namespace memest {

struct DdpBucket {
  DType dtype = DType::kFloat32;
  int64_t bytes = 0;        // the flat tensor's size: its parameters' bytes
  std::vector<int> params;  // tensor ids, in the order their gradients become ready
};

// One rank's view of a data-parallel step.
struct RankView {
  int64_t world = 1;  // data-parallel ranks
  int64_t rank = 0;   // the rank this view is of
  std::vector<DdpBucket> buckets;  // empty without DDP
  bool grads_in_buckets = false;   // gradient_as_bucket_view
  // Per tensor id: 1 where this rank's optimizer steps the parameter. Empty: every trainable
  // parameter (no ZeRO).
  std::vector<char> optimizer_owns;
  // Per rank (ZeRO-1): the elements of the parameters its optimizer steps.
  std::vector<int64_t> owned_elements;
  std::optional<DeepSpeedZero> deepspeed;  // DeepSpeed ZeRO-1/2; its optimizer owns no parameter
  std::optional<DeepSpeedZero3> zero3;      // DeepSpeed ZeRO-3
  std::optional<Fsdp1View> fsdp1;       // FSDP1 (FullyShardedDataParallel)
  std::optional<Fsdp2View> fsdp2;       // FSDP2
  std::optional<MegatronDdp> megatron;  // Megatron-LM's DDP (with the distributed optimizer)

  bool OptimizerOwns(int t) const { return optimizer_owns.empty() || optimizer_owns[t] != 0; }
  int64_t BucketBytes() const;
};

// The view of the rank that holds the most (the lowest such rank; ZeRO-1: the most optimizer
// elements; DeepSpeed ZeRO-1/2: the largest grads_in_partition), for config.parallelism. A
// config without data parallelism gives an empty view
// (world 1, no buckets). Buckets follow DDP's assignment (compute_bucket_assignment_by_size):
// per dtype, parameters in the order their gradients become ready, a bucket closing once its
// bytes reach the limit (a first bucket of 1 MiB, then the cap); on the first step the
// construction-time layout, one bucket per dtype (find_unused_parameters=False), which DDP
// rebuilds before the second forward.
StatusOr<RankView> PlanDataParallel(const Graph& graph, const RunConfig& config);

// The order in which the trainable parameters' gradients become ready in backward: by their
// first reader, last first (AccumulateGrad runs after the first reader's backward); within one
// op, its last input first (linear's bias, whose AccumulateGrad hangs directly off AddmmBackward,
// is ready before its weight, which goes through TBackward: DDP's rebuilt buckets on 1.13 show
// it); parameters no op reads last.
std::vector<int> GradReadyOrder(const Graph& graph);

// ZeroRedundancyOptimizer's partition of `params` (tensor ids, in model.parameters() order):
// largest first (a stable sort by element count), each to the rank with the fewest elements so
// far (the lowest on a tie). Returns each parameter's rank, in the order of `params`.
std::vector<int64_t> PartitionLargestFirst(const Graph& graph, const std::vector<int>& params,
                                           int64_t world);

// The bytes one rank sends per optimizer step over the network, by the ring algorithms NCCL
// uses, for the graph the rank runs (a pipeline stage's) under config.parallelism with
// config.grad_accum_steps micro-batches: d data-parallel ranks, P its parameters' bytes, G its
// trainable parameters' bytes:
// - DDP: an all-reduce of the gradients once per step, 2(d-1)/d G (no_sync before);
// - ZeRO-1: the same, and the broadcast of the updated parameters, (d-1)/d P;
// - DeepSpeed ZeRO-2: a reduce-scatter of the gradients per micro-batch, (d-1)/d G, and the
//   all-gather of the updated 16-bit parameters, (d-1)/d P; ZeRO-1 the same reduction once
//   per step, at the accumulation boundary;
// - FSDP2: per micro-batch, two all-gathers of the parameters (forward, backward) and a
//   reduce-scatter of the gradients (in float32 under its mixed-precision policy);
// - a pipeline stage: per micro-batch, the activation it sends on and the gradient it sends
//   back, each the size of what it receives.
int64_t CommunicatedBytesPerStep(const Graph& graph, const RunConfig& config);

// The report's summary of `view`, and the notes that say what the estimate of a data-parallel
// rank counts and leaves out.
DataParallelReport DataParallelReportOf(const RankView& view);
void AddDataParallelNotes(const RunConfig& config, const RankView& view, Report* report);

}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_DATA_PARALLEL_H_
