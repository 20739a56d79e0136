// The schedule: the ordered allocations and frees of one training (or inference) step, as
// PyTorch runs it.
//
// Per micro-batch: the data batch arrives; forward runs op by op (an op's outputs, the extra
// tensors autograd keeps, and its scratch are allocated; scratch dies when it returns; a tensor
// dies when no later op reads it and autograd does not hold it); the loss; backward in reverse
// (each op's input gradients and scratch are allocated, then what it saved and its incoming
// gradients are released; gradients flowing into one tensor from several ops are summed in
// place where one of them is uniquely owned; a parameter's first gradient is stolen into .grad
// when it is contiguous and uniquely owned, later ones are added in place). Checkpointed regions
// run without grad in forward, holding only their inputs, and are recomputed with grad just
// before their backward (the regions come from PlanCheckpoints, engine/passes/checkpoint.h).
// Then the optimizer step (state created on the first step; for-loop, foreach and fused updates
// differ in scratch) and zero_grad.
//
// BuildSchedule runs the step simulator (engine/step/simulator.h), one file per phase.
#ifndef MEMEST_ENGINE_STEP_SCHEDULE_H_
#define MEMEST_ENGINE_STEP_SCHEDULE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/ir/budget.h"
#include "engine/ir/config.h"
#include "engine/ir/graph.h"
#include "engine/passes/checkpoint.h"
#include "engine/passes/data_parallel.h"
#include "engine/passes/pipeline.h"
#include "engine/passes/tensor_parallel.h"
#include "engine/report/report.h"
#include "engine/rules/reduce_scratch.h"

namespace memest {

// Where the step is when an event happens.
struct StepContext {
  Phase phase = Phase::kData;
  int op = -1;  // graph op index; -1 outside ops (data, optimizer step)
  int micro_batch = 0;
  bool recompute = false;
};

enum class EventKind : uint8_t {
  kAlloc,    // buffer `buffer` of `bytes` appears, in `category`
  kFree,     // buffer `buffer` is released
  kRetag,    // buffer `buffer` now counts under `category`
  kContext,  // the step moves to contexts[`buffer`]
};

struct Event {
  EventKind kind;
  Category category;
  int buffer;
  int64_t bytes;
  // The CUDA stream a kAlloc's block is allocated on (0: the default stream): the caching
  // allocator keeps each stream's blocks apart (CachingAllocatorModel). A free returns the block
  // to the pool of the stream it came from.
  uint8_t stream = 0;
};

// The storages an op reads and writes at one context of the schedule (recorded only when
// ScheduleOptions::record_operands is set: Validate replays them with real kernels). Buffer ids,
// -1 where the tensor is not live at that moment (an input backward did not keep).
struct OpOperands {
  std::vector<int> inputs;        // per op input: the storage's buffer
  std::vector<int> outputs;       // per op output
  std::vector<int> input_grads;   // backward: per op input, the gradient it hands on (new or passed)
  int output_grad = -1;           // backward: the incoming gradient of the op's first output
};

// A folded pipeline schedule (engine/passes/pipeline.h, PipelineFold): the events [begin_event,
// end_event) are one steady-state period, which the real step runs `copies` more times right
// after it. Each copy allocates `ids` buffers, numbered `ids` on from the copy before; in a copy,
// an event naming a buffer from first_id on names the one `ids` on from it, a buffer before
// first_id (a gradient, the parameters) itself; each copy's micro-batches are
// micro_batch_stride on. What follows the period is the real step's end with the same numbering
// moved on by all the copies. engine/step/fold.cc checks that the period before this one was the
// same, event for event; WalkSchedule replays copies until the allocator's state repeats.
struct RepeatedSpan {
  int begin_event = 0;
  int end_event = 0;
  int first_id = 0;
  int ids = 0;
  int64_t copies = 0;
  int micro_batch_stride = 1;
};

struct Schedule {
  std::vector<Event> events;
  std::vector<StepContext> contexts;
  int num_buffers = 0;
  std::vector<LayerRow> layers;  // from the first micro-batch's forward
  int64_t recomputed_ops = 0;    // ops run twice because of checkpointing
  // Bytes autograd holds at the end of the first micro-batch's forward and loss: distinct
  // storages saved for backward (inputs and targets included, parameters and buffers not) and
  // the extra tensors ops save (masks, statistics), as the tensors' own sizes.
  int64_t saved_for_backward_bytes = 0;
  // Per context (same index as `contexts`): what the op read and wrote there. Empty unless
  // ScheduleOptions::record_operands.
  std::vector<OpOperands> operands;
  std::optional<RepeatedSpan> repeat;  // a folded pipeline schedule; none: every event is here
};

struct ScheduleOptions {
  int64_t cublas_workspace_bytes = 0;  // per cuBLAS handle; 0 for none
  bool record_operands = false;        // fill Schedule::operands (slower; for Validate)
  Budget* budget = nullptr;            // charged one op step per op context; null: unlimited
  const RankView* rank = nullptr;      // one data-parallel rank's view; null: one GPU
  // One pipeline stage (its graph is the one scheduled) and the order of its micro-batches;
  // null: no pipeline.
  const PipelineStage* pipeline = nullptr;
  // The tensor-parallel rank's buffers (the graph is already the rank's); null: none.
  const TensorParallelView* tensor = nullptr;
  // The GPU's multiprocessors and threads per multiprocessor (OpCall::gpu): an H100's by default.
  ReduceDevice gpu;
};

// Builds the schedule of one step. The graph must be built for config.micro_batch(). Refuses
// with the budget's status once options.budget refuses, and with INVALID_ARGUMENT when a sum
// of bytes it keeps (bytes saved for backward, a layer's row) would pass kMaxBytes.
StatusOr<Schedule> BuildSchedule(const Graph& graph, const RunConfig& config,
                                 const CheckpointRegions& regions, const ScheduleOptions& options);

// The refusal of a byte count past kMaxBytes, `what` of the step at context `c` (null: before
// the first op) of `graph`.
Status ByteCountTooLarge(const StepContext* c, const Graph& graph, const std::string& what);

}  // namespace memest

#endif  // MEMEST_ENGINE_STEP_SCHEDULE_H_
