// DeepSpeed ZeRO stages 1 and 2 as one rank sees them (docs/parallelism.md): one optimizer,
// DeepSpeedZeroOptimizer (deepspeed/runtime/zero/stage_1_and_2.py, v0.16.0, e5570b10), whose
// partition_grads says which stage runs, with or without ZeRO-Offload of the optimizer
// (zero_optimization.offload_optimizer.device: cpu). The hooks that place these buffers in the
// step are engine/step/deepspeed_zero.cc.
//
// Both stages:
// - The trainable parameters are flattened into one 16-bit buffer padded to a multiple of 2N
//   elements (flatten_dense_tensors_aligned); rank r owns elements [rP, (r+1)P). Its fp32
//   master copy of that partition (`.clone().float()`, a copy even for float32 parameters) and
//   the optimizer state over it (made on the first step) are the rank's optimizer.
// - optimizer.backward() makes the ipg buffers (reduce_bucket_size elements of the model's
//   dtype, two with overlap_comm) before loss.backward(). A gradient to be reduced is copied
//   into one and autograd's tensor goes; a bucket that would overflow is reduced first
//   (allreduce_bucket flattens it into a new tensor); the gradients of the parameters that
//   overlap the rank's partition are then copied into grads_in_partition (made at the first
//   reduction: those parameters, whole).
// - The epilogue (independent_gradient_partition_epilogue) reduces the last bucket; without
//   offload averaged_gradients becomes views of the partition's slices of grads_in_partition
//   (get_flat_partition(return_tensor_list=True); the last rank adds a tensor of zeros for its
//   padding), so grads_in_partition stays until the step. A later micro-batch makes a new
//   grads_in_partition, adds it into averaged_gradients and drops it. The ipg buffers go.
// - step(): fp16 checks every slice for inf/NaN (x.float(), isnan, isinf, logical_or, float:
//   11 bytes an element), the gradient norm takes a float64 copy of each slice; then
//   flatten(averaged_gradients).to(float32), averaged_gradients dropped, the fused update, and
//   the fp32 gradient goes.
// Stage 2 (partition_grads True) registers a hook on every parameter: gradients are reduced as
// they become ready, in every micro-batch. Stage 1 registers them only with overlap_comm, and
// reduces only at the gradient-accumulation boundary: until then .grad accumulates whole in the
// model's dtype, as without DeepSpeed, and the ipg buffers made by each backward stay until the
// boundary's epilogue. Without overlap_comm, stage 1 reduces after loss.backward() returns
// (engine.allreduce_gradients -> reduce_gradients), walking the parameters in model order.
// With offload_optimizer (self.device = 'cpu'; pin_memory false, DeepSpeed's default):
// - the fp32 master partition, its fp32 gradient (made at initialisation and kept) and the
//   optimizer state are host tensors, and a host staging buffer of the largest parameter's
//   elements (temp_grad_buffer_for_cpu_offload); with gradient accumulation, each parameter
//   that overlaps the partition gets a host buffer of its own, whole, in the model's dtype
//   (accumulated_grads_in_cpu, kept);
// - the GPU keeps temp_grad_buffer_for_gpu_offload (the largest parameter's elements, model
//   dtype) for its life; there is no grads_in_partition and no averaged_gradients: at the
//   boundary each gradient overlapping the partition is, after its bucket's reduction, normed
//   (a float64 copy of its slice), checked for inf/NaN (x.float() of the whole gradient, then
//   the masks) and copied to the host through a float32 copy of its slice;
// - step() runs the optimizer on the CPU and copies the fp32 partition back to the GPU
//   (`fp32_partition.to(device)`: 4 bytes an element) into the 16-bit parameters.
#ifndef MEMEST_ENGINE_PASSES_DEEPSPEED_ZERO_H_
#define MEMEST_ENGINE_PASSES_DEEPSPEED_ZERO_H_

#include <cstdint>
#include <vector>

#include "engine/ir/config.h"
#include "engine/ir/graph.h"
#include "engine/ir/status.h"
#include "engine/report/report.h"

namespace memest {

// DeepSpeedZeroOptimizer's buffers on one rank (all bytes; GPU unless named host_).
struct DeepSpeedZero {
  bool partition_gradients = true;  // stage 2; false: stage 1
  bool offload = false;             // offload_optimizer.device: cpu
  bool overlap_comm = false;        // the second ipg buffer; stage 1's hooks
  int64_t rank = 0;                 // the rank whose grads_in_partition is the largest
  int64_t partition_elements = 0;   // the rank's share of the padded flat parameters
  int64_t grad_element_bytes = 2;   // the gradients' dtype (the model's, under ZeRO)
  // Per tensor id: the parameter's elements inside the rank's partition (0: none, or not a
  // trainable parameter).
  std::vector<int64_t> slice;
  int64_t largest_param_elements = 0;  // the largest trainable parameter

  // On the GPU.
  int64_t master_bytes = 0;              // fp32 master partition (0 with offload)
  int64_t state_bytes = 0;               // optimizer state over it, float32 (0 with offload)
  int64_t grads_in_partition_bytes = 0;  // the parameters overlapping the partition, whole
  int64_t padding_bytes = 0;        // the last rank's zeros in averaged_gradients (no offload)
  int64_t ipg_elements = 0;         // one ipg buffer's capacity
  int64_t ipg_bytes = 0;            // one ipg buffer
  int ipg_buffers = 1;              // 2 with overlap_comm
  int64_t step_scratch_bytes = 0;   // the step's largest check: norm (8 B) or fp16's (11 B)
  int64_t step_fp32_bytes = 0;      // the step's float32 copy (0 for float32 gradients)
  int64_t offload_buffer_bytes = 0; // temp_grad_buffer_for_gpu_offload
  int64_t copy_back_bytes = 0;      // the offloaded step's fp32_partition.to(device)

  // In host memory (offload only).
  int64_t host_master_bytes = 0;   // single_partition_of_fp32_groups
  int64_t host_grad_bytes = 0;     // its fp32 .grad
  int64_t host_state_bytes = 0;    // the CPU optimizer's state (made on the first step)
  int64_t host_staging_bytes = 0;  // temp_grad_buffer_for_cpu_offload
  int64_t host_accum_bytes = 0;    // accumulated_grads_in_cpu (grad_accum_steps > 1)

  int64_t HostBytes() const;  // their sum
};

// The plan of `graph`'s rank under config.parallelism (deepspeed-zero1 or deepspeed-zero2): the
// rank that holds the most (the largest grads_in_partition, the lowest such rank).
StatusOr<DeepSpeedZero> PlanDeepSpeedZero(const Graph& graph, const RunConfig& config);

// Bytes of the inf/NaN check of `elements` values of `element_bytes` each (_has_inf_or_nan:
// x.float() unless already float32, two masks, their or, its float copy, all live at once).
int64_t OverflowCheckBytes(int64_t elements, int64_t element_bytes);

// The notes that say what the estimate counts and leaves out.
void AddDeepSpeedZeroNotes(const RunConfig& config, const DeepSpeedZero& z, Report* report);

}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_DEEPSPEED_ZERO_H_
