// What kernels an op of the graph runs on the device: its forward (one context of the
// schedule) or its backward, at the model's shapes, reading and writing the buffers the
// schedule gave its tensors.
//
// GEMM-shaped ops (linear, addmm, matmul, bmm, einsum contractions) run cuBLAS; convolutions run
// cuDNN; softmax, norms and reductions run our kernels; every other op that writes memory runs
// an elementwise kernel over its output. Where an operand is not live at that moment (an input
// backward did not keep), or its buffer is smaller than the shape needs (a broadcast operand),
// the op runs as memory only: its buffers are still written, and `reason` says why.
#ifndef MEMEST_VALIDATE_OP_WORK_H_
#define MEMEST_VALIDATE_OP_WORK_H_

#include <string>
#include <vector>

#include "engine/ir/graph.h"
#include "engine/step/schedule.h"
#include "validate/device.h"

namespace memest::validate {

// A buffer of the schedule: where it lives on the device and how many bytes it has.
struct BufferView {
  DevicePtr ptr = 0;
  int64_t bytes = 0;
};

struct OpWork {
  std::vector<Work> work;  // in the order they run
  std::string reason;      // why it runs as memory only ("" when every kernel runs)
};

// `buffer(id)` gives a live buffer's place ({0, 0} when not live).
template <typename BufferFn>
OpWork WorkOfOp(const Graph& graph, int op, bool backward, const OpOperands& operands,
                BufferFn buffer);

// ---- implementation details ----

// Operand buffers of one op, resolved.
struct ResolvedOperands {
  std::vector<BufferView> inputs, outputs, input_grads;
  BufferView output_grad;
};
OpWork WorkOfResolved(const Graph& graph, int op, bool backward, const ResolvedOperands& r);

template <typename BufferFn>
OpWork WorkOfOp(const Graph& graph, int op, bool backward, const OpOperands& operands,
                BufferFn buffer) {
  ResolvedOperands r;
  auto get = [&](int id) { return id >= 0 ? buffer(id) : BufferView{}; };
  for (int id : operands.inputs) r.inputs.push_back(get(id));
  for (int id : operands.outputs) r.outputs.push_back(get(id));
  for (int id : operands.input_grads) r.input_grads.push_back(get(id));
  r.output_grad = get(operands.output_grad);
  return WorkOfResolved(graph, op, backward, r);
}

}  // namespace memest::validate

#endif  // MEMEST_VALIDATE_OP_WORK_H_
