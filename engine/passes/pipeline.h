// Pipeline parallelism as one stage sees it (docs/parallelism.md): the stage's slice of the
// graph and the order its micro-batches run in.
//
// The model's repeated blocks are split evenly over the stages, as Megatron-LM's
// non-interleaved schedule and torch.distributed.pipelining's manual split do: the first stage
// also runs what comes before the first block (the embeddings), the last what comes after the
// last block (the final norm, the head and the loss). A stage other than the first receives one
// activation from the stage before it: `torch.empty(shape, requires_grad=True)`, an input of the
// stage's graph that requires grad. A stage other than the last sends one activation on, and its
// backward starts from the gradient it receives for it (the same shape).
//
// The schedule (megatron/core/pipeline_parallel/schedules.py,
// forward_backward_pipelining_without_interleaving): 1F1B runs min(p - stage - 1, m) forwards
// first, then one forward and one backward in turn, then the remaining backwards; GPipe runs
// all m forwards, then all m backwards, in micro-batch order.
#ifndef MEMEST_ENGINE_PASSES_PIPELINE_H_
#define MEMEST_ENGINE_PASSES_PIPELINE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/ir/config.h"
#include "engine/ir/graph.h"
#include "engine/ir/status.h"

namespace memest {

struct PipelineAction {
  bool forward = true;     // a forward, or a backward
  int64_t micro_batch = 0;
  int chunk = 0;           // the model chunk (interleaved schedule); 0 otherwise
};

// One model chunk of a stage: its ops in the stage's graph, what its backward starts from (the
// activation it sends on, or the loss), and its blocks.
struct StageChunk {
  int first_op = 0;
  int last_op = -1;
  int sent = -1;
  int64_t first_block = 0;
  int64_t last_block = 0;
};

// A long 1F1B or interleaved schedule simulated short. Its steady state repeats a period of
// `period` actions (a forward and a backward, or stages x v of each interleaved), each period
// `stride` micro-batches on from the one before. The stage's step is simulated with `actions`,
// the schedule of `micro_batches` micro-batches, in which the period of actions [end - period,
// end) stands for itself and `copies` more: the schedule of the real micro-batches is exactly
// `actions` with those copies inserted after action `end` (checked when the fold is planned).
// From action `zone` on, the steady state is far enough from the warm-up that every buffer a
// period refers to was made in a period like it (engine/step/fold.cc checks the events; the
// walk through the allocator model replays copies until its state repeats).
struct PipelineFold {
  int64_t micro_batches = 0;
  std::vector<PipelineAction> actions;
  int64_t period = 0;
  int64_t stride = 0;
  int64_t end = 0;
  int64_t zone = 0;
  int64_t copies = 0;
};

struct PipelineStage {
  int64_t stage = 0;
  int64_t stages = 1;
  int64_t first_block = 0;  // the blocks it runs: [first_block, last_block]
  int64_t last_block = 0;
  Graph graph;              // the stage's slice; its loss is the sent activation but on the last
  // Its model chunks, in the graph's op order: one, or (interleaved) pipeline_virtual_stages
  // slices of the model side by side, each its own input and output.
  std::vector<StageChunk> chunks;
  std::vector<PipelineAction> actions;  // its micro-batches, in the order they run
  bool keep_outputs = false;  // the sent output stays whole until its backward
  // The first or the last stage of a model whose embedding is tied to its head: it holds the
  // tied weight too (Megatron's embedding group all-reduces its gradient over the two).
  bool holds_tied_embedding = false;
  std::optional<PipelineFold> fold;  // the same step simulated short; none: simulate `actions`
};

// Stage `stage` of `graph` under config.parallelism (pipeline stages, schedule) with
// config.grad_accum_steps micro-batches. Refuses, naming config.parallelism.pipeline, a model
// whose blocks do not split evenly or whose stages would pass more than one activation.
StatusOr<PipelineStage> PlanPipelineStage(const Graph& graph, const RunConfig& config,
                                          int64_t stage);

// The order of one stage's forwards and backwards.
std::vector<PipelineAction> PipelineActions(PipelineSchedule schedule, int64_t stage,
                                            int64_t stages, int64_t micro_batches);

// Megatron-LM's interleaved 1F1B (schedules.py, forward_backward_pipelining_with_interleaving,
// get_schedule_table with microbatch_group_size_per_vp_stage = stages): virtual micro-batch k
// runs micro-batch (k / (stages v)) stages + k mod stages on chunk (k / stages) mod v (backward:
// the chunks in reverse); (stages - stage - 1) x 2 + (v - 1) x stages forwards first, then one
// forward and one backward in turn, then the remaining backwards. m must be a multiple of stages.
std::vector<PipelineAction> InterleavedActions(int64_t stage, int64_t stages, int64_t v,
                                               int64_t micro_batches);

// The fold of stage `stage`'s schedule of `micro_batches` micro-batches (v model chunks; v = 1:
// `schedule`), when one would save simulating some: none for GPipe, whose memory grows with
// every forward, or when the steady state is too short to repeat.
std::optional<PipelineFold> FoldPipelineActions(PipelineSchedule schedule, int64_t stage,
                                                int64_t stages, int64_t v, int64_t micro_batches);

// The micro-batches the step simulator runs for stage `stage` under config: its fold's, or all.
int64_t SimulatedMicroBatches(const RunConfig& config, int64_t stage);

}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_PIPELINE_H_
