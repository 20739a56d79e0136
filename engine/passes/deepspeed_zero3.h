// DeepSpeed ZeRO stage 3 as one rank sees it (docs/parallelism.md), read from DeepSpeed v0.16.0
// (e5570b10): deepspeed/runtime/zero/stage3.py (DeepSpeedZeroOptimizer_Stage3),
// partition_parameters.py, partitioned_param_coordinator.py, parameter_offload.py. The hooks that
// place these buffers in the step are engine/step/deepspeed_zero3.cc.
//
// The step, bf16 / fp16 or fp32, DeepSpeed's FusedAdam, no offload (the same whether the model
// was built under zero.Init or partitioned by deepspeed.initialize):
// - Every parameter keeps a partition of ceil(numel / N) elements in the model's dtype (the
//   trainable ones moved into one flat buffer, lp_param_buffer); param.data is empty between
//   uses. The optimizer keeps an fp32 master copy of the trainable partitions, its state
//   (made at the first step), a gradient-partition buffer in the model's dtype (made at
//   initialisation, kept) and the ipg bucket of reduce_bucket_size elements (5e8 by default,
//   made at initialisation whatever the model's size, kept).
// - Modules: each module's own parameters are gathered by its forward pre-hook and released
//   by its post-hook, and again around its backward. A gather of several parameters makes one
//   flat buffer of N partitions each, and on wait a contiguous copy per parameter; the flat
//   buffer lives until every parameter of the call has been taken by its module. A gather of
//   one parameter leaves the parameter a view of its N-partition buffer.
// - The first forward and backward record the module trace: nothing is prefetched and every
//   module's parameters are released after use. From the second on (a steady step), after each
//   fetch the coordinator prefetches up to min(stage3_prefetch_bucket_size, max_live_parameters
//   - gathered) elements along the trace, and after a module it keeps each parameter that the
//   prefetcher has already scanned past or whose next use comes within max_reuse_distance
//   elements of the trace; parameters of at most stage3_param_persistence_threshold elements
//   are persistent: gathered whole after every step and released only by the next one.
// - Backward: each gradient is copied into the ipg bucket and autograd's tensor goes; a bucket
//   that would overflow, and the last one at the end of backward, is reduce-scattered through a
//   new buffer of N partitions per parameter (reduce_scatter_coalesced's torch.cat) into the
//   gradient partitions.
// - step(): every gathered parameter is released; fp16 checks the gradient partitions for
//   inf/NaN; the norm takes a float64 copy of each partition in turn; per sub-group the
//   gradients are flattened (a model-dtype copy) and cast to float32, stepped, and dropped;
//   the persistent parameters are gathered again.
//
// Offload (read at the same commit; CUDA's blocking copy_ between host and GPU converts dtypes
// on the CPU, aten/src/ATen/native/cuda/Copy.cu `conversion_device = non_blocking ? kCUDA :
// kCPU`, and the non-blocking copies below keep their dtype, so no copy_ makes a GPU
// temporary; the casts that do run on the GPU are named):
// - offload_optimizer (device cpu; self.device is 'cpu', stage3.py line 256): the fp32 master
//   partitions (`.to('cpu').clone().float()`, _create_fp32_partitions), their fp32 gradients
//   (a buffer per sub-group made at initialisation and kept, initialize_optimizer_states), the
//   CPU optimizer's state, grad_partitions_flat_buffer (the model's dtype) and pinned_grad_buffer
//   (the largest partition in fp32, pinned: PyTorch's CachingHostAllocator rounds it up to a
//   power of two) are host memory. The GPU keeps no master, state or gradient partition. In
//   partition_grads each reduced partition is copied to the host buffer and back to the GPU
//   (`grad_buffer.to(grad_partition.device)`, the model's dtype, alive until the next
//   parameter's), and at the accumulation boundary normed (`.double()` of each 250M-element
//   part) and cast to fp32 for the pinned buffer (`.to(float32)`, not for fp32 models). The
//   step runs on the CPU: the GPU sees only the fp32 partitions copied into the 16-bit ones.
// - offload_param (device cpu): the trainable partitions move into one pinned host buffer per
//   parameter group (_create_param_groups_fp16_flat_cpu_memory, rounded up to a power of two);
//   the frozen ones are made on the host (pinned only with pin_memory, false by default),
//   except persistent frozen parameters, which stay on the GPU (_partition_param). A gather
//   first copies the partitions it sends to the GPU (`ds_tensor.to(device)`, all of a
//   coalesced call at once, beside its flat buffer, freed when the call returns); on one rank
//   a fetched parameter is a GPU copy of its whole partition (NoGatherHandle), freed on release.
#ifndef MEMEST_ENGINE_PASSES_DEEPSPEED_ZERO3_H_
#define MEMEST_ENGINE_PASSES_DEEPSPEED_ZERO3_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/ir/config.h"
#include "engine/ir/graph.h"
#include "engine/ir/status.h"
#include "engine/report/report.h"

namespace memest {

// A module the forward runs (the root, a container, a leaf with parameters of its own).
struct Zero3Module {
  std::string scope;
  int first_op = -1;         // its forward pre-hook runs before this op
  int last_op = -1;          // its post-hook after this one (the last op within its scope)
  std::vector<int> params;   // its own parameters (tensor ids), first read first
  // Per parameter (aligned with params): the earliest op of the module whose autograd node
  // keeps a view of the gathered weight until that op's backward (-1: none does).
  std::vector<int> saver;
};

struct DeepSpeedZero3 {
  int64_t world = 1;
  int64_t element_bytes = 2;          // the trainable parameters' dtype (gradients, flatten)
  std::vector<Zero3Module> modules;   // in forward order (by first_op)
  // Per tensor id (parameters; 0 elsewhere): numel, the partition's ceil(numel / N), and
  // whether it is persistent.
  std::vector<int64_t> numel, partition, bytes;  // bytes: of one element, the tensor's dtype
  std::vector<char> persistent;
  int64_t trainable_partition_elements = 0;  // S: the flat lp_param_buffer and the masters
  int64_t largest_sub_group = 0;             // the largest sub-group's partition elements
  int64_t largest_partition = 0;             // the largest trainable partition (the norm)
  int64_t prefetch_elements = 0, max_live_elements = 0, max_reuse_elements = 0;
  int64_t ipg_elements = 0;

  int64_t master_bytes = 0;          // fp32 master partitions
  int64_t state_bytes = 0;           // the optimizer's state over them (first step on)
  int64_t grad_partition_bytes = 0;  // grad_partitions_flat_buffer, the model's dtype
  int64_t ipg_bytes = 0;             // __ipg_bucket_flat_buffer
  int64_t persistent_bytes = 0;      // the persistent parameters, gathered (N partitions each)

  // Offload. on_host: per tensor, whether its partition lives in host memory.
  bool offload_optimizer = false, offload_param = false;
  std::vector<char> on_host;
  int64_t host_param_bytes = 0;          // the partitions offload_param keeps on the host
  int64_t host_master_bytes = 0;         // fp32 master partitions
  int64_t host_grad_bytes = 0;           // their fp32 gradients
  int64_t host_state_bytes = 0;          // the CPU optimizer's state (first step on)
  int64_t host_grad_partition_bytes = 0; // grad_partitions_flat_buffer, the model's dtype
  int64_t host_pinned_bytes = 0;         // pinned_grad_buffer, rounded to a power of two

  int64_t HostBytes() const;
};

// The plan of `graph`'s rank under config.parallelism (deepspeed-zero3). Every rank holds the
// same sizes (the last ones' partitions are padded); rank 0 is estimated.
StatusOr<DeepSpeedZero3> PlanDeepSpeedZero3(const Graph& graph, const RunConfig& config);

// The notes that say what the estimate counts and leaves out.
void AddDeepSpeedZero3Notes(const RunConfig& config, const DeepSpeedZero3& z, Report* report);

}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_DEEPSPEED_ZERO3_H_
