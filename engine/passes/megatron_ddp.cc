#include "engine/passes/megatron_ddp.h"

#include <numeric>
#include <string>

#include "engine/step/optimizers.h"

namespace memest {

namespace {

int64_t RoundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

}  // namespace

StatusOr<MegatronDdp> PlanMegatronDdp(const Graph& g, const RunConfig& c) {
  MegatronDdp m;
  m.distributed_optimizer = c.parallelism.sharding == DataSharding::kMegatronDistOpt;
  // Megatron folds the context-parallel ranks into the gradients' reduction and the
  // distributed optimizer's sharding.
  const int64_t d = c.parallelism.data * c.parallelism.context;
  DType dtype = ParameterDType(c.precision);
  // param_and_grad_buffer.py: parameters in reverse order; with the distributed optimizer each
  // starts at a multiple of 64 elements and the bucket's end is padded to lcm(d, 128).
  int64_t end = 0;
  m.in_param_buffer.assign(g.tensors.size(), 0);
  for (size_t t = g.tensors.size(); t-- > 0;) {
    const Tensor& p = g.tensors[t];
    // distributed_data_parallel.py 175-181: `if not param.requires_grad: continue`.
    if (p.role != TensorRole::kParameter || !p.requires_grad) continue;
    m.in_param_buffer[t] = m.distributed_optimizer;
    dtype = p.dtype;
    const int64_t start = m.distributed_optimizer ? RoundUp(end, 64) : end;
    end = start + Numel(p.shape);  // below 2^62: the builder checked the parameters' bytes
  }
  m.buffer_elements = m.distributed_optimizer ? RoundUp(end, std::lcm(d, int64_t{128})) : end;
  m.shard_elements = m.distributed_optimizer ? m.buffer_elements / d : m.buffer_elements;
  MEMEST_ASSIGN_OR_RETURN(m.grad_buffer_bytes, CheckedMul(m.buffer_elements, 4));
  if (m.distributed_optimizer) {
    MEMEST_ASSIGN_OR_RETURN(m.param_buffer_bytes, CheckedMul(m.buffer_elements, DTypeSize(dtype)));
  }
  MEMEST_ASSIGN_OR_RETURN(int64_t fp32_shard, CheckedMul(m.shard_elements, 4));
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
                 std::to_string(m.buffer_elements) + " elements: "
           : std::string("the mixed-precision optimizer over every parameter: ")) +
      "float32 master " + FormatBytes(m.master_bytes) + ", state " + FormatBytes(m.state_bytes) +
      " (fused: no per-parameter scratch)");
}

}  // namespace memest
