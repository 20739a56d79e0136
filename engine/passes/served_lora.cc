// vLLM's adapter slots and kernels on a served rank's graph (engine/passes/served_lora.h).
#include "engine/passes/served_lora.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/ir/shape.h"
#include "engine/ir/text.h"
#include "engine/passes/passes.h"
#include "engine/report/report.h"

namespace memest {
namespace {

// LogitsProcessorWithLoRA.create_lora_weights: "When using LoRA, vocab size must be <= 258048".
constexpr int64_t kMaxLogitsVocab = 258048;
constexpr char kPunica[] = "punica_wrapper.";
constexpr char kSlotA[] = ".lora_a_stacked";
constexpr char kSlotB[] = ".lora_b_stacked";
constexpr char kLogitsMap[] = "logits_processor.sharded_to_full_mapping_gpu";

std::string_view LastName(std::string_view scope) {
  const size_t dot = scope.rfind('.');
  return dot == std::string_view::npos ? scope : scope.substr(dot + 1);
}

// The vLLM module a Hugging Face projection is a slice of (packed_modules_mapping).
std::string VllmName(std::string_view hf) {
  if (hf == "q_proj" || hf == "k_proj" || hf == "v_proj") return "qkv_proj";
  if (hf == "gate_proj" || hf == "up_proj") return "gate_up_proj";
  return std::string(hf);
}

bool IsLinear(const Op& op) { return op.kind == "linear" || op.kind == "megatron_linear"; }

enum class Parallel { kReplicated, kColumn, kRow };

Parallel ParallelOf(const Op& op) {
  if (op.kind != "megatron_linear") return Parallel::kReplicated;
  return HasAttr(op.attrs, "input_grad") ? Parallel::kColumn : Parallel::kRow;
}

bool EndsWith(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

bool IsLoraLeaf(const Tensor& t) {
  return t.producer < 0 && (t.name.rfind(kPunica, 0) == 0 || EndsWith(t.name, kSlotA) ||
                            EndsWith(t.name, kSlotB) || t.name == kLogitsMap);
}

Shape Slot(int64_t loras, int64_t rows, int64_t cols) { return Shape{loras, 1, rows, cols}; }

// A buffer named in full (the builder would prefix the scope of the op being replayed).
int Leaf(GraphBuilder& b, const std::string& name, Shape shape, DType dtype) {
  const std::string scope = b.scope();
  b.SetScope("");
  const int id = b.Buffer(name, std::move(shape), dtype);
  b.SetScope(scope);
  return id;
}

// One slice of a wrapped linear: its slots' shapes and the punica op's settings.
struct Slice {
  Shape a, b;
  int64_t rank = 0;  // the shrink buffer's (the A stack's rows)
  std::string sharded = "none";
};

class Wrapper {
 public:
  Wrapper(const Graph& g, const ServedLora& l) : g_(g), l_(l) {}

  Status Plan();
  bool Emit(int i, GraphBuilder& b, std::vector<int>& map);

 private:
  bool Wrapped(const std::string& name) const {
    return l_.targets.empty() ||
           std::find(l_.targets.begin(), l_.targets.end(), name) != l_.targets.end();
  }
  int RunEnd(int first) const;
  StatusOr<Slice> SliceOf(int op) const;
  // `total` plus the bytes of a `d` tensor of shape `s`; past kMaxBytes when it overflows.
  static int64_t Count(int64_t total, const Shape& s, DType d);
  void AddIndexTensors(GraphBuilder& b);
  void EmitLinear(int i, GraphBuilder& b, std::vector<int>& map);
  void EmitEmbedding(int i, GraphBuilder& b, std::vector<int>& map);
  void EmitLogits(int i, GraphBuilder& b, std::vector<int>& map);
  int InPlace(GraphBuilder& b, std::vector<int>& map, int old, std::vector<int> inputs,
              Attrs attrs);

  const Graph& g_;
  const ServedLora& l_;
  std::map<int, std::string> member_;              // wrapped linear op -> its group
  std::map<std::string, std::vector<int>> group_;  // group -> its ops, in order
  std::map<int, Slice> slice_;
  std::map<std::string, std::vector<int>> slots_;  // group -> A stacks, then B stacks
  int embed_op_ = -1, embed_end_ = -1, head_op_ = -1, head_end_ = -1;
  int rows_ = -1, head_x_ = -1;
  int64_t vocab_ = 0, hidden_ = 0;
  bool head_copy_ = false;
  DType dtype_ = DType::kBFloat16;
};

int Wrapper::RunEnd(int first) const {
  int last = first;
  while (last + 1 < static_cast<int>(g_.ops.size()) &&
         g_.ops[last + 1].scope == g_.ops[first].scope) {
    ++last;
  }
  return last;
}

StatusOr<Slice> Wrapper::SliceOf(int i) const {
  const Op& op = g_.ops[i];
  Shape w = g_.tensors[op.inputs[1]].shape;
  StatusOr<std::string> layout = StringAttr(op.attrs, "weight_layout", "out_in", "");
  if (layout.ok() && *layout == "in_out" && w.size() == 2) std::swap(w[0], w[1]);
  if (w.size() != 2) return InvalidArgument("config.lora: " + op.scope + " is not a 2-D linear");
  const int64_t out = w[0], in = w[1], r = l_.rank, t = l_.tensor, L = l_.max_loras;
  Slice s;
  s.rank = r;
  const Parallel p = ParallelOf(op);
  if (l_.fully_sharded && p == Parallel::kColumn) {
    if (r % t != 0) {
      return InvalidArgument(
          "config.lora.rank: fully_sharded_loras splits a column-parallel "
          "linear's rank over the " +
          std::to_string(t) + " tensor ranks, and " + std::to_string(r) + " does not divide");
    }
    s.rank = r / t;
    s.sharded = "column";
  }
  int64_t b_rows = out;
  if (l_.fully_sharded && p == Parallel::kRow) {
    if (out % t != 0) {
      return InvalidArgument("config.serving.fully_sharded_loras: " + op.scope + "'s " +
                             std::to_string(out) + " outputs do not split over " +
                             std::to_string(t) + " tensor ranks");
    }
    b_rows = out / t;
    s.sharded = "row";
  }
  s.a = Slot(L, s.rank, in);
  s.b = Slot(L, b_rows, r);
  return s;
}

int64_t Wrapper::Count(int64_t total, const Shape& s, DType d) {
  int64_t n = DTypeSize(d);
  for (int64_t dim : s) {
    StatusOr<int64_t> m = CheckedMul(n, dim);
    if (!m.ok()) return kMaxBytes + 1;
    n = *m;
  }
  StatusOr<int64_t> sum = CheckedAdd(total, n);
  return sum.ok() ? std::min(*sum, kMaxBytes + 1) : kMaxBytes + 1;
}

Status Wrapper::Plan() {
  for (int i = 0; i < static_cast<int>(g_.ops.size()); ++i) {
    const Op& op = g_.ops[i];
    const std::string_view last = LastName(op.scope);
    if (IsLinear(op) && op.inputs.size() >= 2 &&
        g_.tensors[op.inputs[1]].role == TensorRole::kParameter && last != "lm_head") {
      const std::string name = VllmName(last);
      if (!Wrapped(name)) continue;
      const std::string group = std::string(ScopeParent(op.scope)) + "." + name;
      member_[i] = group;
      group_[group].push_back(i);
      dtype_ = g_.tensors[op.inputs[0]].dtype;
    } else if (l_.layout.embeddings && embed_op_ < 0 && last == "embed_tokens" &&
               (op.kind == "embedding" || op.kind == "vocab_parallel_embedding")) {
      embed_op_ = i;
    } else if (l_.layout.embeddings && head_op_ < 0 && last == "lm_head" && IsLinear(op)) {
      head_op_ = i;
    }
  }
  if (embed_op_ >= 0) {
    const Op& op = g_.ops[embed_op_];
    const Tensor& w = g_.tensors[op.inputs[0]];
    const int64_t shards = op.kind == "vocab_parallel_embedding" ? l_.tensor : 1;
    vocab_ = w.shape[0] * shards;  // within the graph's bounds: its whole table
    hidden_ = w.shape[1];
    dtype_ = w.dtype;
  }
  // Qwen3's tied lm_head is embed_tokens under a second name: wrapped again, never run.
  head_copy_ = embed_op_ >= 0 && l_.layout.head_is_embedding && Wrapped("lm_head");
  if (!Wrapped("embed_tokens")) embed_op_ = -1;
  if (!Wrapped("lm_head")) head_op_ = -1;
  int64_t bytes = 0;
  for (const auto& [op, group] : member_) {
    MEMEST_ASSIGN_OR_RETURN(Slice s, SliceOf(op));
    bytes = Count(bytes, s.a, dtype_);
    bytes = Count(bytes, s.b, dtype_);
    slice_[op] = std::move(s);
  }
  const int64_t L = l_.max_loras, r = l_.rank;
  if (embed_op_ >= 0) embed_end_ = RunEnd(embed_op_);
  for (int c = (embed_op_ >= 0) + head_copy_; c > 0; --c) {
    bytes = Count(bytes, Shape{L, vocab_, r}, dtype_);
    bytes = Count(bytes, Slot(L, hidden_, r), dtype_);
  }
  if (head_op_ >= 0) {
    head_end_ = RunEnd(head_op_);
    const Shape& logits = g_.tensors[g_.ops[head_end_].outputs[0]].shape;
    const Shape& x = g_.tensors[g_.ops[head_op_].inputs[0]].shape;
    if (logits.empty() || x.empty()) return InvalidArgument("model: lm_head has no features");
    if (logits.back() > kMaxLogitsVocab) {
      return InvalidArgument(
          "config.lora: vLLM refuses LoRA on a vocabulary over " + std::to_string(kMaxLogitsVocab) +
          " tokens (LogitsProcessorWithLoRA), and this model's lm_head has " +
          std::to_string(logits.back()) + "; leave lm_head out of config.lora.target_modules");
    }
    bytes = Count(bytes, Slot(L, r, x.back()), dtype_);
    bytes = Count(bytes, Slot(L, logits.back(), r), dtype_);
  }
  if (bytes > kMaxBytes) {
    return InvalidArgument("config.serving.max_loras: " + std::to_string(L) +
                           " adapter slots of rank " + std::to_string(r) +
                           " in every wrapped module would hold more than 2^62 bytes");
  }
  return Status::Ok();
}

void Wrapper::AddIndexTensors(GraphBuilder& b) {
  const int64_t T = l_.max_num_batched_tokens, B = l_.max_num_seqs, L = l_.max_loras;
  const std::string p = kPunica;
  for (const char* name : {"token_lora_indices", "sampler_indices", "sampler_indices_padded"}) {
    Leaf(b, p + name, Shape{T}, DType::kInt64);
  }
  Leaf(b, p + "embeddings_indices", Shape{2, T}, DType::kInt64);
  for (const char* name : {"seq_start_locs", "seq_lengths", "lora_indices_per_batch"}) {
    Leaf(b, p + name, Shape{B}, DType::kInt64);
  }
  for (const char* meta : {"token_mapping_meta.", "prompt_mapping_meta."}) {
    Leaf(b, p + meta + "token_lora_mapping", Shape{T}, DType::kInt32);
    Leaf(b, p + meta + "token_indices_sorted_by_lora_ids", Shape{T}, DType::kInt32);
    Leaf(b, p + meta + "active_lora_ids", Shape{L + 1}, DType::kInt32);
    Leaf(b, p + meta + "num_tokens_per_lora", Shape{L + 1}, DType::kInt32);
    Leaf(b, p + meta + "lora_token_start_loc", Shape{L + 2}, DType::kInt32);
  }
}

// punica_lora_ in place on op output `old` (mapped), which later ops then read.
int Wrapper::InPlace(GraphBuilder& b, std::vector<int>& map, int old, std::vector<int> inputs,
                     Attrs attrs) {
  inputs.insert(inputs.begin(), map[old]);
  const int y = b.Add1("punica_lora_", std::move(inputs), std::move(attrs));
  if (y >= 0) map[old] = y;
  return y;
}

void Wrapper::EmitLinear(int i, GraphBuilder& b, std::vector<int>& map) {
  const Op& op = g_.ops[i];
  const std::string& group = member_.at(i);
  const Slice& s = slice_.at(i);
  const int x = map[op.inputs[0]];
  ReplayOp(g_, op, MappedInputs(op, map), op.attrs, b, map);
  std::vector<int>& slots = slots_[group];
  slots.insert(slots.begin() + static_cast<long>(slots.size() / 2),
               Leaf(b, op.scope + kSlotA, s.a, dtype_));
  slots.push_back(Leaf(b, op.scope + kSlotB, s.b, dtype_));
  const std::vector<int>& members = group_.at(group);
  if (members.back() != i) return;
  std::vector<int> inputs{x};
  inputs.insert(inputs.end(), slots.begin(), slots.end());
  InPlace(b, map, op.outputs[0], std::move(inputs),
          {{"slices", static_cast<int64_t>(members.size())},
           {"rank", s.rank},
           {"tp", l_.tensor},
           {"fully_sharded", s.sharded}});
}

void Wrapper::EmitEmbedding(int i, GraphBuilder& b, std::vector<int>& map) {
  const Op& op = g_.ops[i];
  const int64_t L = l_.max_loras, r = l_.rank;
  if (i == embed_op_) {
    const std::string scope(op.scope);
    const int a = Leaf(b, scope + kSlotA, Shape{L, vocab_, r}, dtype_);
    const int bslot = Leaf(b, scope + kSlotB, Slot(L, hidden_, r), dtype_);
    // VocabParallelEmbeddingWithLoRA.forward: F.embedding(x + indices, lora_a_stacked_2d)
    // before the base layer.
    const int ids = b.Add1("add", {map[op.inputs[1]]}, {{"scalar", 0.0}});
    const int table = b.Add1("reshape", {a}, {{"shape", std::vector<int64_t>{L * vocab_, r}}});
    rows_ = b.Add1("embedding", {table, ids});
    slots_["embed_tokens"] = {bslot};
  }
  ReplayOp(g_, op, MappedInputs(op, map), op.attrs, b, map);
  if (i != embed_end_) return;
  InPlace(b, map, op.outputs[0], {rows_, slots_["embed_tokens"][0]},
          {{"slices", int64_t{1}}, {"rank", r}, {"shrink", int64_t{0}}});
}

void Wrapper::EmitLogits(int i, GraphBuilder& b, std::vector<int>& map) {
  const Op& op = g_.ops[i];
  if (i == head_op_) head_x_ = map[op.inputs[0]];
  ReplayOp(g_, op, MappedInputs(op, map), op.attrs, b, map);
  if (i != head_end_) return;
  const int64_t L = l_.max_loras, r = l_.rank;
  const int64_t vocab = g_.tensors[op.outputs[0]].shape.back();
  const int64_t hidden = b.shape(head_x_).back();
  const int a = Leaf(b, std::string("logits_processor") + kSlotA, Slot(L, r, hidden), dtype_);
  const int bslot = Leaf(b, std::string("logits_processor") + kSlotB, Slot(L, vocab, r), dtype_);
  if (l_.tensor > 1) {
    // LogitsProcessorWithLoRA._get_logits: logits[:, sharded_to_full_mapping_gpu], a new tensor.
    // get_sharded_to_full_mapping: one entry per row of the padded table (64 a multiple).
    const int index = Leaf(b, kLogitsMap, Shape{CeilDiv(vocab, 64) * 64}, DType::kInt64);
    const int y = op.outputs[0];
    map[y] = b.Add1("index", {map[y], index},
                    {{"dim", static_cast<int64_t>(b.shape(map[y]).size()) - 1}});
  }
  InPlace(b, map, op.outputs[0], {head_x_, a, bslot},
          {{"slices", int64_t{1}}, {"rank", r}, {"tp", l_.tensor}});
}

bool Wrapper::Emit(int i, GraphBuilder& b, std::vector<int>& map) {
  if (i == 0) {
    AddIndexTensors(b);
    if (head_copy_) {
      Leaf(b, std::string("lm_head") + kSlotA, Shape{l_.max_loras, vocab_, l_.rank}, dtype_);
      Leaf(b, std::string("lm_head") + kSlotB, Slot(l_.max_loras, hidden_, l_.rank), dtype_);
    }
  }
  if (member_.count(i) > 0) {
    EmitLinear(i, b, map);
    return true;
  }
  if (embed_op_ >= 0 && i >= embed_op_ && i <= embed_end_) {
    EmitEmbedding(i, b, map);
    return true;
  }
  if (head_op_ >= 0 && i >= head_op_ && i <= head_end_) {
    EmitLogits(i, b, map);
    return true;
  }
  return false;
}

}  // namespace

ServedLora ServedLoraOf(const RunConfig& config) {
  ServedLora l;
  l.max_loras = config.serving.max_loras > 0 ? config.serving.max_loras : 1;
  l.rank = config.lora.rank;
  l.fully_sharded = config.serving.fully_sharded_loras;
  l.targets = config.lora.target_modules;
  l.layout = config.serving.lora_layout;
  l.tensor = config.parallelism.tensor;
  l.max_num_batched_tokens = config.serving.max_num_batched_tokens;
  l.max_num_seqs = config.serving.max_num_seqs;
  return l;
}

StatusOr<Graph> ApplyServedLora(const Graph& rank, const ServedLora& lora, Budget* budget) {
  Wrapper w(rank, lora);
  MEMEST_RETURN_IF_ERROR(w.Plan());
  return ReplayGraph(
      rank, [&](int i, GraphBuilder& b, std::vector<int>& map) { return w.Emit(i, b, map); },
      std::nullopt, nullptr, budget);
}

int64_t ServedLoraBytes(const Graph& graph) {
  int64_t bytes = 0;
  for (const Tensor& t : graph.tensors) {
    if (IsLoraLeaf(t) && !memest::AddBytes(&bytes, Bytes(t.shape, t.dtype))) return kMaxBytes;
  }
  return bytes;
}

std::string ServedLoraNote(const Graph& graph, const ServedLora& lora) {
  std::set<std::string> modules, names;  // vLLM's: q_proj, k_proj and v_proj are one
  for (const Tensor& t : graph.tensors) {
    if (t.producer >= 0 || !EndsWith(t.name, kSlotB)) continue;
    const std::string scope = t.name.substr(0, t.name.size() - (sizeof(kSlotB) - 1));
    const std::string name = scope == "logits_processor" ? "lm_head" : VllmName(LastName(scope));
    names.insert(name);
    modules.insert(std::string(ScopeParent(scope)) + "." + name);
  }
  std::string wrapped, ignored;
  for (const std::string& n : names) wrapped += (wrapped.empty() ? "" : ", ") + n;
  for (const std::string& t : lora.targets) {
    if (names.count(t) == 0) ignored += (ignored.empty() ? "" : ", ") + Quote(t);
  }
  if (!ignored.empty()) {
    ignored = "; target_modules " + ignored +
              " name no module vLLM wraps in this model, and vLLM ignores them";
  }
  return "serving with LoRA (vLLM's --enable-lora): " + std::to_string(lora.max_loras) +
         (lora.max_loras == 1 ? " adapter slot" : " adapter slots") + " of rank " +
         std::to_string(lora.rank) + " in " +
         std::to_string(modules.size()) + " modules (" + wrapped + ")" +
         (lora.fully_sharded ? ", fully sharded" : "") + ", " +
         FormatBytes(ServedLoraBytes(graph)) +
         " on this GPU with the punica wrapper's index tensors, made at load time in the model's "
         "dtype; the profile run activates no adapter but runs every wrapped module's kernels "
         "(their float32 buffers counted), and CUDA graphs are captured with and without "
         "adapters (twice as many, outside gpu_memory_utilization)" +
         ignored;
}

}  // namespace memest
