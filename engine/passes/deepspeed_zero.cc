#include "engine/passes/deepspeed_zero.h"

#include <algorithm>
#include <string>

#include "engine/ir/shape.h"
#include "engine/step/optimizers.h"

namespace memest {
namespace {

bool Trainable(const Tensor& t) { return t.role == TensorRole::kParameter && t.requires_grad; }

// The elements of parameter [start, start + n) that fall in [lo, hi).
int64_t Inside(int64_t start, int64_t n, int64_t lo, int64_t hi) {
  return std::max<int64_t>(0, std::min(start + n, hi) - std::max(start, lo));
}

}  // namespace

int64_t DeepSpeedZero::HostBytes() const {
  int64_t total = 0;
  for (int64_t b : {host_master_bytes, host_grad_bytes, host_state_bytes, host_staging_bytes,
                    host_accum_bytes}) {
    if (!AddBytes(&total, b)) return kMaxBytes;
  }
  return total;
}

int64_t OverflowCheckBytes(int64_t elements, int64_t element_bytes) {
  // float_x (a copy unless float32), isnan and isinf (bool), their logical_or, and its
  // .float() while all of them are alive. Elements are below 2^62 / 11: a parameter's.
  return elements * ((element_bytes == 4 ? 0 : 4) + 3 + 4);
}

StatusOr<DeepSpeedZero> PlanDeepSpeedZero(const Graph& g, const RunConfig& c) {
  const ParallelismConfig& p = c.parallelism;
  DeepSpeedZero z;
  z.partition_gradients = p.sharding == DataSharding::kDeepSpeedZero2;
  z.offload = p.offload_optimizer;
  z.overlap_comm = p.overlap_comm;
  std::vector<int> params;  // the flat buffer's parameters, model.parameters() order
  int64_t numel = 0;
  DType dtype = ParameterDType(c.precision);
  for (size_t t = 0; t < g.tensors.size(); ++t) {
    if (!Trainable(g.tensors[t])) continue;
    params.push_back(static_cast<int>(t));
    const int64_t n = Numel(g.tensors[t].shape);
    numel += n;  // below 2^62: the builder checked the parameters' bytes
    z.largest_param_elements = std::max(z.largest_param_elements, n);
    dtype = g.tensors[t].dtype;
  }
  // flatten_dense_tensors_aligned(..., nccl_start_alignment_factor (2) * dp_size)
  const int64_t align = 2 * p.data;
  const int64_t padded = (numel + align - 1) / align * align;
  z.partition_elements = padded / p.data;
  z.grad_element_bytes = DTypeSize(dtype);
  // copy_grads_in_partition sizes its buffer by the parameters that overlap the partition,
  // whole: the rank whose partition meets the largest of them holds the most.
  int64_t most = -1;
  std::vector<int64_t> starts(params.size());
  for (size_t k = 0, s = 0; k < params.size(); ++k) {
    starts[k] = static_cast<int64_t>(s);
    s += Numel(g.tensors[params[k]].shape);
  }
  size_t first = 0;
  for (int64_t r = 0; r < p.data; ++r) {
    const int64_t lo = r * z.partition_elements, hi = lo + z.partition_elements;
    while (first < params.size() &&
           starts[first] + Numel(g.tensors[params[first]].shape) <= lo) {
      ++first;
    }
    int64_t overlap = 0;
    for (size_t j = first; j < params.size() && starts[j] < hi; ++j) {
      overlap += Numel(g.tensors[params[j]].shape);
    }
    if (overlap > most) {
      most = overlap;
      z.rank = r;
    }
    if (first == params.size()) break;  // the ranks after hold only padding
  }
  most = std::max<int64_t>(most, 0);
  const int64_t lo = z.rank * z.partition_elements, hi = lo + z.partition_elements;
  z.slice.assign(g.tensors.size(), 0);
  int64_t inside = 0, largest_slice = 0;
  for (size_t k = 0; k < params.size(); ++k) {
    const int64_t n = Inside(starts[k], Numel(g.tensors[params[k]].shape), lo, hi);
    z.slice[params[k]] = n;
    inside += n;
    largest_slice = std::max(largest_slice, n);
  }
  const int64_t e = z.grad_element_bytes;
  MEMEST_ASSIGN_OR_RETURN(z.grads_in_partition_bytes, CheckedMul(most, e));
  MEMEST_ASSIGN_OR_RETURN(const int64_t fp32_partition, CheckedMul(z.partition_elements, 4));
  const OptimizerCosts oc = CostsOf(c.optimizer, c.runtime);
  MEMEST_ASSIGN_OR_RETURN(const int64_t state, CheckedMul(fp32_partition, oc.state));
  z.ipg_elements = p.reduce_bucket_elements > 0 ? p.reduce_bucket_elements
                                                : kDeepSpeedReduceBucketElements;
  MEMEST_ASSIGN_OR_RETURN(z.ipg_bytes, CheckedMul(z.ipg_elements, e));
  z.ipg_buffers = p.overlap_comm ? 2 : 1;
  if (!z.offload) {
    z.master_bytes = fp32_partition;
    z.state_bytes = state;
    z.padding_bytes = (z.partition_elements - inside) * e;
    // Elements are below 2^62 / 11 (the builder's check of the parameters' bytes).
    z.step_scratch_bytes = std::max(8 * largest_slice,
                                    dtype == DType::kFloat16 ? OverflowCheckBytes(largest_slice, e)
                                                             : 0);
    z.step_fp32_bytes = e == 4 ? 0 : fp32_partition;
    return z;
  }
  MEMEST_ASSIGN_OR_RETURN(z.offload_buffer_bytes, CheckedMul(z.largest_param_elements, e));
  z.copy_back_bytes = fp32_partition;
  z.host_master_bytes = fp32_partition;
  z.host_grad_bytes = fp32_partition;
  z.host_state_bytes = state;
  z.host_staging_bytes = z.offload_buffer_bytes;
  if (c.grad_accum_steps > 1) z.host_accum_bytes = z.grads_in_partition_bytes;
  return z;
}

void AddDeepSpeedZeroNotes(const RunConfig& c, const DeepSpeedZero& z, Report* r) {
  const int64_t world = c.parallelism.data;
  std::string s = std::string("DeepSpeed ZeRO-") + (z.partition_gradients ? "2" : "1") +
                  " over " + std::to_string(world) + " ranks, rank " + std::to_string(z.rank) +
                  " estimated: it steps " + std::to_string(z.partition_elements) +
                  " elements of the flat parameters; ";
  if (z.offload) {
    s += "offload_optimizer cpu: its fp32 master copy, fp32 gradient and optimizer state are "
         "host memory (" + FormatBytes(z.HostBytes()) + " in all, data_parallel.host_bytes: "
         "master " + FormatBytes(z.host_master_bytes) + ", gradient " +
         FormatBytes(z.host_grad_bytes) + ", state " + FormatBytes(z.host_state_bytes) +
         ", staging " + FormatBytes(z.host_staging_bytes) +
         (z.host_accum_bytes > 0 ? ", accumulated gradients " + FormatBytes(z.host_accum_bytes)
                                 : std::string()) +
         "; pin_memory false), the GPU keeps a " + FormatBytes(z.offload_buffer_bytes) +
         " gradient staging buffer and takes the fp32 partition back at the step (" +
         FormatBytes(z.copy_back_bytes) + ")";
  } else {
    s += "fp32 master copy and optimizer state " + FormatBytes(z.master_bytes) + " + " +
         FormatBytes(z.state_bytes) + ", grads_in_partition " +
         FormatBytes(z.grads_in_partition_bytes) + " kept to the step";
  }
  s += "; backward makes " + std::to_string(z.ipg_buffers) + " ipg buffer(s) of " +
       std::to_string(z.ipg_elements) + " elements (" + FormatBytes(z.ipg_bytes) +
       " each) whatever the model's size";
  if (!z.partition_gradients) {
    s += "; gradients stay whole in .grad until the accumulation boundary, then are reduced " +
         std::string(z.overlap_comm ? "in backward as they become ready"
                                    : "after backward, in parameter order");
  }
  s += "; its fused optimizer has no per-parameter scratch (config.optimizer.impl does not "
       "apply)";
  r->notes.push_back(s);
}

}  // namespace memest
