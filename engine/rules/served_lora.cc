// The rule for vLLM's LoRA kernels (engine/passes/served_lora.h adds the op). Inference only:
// a served adapter has no backward.
//
//   punica_lora_(y, x, slots...; slices, rank, shrink=1, tp=1, fully_sharded="none")
//     in place on y, the wrapped module's output: vLLM's punica wrapper adds every slice's
//     adapter (lora/punica_wrapper/punica_gpu.py). With shrink, `slots` are the slices' A
//     stacks then their B stacks and x the module's input: add_lora_linear (add_lora_logits for
//     one slice) makes the float32 buffer [slices, tokens, rank] the shrink writes and the
//     expand reads (tokens: x's rows; rank: the buffer's, a rank's share of it under
//     fully_sharded "column"). Without shrink, `slots` are the B stacks and x the shrunk rows
//     already (the embedding's A rows, looked up): add_lora_embedding expands them, no buffer.
//     fully_sharded "column" (ColumnParallelLinearWithShardedLoRA, _mcp_apply): the buffer is
//     all-gathered across the tp ranks, into a new [tp, slices, tokens, rank] tensor that is
//     then copied to [slices, tokens, tp * rank]; "row" (RowParallelLinearWithShardedLoRA): the
//     buffer is all-reduced (counted out of place: vLLM's custom all-reduce returns a new
//     tensor).
#include "engine/ir/text.h"
#include "engine/rules/internal.h"

namespace memest::rules {
namespace {

struct Punica {
  int64_t slices = 0, rank = 0, tp = 1;
  bool shrink = true;
  std::string sharded;
};

StatusOr<Punica> Read(const OpCall& c) {
  Punica p;
  MEMEST_ASSIGN_OR_RETURN(p.slices, IntAttr(c.op.attrs, "slices", 0, c.field));
  MEMEST_ASSIGN_OR_RETURN(p.rank, IntAttr(c.op.attrs, "rank", 0, c.field));
  MEMEST_ASSIGN_OR_RETURN(p.tp, IntAttr(c.op.attrs, "tp", 1, c.field));
  MEMEST_ASSIGN_OR_RETURN(int64_t shrink, IntAttr(c.op.attrs, "shrink", 1, c.field));
  MEMEST_ASSIGN_OR_RETURN(p.sharded, StringAttr(c.op.attrs, "fully_sharded", "none", c.field));
  p.shrink = shrink != 0;
  return p;
}

// The bytes of a float32 [slices, tokens, rank * widen] buffer, checked.
StatusOr<int64_t> BufferBytes(const OpCall& c, const Punica& p, int64_t widen) {
  const Tensor& x = c.in(1);
  const int64_t tokens = x.shape.back() > 0 ? Numel(x.shape) / x.shape.back() : 0;
  MEMEST_ASSIGN_OR_RETURN(int64_t values, CheckedMul(tokens, p.slices));
  MEMEST_ASSIGN_OR_RETURN(values, CheckedMul(values, p.rank));
  MEMEST_ASSIGN_OR_RETURN(values, CheckedMul(values, widen));
  MEMEST_ASSIGN_OR_RETURN(int64_t bytes, CheckedMul(values, 4));
  if (bytes > kMaxTensorBytes) return InvalidArgument("too large");
  return bytes;
}

StatusOr<std::vector<OutputSpec>> InferPunica(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 1));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 1, 1, 8));
  MEMEST_ASSIGN_OR_RETURN(Punica p, Read(c));
  if (p.slices < 1 || p.slices > 64) {
    return InvalidArgument(AttrField(c, "slices") + ": in [1, 64], got " +
                           std::to_string(p.slices));
  }
  if (p.rank < 1 || p.rank > kMaxLoraRank) {
    return InvalidArgument(AttrField(c, "rank") + ": in [1, " + std::to_string(kMaxLoraRank) +
                           "], got " + std::to_string(p.rank));
  }
  if (p.tp < 1 || p.tp > 1024) {
    return InvalidArgument(AttrField(c, "tp") + ": in [1, 1024], got " + std::to_string(p.tp));
  }
  if (p.sharded != "none" && p.sharded != "column" && p.sharded != "row") {
    return InvalidArgument(AttrField(c, "fully_sharded") + ": none, column or row, got " +
                           Quote(p.sharded));
  }
  const size_t slots = static_cast<size_t>(p.slices * (p.shrink ? 2 : 1));
  if (c.inputs.size() != 2 + slots) {
    return InvalidArgument(c.field + ": " + std::to_string(p.slices) + " slices take " +
                           std::to_string(slots) + " slot inputs after y and x, got " +
                           std::to_string(c.inputs.size() - 2));
  }
  const int64_t widen = p.sharded == "column" ? p.tp : 1;
  if (!BufferBytes(c, p, widen).ok()) {
    return InvalidArgument(InputField(c, 1) + ": its rows' float32 buffer of " +
                           std::to_string(p.slices) + " x " + std::to_string(p.rank * widen) +
                           " values is beyond 2^56 bytes");
  }
  OutputSpec y = Like(c.in(0));
  y.alias_input = 0;
  y.differentiable = false;
  return std::vector<OutputSpec>{y};
}

// Within kMaxTensorBytes each (InferPunica checked the widest).
void PunicaMemory(const OpCall& c, OpMemory* m) {
  m->grad_flow.assign(c.inputs.size(), GradFlow::kNone);
  StatusOr<Punica> p = Read(c);
  if (!p.ok() || !p->shrink) return;
  StatusOr<int64_t> buffer = BufferBytes(c, *p, 1);
  StatusOr<int64_t> whole = BufferBytes(c, *p, p->tp);
  if (!buffer.ok() || !whole.ok()) return;
  m->forward_temps.push_back(Alloc{*buffer, "the shrink's float32 buffer"});
  if (p->sharded == "column") {
    m->forward_temps.push_back(Alloc{*whole, "the buffer all-gathered"});
    m->forward_temps.push_back(Alloc{*whole, "the gathered buffer's copy by slice"});
  } else if (p->sharded == "row") {
    m->forward_temps.push_back(Alloc{*buffer, "the buffer all-reduced"});
  }
}

}  // namespace

void RegisterServedLoraRules(std::vector<OpRule>* r) {
  r->push_back({"punica_lora_", 3, -1, InferPunica, PunicaMemory});
}

}  // namespace memest::rules
