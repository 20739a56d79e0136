// The tensor-parallel pass's rewriting of one op (engine/passes/tensor_parallel.h), shared by
// tensor_parallel.cc (plan, leaves, driver), tensor_parallel_ops.cc (how each op runs on a
// rank's share) and tensor_parallel_layers.cc (Megatron's layers). Not part of the engine's API.
#ifndef MEMEST_ENGINE_PASSES_TENSOR_PARALLEL_INTERNAL_H_
#define MEMEST_ENGINE_PASSES_TENSOR_PARALLEL_INTERNAL_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/ir/graph.h"
#include "engine/passes/tensor_parallel.h"

namespace memest {
namespace tensor_parallel {

// Which dim of a tensor a rank holds 1/t of: none, the features a column-parallel linear split
// (and what follows from them: heads), or the sequence (sequence parallelism).
struct Split {
  int dim = -1;
  bool sequence = false;
  // A column-parallel weight whose linear's output is all-gathered whole (kColwiseGathered);
  // not part of the split's identity.
  bool gather = false;
  // The shares the dim is cut into; 0: t. Fewer key-value heads than ranks are cut by heads,
  // each rank holding one (vLLM's and Megatron's replicated KV heads: t / parts ranks hold the
  // same one). Not part of the split's identity.
  int64_t parts = 0;
  bool none() const { return dim < 0; }
  bool operator==(const Split& o) const { return dim == o.dim && sequence == o.sequence; }
  bool operator!=(const Split& o) const { return !(*this == o); }
};

// Ops whose output holds each input's elements where the input holds them (pointwise,
// broadcasting, casts, copies, dropout).
bool IsElementwise(std::string_view kind);

// The dim of `out` that holds the outermost part of dim d of `in` when a view reshapes `in`
// into `out` (the part a split keeps whole), or `prefer` when it is among the dims that hold
// some of d and divides by t; -1 when no dim can hold a 1/t split.
int ReshapedDim(const Shape& in, const Shape& out, int d, int64_t t, int prefer);

// What tensor t is a cast of (autocast's `to` of a parameter), or t itself.
inline int UncastOf(const Graph& g, int t) {
  const int p = g.tensors[t].producer;
  return p >= 0 && g.ops[p].kind == "to" ? g.ops[p].inputs[0] : t;
}

// Where a linear's operands sit among its inputs: linear(x, weight, bias?) or HF Conv1D's
// addmm(bias, x2d, weight[in, out]). bias -1: none.
struct LinearSlots {
  int x, w, bias;
};
inline LinearSlots SlotsOf(const Op& op, bool conv1d) {
  if (conv1d) return {1, 2, 0};
  return {0, 1, op.inputs.size() > 2 ? 2 : -1};
}

class Sharder {
 public:
  // `graph` is the whole model's; `split` holds each of its leaves' splits (the plan's
  // parameters, the sequence-split inputs); `scatter` the activation where the sequence is
  // split (-1: none).
  Sharder(const Graph& graph, int64_t t, bool sequence_parallel, int sequence_dim,
          std::vector<Split> split, int scatter, TensorParallelView* view);
  // Megatron-LM's MoE layers (tensor_parallel_moe.cc), found by their dispatch: each rank
  // routes its share of the tokens, `load` spreading them over the experts; `sharding` must be
  // Megatron's (or none).
  Status FindMoeLayers(ExpertLoad load, DataSharding sharding);
  // Context parallelism (engine/passes/context_parallel.h): t ranks each hold 1/t of the
  // sequence everywhere; attention becomes ring attention, and a position-indexed tensor (a
  // rotary table) meeting a split activation is sliced to the rank's positions.
  void set_context() { context_ = true; }
  // DTensor's layers (config.parallelism.tensor_layers; tensor_parallel_dtensor.cc) instead of
  // Megatron's.
  void set_dtensor() { dtensor_ = true; }

  // Adds op i of the whole graph to `b` as the rank runs it and maps its outputs. Errors go
  // to the builder (GraphBuilder::Fail). Always true (for ReplayGraph).
  bool Emit(int i, GraphBuilder& b, std::vector<int>& map);

 private:
  Status EmitOp(int i, GraphBuilder& b, std::vector<int>& map);
  void NoteSequenceParallelParams(int i, const std::vector<int>& map);
  // The splits of op i's outputs, and the attributes it runs with on the rank; or a refusal.
  Status Propagate(int i, std::vector<Split>* out, Attrs* attrs);
  // The shares split `s` cuts its dim into.
  int64_t Parts(const Split& s) const { return s.parts > 0 ? s.parts : t_; }
  Status CheckLinear(int i, bool conv1d) const;
  Status Linear(int i, GraphBuilder& b, std::vector<int>& map, bool conv1d);
  Status VocabEmbedding(int i, GraphBuilder& b, std::vector<int>& map);
  // DTensor's ColwiseParallel / RowwiseParallel on a linear, RowwiseParallel on an embedding.
  Status DTensorLinear(int i, GraphBuilder& b, std::vector<int>& map, bool conv1d);
  Status DTensorEmbedding(int i, GraphBuilder& b, std::vector<int>& map);
  // The module input x (of g_) is a view or cast of, following views and casts that keep its
  // split; `chain` gets those ops, x's producer first.
  int ModuleInput(int x, std::vector<int>* chain) const;
  // What colwise linear op i reads for x on the rank: x's module input through from_local, or
  // under sequence parallelism all-gathered whole once per module (PrepareModuleInput's
  // redistribute to Replicate), then viewed and cast as x again.
  StatusOr<int> ColumnInput(int i, int x, GraphBuilder& b, const std::vector<int>& map);
  // Before op i: the modules op i is outside of have returned, and their gathered inputs are
  // held until their last op (module_holds_).
  void ReleaseModuleHolds(int i, GraphBuilder& b);
  // Funcol's copies (scatter_copy, gather_copy) for a collective along dim d.
  static Attrs FuncolCopies(int d);
  Status RingAttention(int i, GraphBuilder& b, std::vector<int>& map);
  // Op i of MoE layer moe_of_op_[i] as the rank runs it; *done false: the usual rules run it.
  Status MoeOp(int i, GraphBuilder& b, std::vector<int>& map, bool* done);
  Status MoeAllToAll(int i, GraphBuilder& b, std::vector<int>& map);
  Status ExpertLinear(int i, GraphBuilder& b, std::vector<int>& map);
  // Adds `kind` and maps op i's outputs with `split`, their shapes the rank's own (the tokens
  // a rank's experts compute on need not be the whole graph's share).
  Status AddMoe(int i, GraphBuilder& b, std::vector<int>& map, std::vector<int> inputs,
                Attrs attrs, Split split);
  // Unsplit operands of an elementwise op whose dim meets the split one whole, sliced to the
  // rank's share: under context parallelism any, under sequence parallelism buffers.
  void SliceToShare(int i, const Split& y, GraphBuilder& b, std::vector<int>* inputs);
  Status VocabCrossEntropy(int i, GraphBuilder& b, std::vector<int>& map);
  Status Reduction(int i, std::vector<Split>* out);
  Status Elementwise(int i, std::vector<Split>* out);
  Status Matmul(int i, std::vector<Split>* out);
  Status Reshape(int i, std::vector<Split>* out, Attrs* attrs);
  // Adds `kind` and maps op i's outputs to its outputs, after checking that each has the
  // whole graph's shape with its split dim divided by t.
  Status AddChecked(int i, GraphBuilder& b, std::vector<int>& map, std::string_view kind,
                    std::vector<int> inputs, Attrs attrs, const std::vector<Split>& splits);
  // "op 12 (linear in h.3.mlp)".
  std::string Where(int i) const;
  Split In(int i, size_t k) const { return split_[g_.ops[i].inputs[k]]; }
  int Rank(int tensor) const { return static_cast<int>(g_.tensors[tensor].shape.size()); }
  Status Refuse(int i, const std::string& why) const;
  int SequenceDimOf(int rank) const;

  const Graph& g_;
  int64_t t_;
  bool sp_;
  int sequence_dim_;
  std::vector<Split> split_;  // per tensor of g_
  int scatter_;
  TensorParallelView* view_;
  bool context_ = false;
  bool dtensor_ = false;
  // (module input of g_, module scope) -> its all-gathered whole on the rank.
  std::map<std::pair<int, std::string>, int> gathered_;
  std::vector<std::pair<int, std::string>> module_holds_;  // (gathered tensor on the rank, module)
  // Under sequence parallelism, the whole shape of the hidden state where the sequence is split
  // (the layout funcol's copies follow); empty until known.
  Shape sequence_layout_;
  struct MoeLayer {
    std::string scope;  // the layer's (its dispatch's)
    int64_t tokens = 0, experts = 0, top_k = 0;  // the whole graph's tokens
    DType probs = DType::kFloat32;  // the routing weights' dtype
    // The dispatch's outputs (of g_) and the rank's all-to-all outputs before the gather.
    std::vector<std::pair<int, int>> dispatched;
  };
  std::vector<MoeLayer> moe_;
  std::vector<int> moe_of_op_;  // per op of g_: its MoE layer, -1: none
  ExpertLoad load_ = ExpertLoad::kDefault;
  DataSharding sharding_ = DataSharding::kNone;
};

}  // namespace tensor_parallel
}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_TENSOR_PARALLEL_INTERNAL_H_
