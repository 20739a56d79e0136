#include "engine/passes/megatron_ddp.h"

#include <numeric>
#include <string>

#include "engine/passes/expert_parallel.h"
#include "engine/step/optimizers.h"

namespace memest {

namespace {

int64_t RoundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

}  // namespace

StatusOr<MegatronDdp> PlanMegatronDdp(const Graph& g, const RunConfig& c) {
  MegatronDdp m;
  m.distributed_optimizer = c.parallelism.sharding == DataSharding::kMegatronDistOpt;
  // Megatron folds the context-parallel ranks into the gradients' reduction and the
  // distributed optimizer's sharding; the experts' group is what expert parallelism leaves.
  const int64_t d = c.parallelism.data * c.parallelism.context;
  m.expert_data = d / c.parallelism.expert;
  DType dtype = ParameterDType(c.precision);
  // param_and_grad_buffer.py: parameters in reverse order; with the distributed optimizer each
  // starts at a multiple of 64 elements and the bucket's end is padded to lcm(group, 128).
  int64_t end = 0, expert_end = 0;
  m.in_param_buffer.assign(g.tensors.size(), 0);
  for (size_t t = g.tensors.size(); t-- > 0;) {
    const Tensor& p = g.tensors[t];
    // distributed_data_parallel.py 175-181: `if not param.requires_grad: continue`.
    if (p.role != TensorRole::kParameter || !p.requires_grad) continue;
    m.in_param_buffer[t] = m.distributed_optimizer;
    dtype = p.dtype;
    // transformer_engine.py: `allreduce = not use_expert_pgs`, expert topology only when
    // expert_model_parallel_size > 1 (expert tensor parallelism is the tensor group's here).
    const bool expert = c.parallelism.expert > 1 && IsExpertParameter(p);
    int64_t& at = expert ? expert_end : end;
    const int64_t start = m.distributed_optimizer ? RoundUp(at, 64) : at;
    at = start + Numel(p.shape);  // below 2^62: the builder checked the parameters' bytes
  }
  auto layout = [&](int64_t elements, int64_t group, int64_t* buffer, int64_t* shard) {
    const bool pad = m.distributed_optimizer && elements > 0;
    *buffer = pad ? RoundUp(elements, std::lcm(group, int64_t{128})) : elements;
    *shard = m.distributed_optimizer ? *buffer / group : *buffer;
  };
  layout(end, d, &m.buffer_elements, &m.shard_elements);
  layout(expert_end, m.expert_data, &m.expert_buffer_elements, &m.expert_shard_elements);
  const int64_t elements = m.buffer_elements + m.expert_buffer_elements;  // each below 2^62
  const int64_t shard = m.shard_elements + m.expert_shard_elements;
  MEMEST_ASSIGN_OR_RETURN(m.grad_buffer_bytes, CheckedMul(elements, 4));
  if (m.distributed_optimizer) {
    MEMEST_ASSIGN_OR_RETURN(m.param_buffer_bytes, CheckedMul(elements, DTypeSize(dtype)));
  }
  MEMEST_ASSIGN_OR_RETURN(int64_t fp32_shard, CheckedMul(shard, 4));
  m.master_bytes = dtype == DType::kFloat32 ? 0 : fp32_shard;
  MEMEST_ASSIGN_OR_RETURN(m.state_bytes, CheckedMul(fp32_shard, CostsOf(c.optimizer, c.runtime).state));
  return m;
}

void AddMegatronDdpNotes(const RunConfig& c, const MegatronDdp& m, Report* r) {
  r->notes.push_back(
      "Megatron-LM's DistributedDataParallel over " + std::to_string(c.parallelism.data) +
      " ranks: every gradient in one float32 buffer (" + FormatBytes(m.grad_buffer_bytes) +
      ", made with the model and zeroed in place), each parameter's gradient added into it by "
      "DDP's hook and dropped (counted without gradient-accumulation fusion, whose weight "
      "gradients never exist apart from the buffer); " +
      (m.distributed_optimizer
           ? "the distributed optimizer: the parameters in one contiguous buffer (" +
                 FormatBytes(m.param_buffer_bytes) + "), and this rank steps " +
                 std::to_string(m.shard_elements) + " of its " +
                 std::to_string(m.buffer_elements) + " elements" +
                 (m.expert_buffer_elements > 0
                      ? " and " + std::to_string(m.expert_shard_elements) + " of the " +
                            std::to_string(m.expert_buffer_elements) + " in the experts' "
                            "buffers, sharded over the " + std::to_string(m.expert_data) +
                            " ranks of its expert-data-parallel group"
                      : std::string()) +
                 ": "
           : std::string("the mixed-precision optimizer over every parameter: ")) +
      "float32 master " + FormatBytes(m.master_bytes) + ", state " + FormatBytes(m.state_bytes) +
      " (fused: no per-parameter scratch)");
}

}  // namespace memest
