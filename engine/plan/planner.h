// Plans that fit: the inverse of Estimate. Given a model, a run (its global batch, precision,
// optimizer), GPU types and a GPU budget, the ways to split the job over GPUs that fit, with
// the fewest GPUs first (docs/planning.md).
//
// The space, per GPU count N (powers of two up to the budget, and the budget itself):
// tensor-parallel ranks t (1, 2, 4 or 8, within a node; Megatron's linears with sequence
// parallelism over the default plan, when it splits the model) x pipeline stages p (dividing
// N / t and the model's blocks) x data-parallel ranks d = N / (t p) (dividing the global
// batch); a data-parallel strategy (ddp, zero1, deepspeed-zero2, deepspeed-zero3, fsdp1, fsdp2,
// megatron-distopt: those the run's precision and a pipeline allow; none when d = 1; FSDP's
// hybrid sharding within a node when d spans nodes; Megatron's expert parallelism for a
// mixture-of-experts config); checkpointing none or every block; the largest micro-batch that
// fits (dividing d's share of the batch; the rest is gradient accumulation, or the pipeline's
// micro-batches); context parallelism (2, 4, 8 ranks) and then CPU offload
// (PlanQuery.host_bytes_per_gpu) only at counts where nothing fits without them.
// Every candidate is a real estimate of the rank (or stage) that needs the most.
//
// Pruning, none of which can drop a plan that fits:
// - a GPU count whose share of the model states (the one-GPU estimate's parameters, gradients
//   and optimizer state divided by N) exceeds the GPU already cannot fit: skipped unestimated;
// - checkpointing every block is tried first at the smallest micro-batch: where that does not
//   fit, nothing with the same split does;
// - the largest micro-batch is found by bisection over the divisors (memory grows with it).
// The graph of a micro-batch on a device is built once and estimated under every split.
#ifndef MEMEST_ENGINE_PLAN_PLANNER_H_
#define MEMEST_ENGINE_PLAN_PLANNER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/ir/budget.h"
#include "engine/ir/config.h"
#include "engine/models/model.h"

namespace memest {

struct PlanQuery {
  ModelSpec model;
  // The run; batch_size is the GLOBAL batch per optimizer step (all data-parallel ranks
  // together); grad_accum_steps, checkpoint and parallelism are the planner's to choose and
  // must be left unset.
  RunConfig run;
  // GPU types (catalog names; "all": every CUDA GPU of the catalog); empty: run.device.
  std::vector<std::string> devices;
  int64_t max_gpus = 8;
  int64_t max_plans = 20;  // the most plans returned (the best ones of the fewest GPUs)
  // Host memory one GPU's rank may take for offload (the node's RAM for the job over its
  // GPUs). 0: no offload. Otherwise, at a GPU count where nothing fits on the GPUs alone,
  // the planner tries DeepSpeed's and FSDP's CPU offload (plan_space.h, OffloadsOf).
  int64_t host_bytes_per_gpu = 0;
  int64_t max_ops = 1'000'000;
};

struct Plan {
  std::string device;
  int64_t gpus = 1;
  ParallelismConfig parallelism;  // data ranks, strategy, tensor ranks, pipeline stages
  int64_t micro_batch = 1;
  int64_t grad_accum_steps = 1;   // per data-parallel rank (a pipeline's micro-batches)
  CheckpointPolicy checkpoint = CheckpointPolicy::kNone;
  int64_t required_bytes = 0;     // the worst rank's (or stage's): reserved + CUDA context
  int64_t capacity_bytes = 0;
  int64_t headroom_bytes = 0;
  // Costs a person can check: the share of forward ops run again in backward; the pipeline's
  // idle share, (p - 1) / (m + p - 1); the bytes one rank sends per step in its collectives
  // (ring all-reduce 2(d-1)/d of the gradients, all-gather and reduce-scatter (d-1)/d each,
  // and a pipeline stage's activations and their gradients).
  double recompute_fraction = 0;
  double bubble_fraction = 0;
  int64_t communicated_bytes = 0;
  // With offload: the host memory the rank takes (data_parallel.host_bytes) and the model-state
  // bytes it copies between host and GPU per step (plan_space.h, HostTransferBytes).
  int64_t host_bytes = 0;
  int64_t host_transfer_bytes = 0;
};

struct PlanStats {
  int64_t estimates = 0;         // estimates run
  int64_t skipped_counts = 0;    // (GPU type, count) pairs ruled out by the model states alone
  int64_t plans = 0;             // plans emitted
};

// Runs the query, calling `emit` with each plan that fits, in rank order: fewer GPUs first;
// for one count, the smaller GPU (so the first plan of each count answers "the smallest GPU
// type that fits"), then no recomputation before recomputation, the smaller pipeline bubble,
// fewer tensor-parallel ranks (their collectives run in every layer), the fewer bytes to and
// from the host, the larger micro-batch, the most headroom. Offload plans come only at counts
// where no plan fits without it. `emit` returning false stops the search. Returns the budget's
// refusal (deadline, cancellation, op steps) if it stops the search, after emitting the plans
// found to fit at the GPU count it was searching (each a real estimate; plans of that count it
// had not reached may rank before them); an error naming the field for a query that makes no
// sense; and OK otherwise. `budget` null: unlimited.
Status PlanJob(const PlanQuery& query, Budget* budget,
               const std::function<bool(const Plan&)>& emit, PlanStats* stats = nullptr);

}  // namespace memest

#endif  // MEMEST_ENGINE_PLAN_PLANNER_H_
