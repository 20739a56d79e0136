// The IR: a graph of tensors and ops for one forward pass (plus loss) of one micro-batch.
//
// Tensors carry a concrete shape, dtype and strides, a role (parameter, buffer, input,
// activation) and, for views and in-place results, the tensor whose storage they share. Ops
// carry a kind from the op vocabulary (engine/rules/op_rules.h), their inputs and outputs,
// attributes and the module scope they ran in ("h.3.attn"). Every op output's shape and dtype is
// inferred by the op's rule when the op is added, so a Graph that exists is well formed.
//
// Graphs are built with GraphBuilder; presets, layer models, op-graph models and (later) the
// Python tracer all end here.
#ifndef MEMEST_ENGINE_IR_GRAPH_H_
#define MEMEST_ENGINE_IR_GRAPH_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "engine/ir/budget.h"
#include "engine/ir/config.h"
#include "engine/ir/dtype.h"
#include "engine/ir/shape.h"
#include "engine/ir/status.h"

namespace memest {

// An attribute value: an integer, a float, a list of integers or a string.
using AttrValue = std::variant<int64_t, double, std::vector<int64_t>, std::string>;

// An op's attributes by name. Copies share one map until one of them is changed (copy on
// write): a stamped block's ops and a pass's replayed ops copy their originals' attributes
// without copying the map. Reading never changes an Attrs (iterators are const), so threads
// may read one alike; an iterator or reference into an Attrs is good until it is next written
// (a write to a shared map makes the Attrs its own copy first).
class Attrs {
 public:
  using Map = std::map<std::string, AttrValue, std::less<>>;
  using key_type = Map::key_type;
  using mapped_type = Map::mapped_type;
  using value_type = Map::value_type;
  using size_type = Map::size_type;
  using const_iterator = Map::const_iterator;

  Attrs() = default;
  Attrs(std::initializer_list<value_type> init) {
    if (init.size() > 0) map_ = std::make_shared<Map>(init);
  }

  const_iterator begin() const { return map().begin(); }
  const_iterator end() const { return map().end(); }
  size_type size() const { return map_ ? map_->size() : 0; }
  bool empty() const { return size() == 0; }
  template <typename K>
  const_iterator find(const K& key) const {
    return map().find(key);
  }
  template <typename K>
  size_type count(const K& key) const {
    return map().count(key);
  }
  const mapped_type& at(std::string_view key) const {
    auto it = map().find(key);
    if (it == map().end()) throw std::out_of_range("Attrs::at");
    return it->second;
  }
  mapped_type& operator[](const std::string& key) { return Own()[key]; }
  mapped_type& operator[](std::string&& key) { return Own()[std::move(key)]; }
  template <typename... Args>
  bool emplace(Args&&... args) {
    return Own().emplace(std::forward<Args>(args)...).second;
  }
  template <typename K, typename V>
  void insert_or_assign(K&& key, V&& value) {
    Own().insert_or_assign(std::forward<K>(key), std::forward<V>(value));
  }
  template <typename K>
  size_type erase(const K& key) {
    return Own().erase(key);
  }
  void clear() { map_.reset(); }

  friend bool operator==(const Attrs& a, const Attrs& b) {
    return a.map_ == b.map_ || a.map() == b.map();
  }
  friend bool operator!=(const Attrs& a, const Attrs& b) { return !(a == b); }

 private:
  const Map& map() const {
    static const Map kEmpty;
    return map_ ? *map_ : kEmpty;
  }
  // The map, made this Attrs' own before it is written through.
  Map& Own() {
    if (!map_) {
      map_ = std::make_shared<Map>();
    } else if (map_.use_count() > 1) {
      map_ = std::make_shared<Map>(*map_);
    } else {
      // The last other owner may have just let go on another thread, after reading the map:
      // its release (the count's decrement) comes before this write.
      std::atomic_thread_fence(std::memory_order_acquire);
    }
    return *map_;
  }

  std::shared_ptr<Map> map_;  // null: none
};

enum class TensorRole : uint8_t {
  kActivation,  // produced by an op
  kInput,       // model input from the data batch (token ids, images)
  kTarget,      // loss target from the data batch (labels)
  kParameter,   // trainable (requires_grad) or frozen weight
  kBuffer,      // non-trainable module state (BatchNorm running stats, KV cache)
};

struct Tensor {
  std::string name;
  Shape shape;
  Strides strides;
  DType dtype = DType::kFloat32;
  TensorRole role = TensorRole::kActivation;
  bool requires_grad = false;  // for leaves as declared; for activations as autograd derives it
  int producer = -1;           // index of the op that made it; -1 for leaves
  int alias_of = -1;           // tensor whose storage this one shares (views, in-place results)
  int batch_dim = -1;          // for inputs: the dim that scales with the batch (-1: none)
  bool kv_cache = false;       // a buffer that is an inference KV cache
  // Model parameters each stored element holds: 2 for a 4-bit weight packed two to a uint8
  // (bitsandbytes' Params4bit), counted so in Graph::ParameterCount.
  uint8_t values_per_element = 1;
};

// Tensors an op reads or writes, held inline up to six (no heap allocation for almost every op).
using TensorPtrs = absl::InlinedVector<const Tensor*, 6>;

// A tensor the model's Python code keeps referenced past its last use in the graph (a local
// variable that lives until its function returns): PyTorch frees a storage when its last
// reference dies, so this one stays allocated until op `until_op` has run (and longer when an
// op still reads it or autograd holds it).
struct HeldTensor {
  int tensor = -1;
  int until_op = -1;
};

struct Op {
  std::string kind;
  std::vector<int> inputs;
  std::vector<int> outputs;
  Attrs attrs;
  std::string scope;
};

struct Graph {
  std::vector<Tensor> tensors;
  std::vector<Op> ops;
  int loss = -1;        // the scalar that backward starts from; -1 when there is none
  int loss_begin = -1;  // index of the first op of the loss computation; -1: no loss ops
  // Scopes of the model's repeated blocks in execution order (e.g. "h.0" .. "h.11"): the units
  // of block-wise checkpoint policies.
  std::vector<std::string> blocks;
  // Op ranges [first, last] the model's own code checkpoints (an op graph's `checkpoints`), in
  // order, before the loss; and, for each, whether it is non-reentrant (use_reentrant=False).
  std::vector<std::pair<int, int>> checkpoints;
  std::vector<bool> checkpoint_non_reentrant;
  // Tensors the model's code keeps referenced past their last use (memest.trace records them
  // from weak references), each until an op of the graph has run.
  std::vector<HeldTensor> held;
  // The tensors the model's forward returns (memest.trace records them). Empty: the forward
  // tensors the loss reads in training, the last op's outputs in inference (ModelOutputs in
  // engine/step/python_refs.h).
  std::vector<int> outputs;
  // The keys and values the forward also returns in its cache (Hugging Face's past_key_values
  // under the use_cache their configs set): the loop's outputs hold them too, unless the blocks
  // are checkpointed (gradient_checkpointing_enable() turns use_cache off in training:
  // ModelOutputs in engine/step/python_refs.h). Views keep their whole storage.
  std::vector<int> cache;
  // The dtype torch.autocast cast to while the graph was built (its casts are ops of the graph);
  // float32 when it was built without autocast.
  DType autocast = DType::kFloat32;
  // What the graph was built to run on: the few shape rules that differ between CUDA and the
  // CPU runtime see it (a fused attention's output layout, engine/rules/attention.cc).
  Runtime runtime = Runtime::kCuda;

  // Per op: the op it was copied from (GraphBuilder::StampBlock; the first one built, where
  // copies were copied), -1 for one built; empty when no block was stamped. A hint: the step
  // simulator shares a rule's answer between the two only after OpsAlikeToRules
  // (engine/rules/op_rules.h), so a pass that changes one and not the other changes no answer.
  std::vector<int> copy_of;

  int64_t ParameterCount() const;      // elements of all parameters
  int64_t TrainableParameterCount() const;
};

// "activation", "input", "target", "parameter" or "buffer".
const char* TensorRoleName(TensorRole role);

// True if `scope` is `prefix` or lies inside it ("h.3.attn" is inside "h.3", "h.30" is not).
bool ScopeWithin(std::string_view scope, std::string_view prefix);
// The scope `scope` lies in ("h.3" for "h.3.attn"; "" at the top).
std::string_view ScopeParent(std::string_view scope);

// Attribute accessors: each returns the attribute or `fallback` when absent, and an error
// naming `<context>.attrs.<name>` when present with the wrong type.
StatusOr<int64_t> IntAttr(const Attrs& attrs, std::string_view name, int64_t fallback,
                          const std::string& context);
StatusOr<double> FloatAttr(const Attrs& attrs, std::string_view name, double fallback,
                           const std::string& context);
StatusOr<std::vector<int64_t>> IntsAttr(const Attrs& attrs, std::string_view name,
                                        std::vector<int64_t> fallback,
                                        const std::string& context);
StatusOr<std::string> StringAttr(const Attrs& attrs, std::string_view name,
                                 std::string fallback, const std::string& context);
bool HasAttr(const Attrs& attrs, std::string_view name);

// Whether `status` is GraphBuilder's refusal of a tensor too large to count in bytes that it
// could not blame on a request field (GraphBuilder::NameSize): "<context>: the output of ...
// would be [...] of float32, more than 2^62 bytes".
bool IsUnattributedSizeError(const Status& status);

// Builds a Graph op by op, inferring each op's outputs with its rule.
//
// Errors are sticky: the first failure is recorded, later calls do nothing and return -1
// (or empty), and Finish() returns the error. That keeps builder code (presets, layers) free of
// error plumbing while every error still reaches the user with its field path: errors are
// prefixed with the context set by SetErrorContext (e.g. "model.layers[3]").
class GraphBuilder {
 public:
  GraphBuilder();

  // Leaves. Shapes are validated (non-negative, at most kMaxTensorBytes each), and all leaves
  // together (parameters, buffers, inputs, targets) may hold at most kMaxBytes.
  // requires_grad: the input's gradient is computed in backward and kept in its .grad while it
  // lives (floating inputs only).
  int Input(std::string name, Shape shape, DType dtype, int batch_dim = 0, bool requires_grad = false);
  int Target(std::string name, Shape shape, DType dtype, int batch_dim = 0);
  int Parameter(std::string name, Shape shape, DType dtype, bool trainable = true);
  int Buffer(std::string name, Shape shape, DType dtype);
  int KvCache(std::string name, Shape shape, DType dtype);

  // Appends an op of `kind` and returns its outputs. `output_names` (optional) names them;
  // other outputs stay unnamed (naming every activation would cost an allocation per tensor on
  // the estimate's hot path; nothing reads activation names).
  std::vector<int> Add(std::string_view kind, std::vector<int> inputs, Attrs attrs = {},
                       std::vector<std::string> output_names = {});
  // Add() for ops with one output (or where only the first matters): returns -1 on error.
  int Add1(std::string_view kind, std::vector<int> inputs, Attrs attrs = {});

  // Copies a leaf of another graph as it is (for passes that rewrite a graph).
  int CopyLeaf(const Tensor& leaf);
  // Sets the scope of the ops added next (for passes replaying another graph's ops).
  void SetScope(std::string scope) { scope_ = std::move(scope); }
  // From now on, ops are added as under torch.autocast(dtype=half): Add() first inserts the
  // casts autocast would make of their inputs (engine/passes/passes.h, AutocastInputs).
  void EnableAutocast(DType half);
  // autocast's dtype (EnableAutocast), float32 without it.
  DType autocast() const { return graph_.autocast; }
  // The runtime the ops added next are inferred for (Graph::runtime); CUDA unless set.
  void SetRuntime(Runtime runtime) { graph_.runtime = runtime; }

  // Module scopes: ops added between Push and Pop carry "outer.inner" scopes.
  void PushScope(std::string_view name);
  void PopScope();
  const std::string& scope() const { return scope_; }
  // Marks the current scope as one of the model's repeated blocks (see Graph::blocks).
  void MarkBlock();
  // The model's Python code keeps `tensor` referenced until the last op added so far has run (a
  // local of a function that returns after that op): Graph::held. Nothing once failed, for a
  // negative id, or before any op.
  void HoldUntilLastOp(int tensor);
  // The model's forward returns `tensor` (Graph::outputs), or returns it in its cache
  // (Graph::cache). Nothing once failed, or for a negative id.
  void MarkOutput(int tensor);
  void MarkCache(int tensor);
  // Ops added from now on compute the loss.
  void BeginLoss();
  void SetLoss(int tensor);

  // Repeated blocks (RepeatBlocks, engine/models/repeat_blocks.h). A block's ops that depend
  // only on its input's shape, dtype and strides and on tensors made before the loop need not be
  // built again: BeginBlock and EndBlock record what one block added, and StampBlock adds a copy
  // of it under the current scope on another input, as building it would (its ops' scopes and
  // its leaves' names take the current scope in place of the recorded block's).
  struct BlockMark {
    int input = -1;   // the tensor the block took
    int output = -1;  // and the one it returned
    int first_op = 0, end_op = 0;
    int first_tensor = 0, end_tensor = 0;
    size_t first_held = 0, end_held = 0;
    size_t first_output = 0, end_output = 0;
    size_t first_cache = 0, end_cache = 0;
    size_t first_size = 0, end_size = 0;  // NameSize's entries
    int64_t leaf_bytes = 0;               // its leaves' bytes
    std::string scope;                    // its scope ("h.3")
    // Nothing outside what a copy repeats changed (the loss, checkpoints, the list of blocks),
    // and the builder had not failed.
    bool stampable = false;
    // What a copy does not repeat, as it stood when the block began.
    int loss = -1, loss_begin = -1;
    size_t checkpoints = 0, blocks = 0;
  };
  BlockMark BeginBlock(int input) const;
  void EndBlock(int output, BlockMark* mark) const;
  // Adds the ops and tensors of block `from` again, reading `input` where it read its own input
  // and whatever else it read (tensors made before tensor `loop_start`) as it did; returns the
  // copy's output. Returns -1 and adds nothing when the copy would not be what building the
  // block would make, or would meet an error (building it then makes the same error): `input`
  // differs from the block's in what its ops see, the block read a tensor made in the loop
  // other than its input, or the copy would pass max_ops or the leaves' byte limit. Also -1
  // after a failure (the budget's refusal, looked at as Add does). Off (-1) unless stamping.
  int StampBlock(const BlockMark& from, int input, int loop_start);
  // Makes room for `copies` more copies of block `from` (within max_ops), so that stamping them
  // does not move the graph's ops and tensors again and again.
  void ReserveCopies(const BlockMark& from, int64_t copies);
  // Whether StampBlock may copy blocks (on by default; tests build graphs both ways).
  void SetStamping(bool on) { stamping_ = on; }
  bool stamping() const { return stamping_; }
  int num_tensors() const { return static_cast<int>(graph_.tensors.size()); }

  void SetErrorContext(std::string context) {
    context_ = std::move(context);
    context_fn_ = nullptr;
  }
  // The same, made only when an error names it (a pass that sets one for each op it replays).
  void SetLazyErrorContext(std::function<std::string()> context) {
    context_.clear();
    context_fn_ = std::move(context);
  }
  // Refuses (RESOURCE_EXHAUSTED) to add an op past `max_ops`, so that no request builds more
  // than its limit before it is refused.
  void SetMaxOps(int64_t max_ops) { max_ops_ = max_ops; }
  // Looks at `budget`'s deadline and cancellation every 256 ops added, and fails with its
  // refusal (null: never).
  void SetBudget(Budget* budget) { budget_ = budget; }
  // Names the request field a size came from ("config.batch_size",
  // "model.layers[0].attrs.out_features"). A tensor too large to count in bytes is then
  // reported against the field of its largest named dim among those that alone make it too
  // large (the later name where two sizes are equal): the field the user set, rather than a
  // tensor the user never named.
  void NameSize(int64_t size, std::string field);
  void Fail(Status status);
  const Status& status() const { return status_; }
  bool ok() const { return status_.ok(); }
  const Tensor& tensor(int id) const { return graph_.tensors[id]; }
  const Shape& shape(int id) const { return graph_.tensors[id].shape; }
  int num_ops() const { return static_cast<int>(graph_.ops.size()); }

  // The finished graph, or the first error. Refuses a graph with more than `max_ops` ops.
  StatusOr<Graph> Finish(int64_t max_ops = 1'000'000);

 private:
  int AddLeaf(std::string name, Shape shape, DType dtype, TensorRole role, bool requires_grad,
              int batch_dim);
  // The error for `what` ("the input 'x'") of `shape`, whose bytes exceed kMaxBytes: under the
  // field a size of it came from (NameSize), or else under the error context.
  Status TooLarge(const Shape& shape, DType dtype, const std::string& what) const;

  friend void AutocastInputs(GraphBuilder& b, std::string_view kind, std::vector<int>& inputs,
                             Attrs& attrs);

  Graph graph_;
  Status status_;
  bool in_autocast_ = false;           // inserting autocast's casts: not re-entered
  std::vector<int> autocast_weights_;  // autocast's cache: parameter id -> its cast
  std::string scope_;
  std::vector<size_t> scope_marks_;
  std::string context_;
  std::function<std::string()> context_fn_;  // a lazy context_ (SetLazyErrorContext)
  // The error context ("" for none; a lazy one is made here, for an error only).
  std::string Context() const { return context_fn_ ? context_fn_() : context_; }
  // The error context, or `fallback` when it is empty.
  std::string ContextOr(std::string_view fallback) const {
    std::string context = Context();
    return context.empty() ? std::string(fallback) : context;
  }
  int64_t max_ops_ = 1'000'000;
  Budget* budget_ = nullptr;
  bool stamping_ = true;
  int64_t leaf_bytes_ = 0;  // all leaves' bytes, within kMaxBytes
  std::vector<std::pair<int64_t, std::string>> named_sizes_;  // size, field
};

// RAII scope for GraphBuilder.
class ScopeGuard {
 public:
  ScopeGuard(GraphBuilder& b, std::string_view name) : b_(b) { b_.PushScope(name); }
  ~ScopeGuard() { b_.PopScope(); }
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;

 private:
  GraphBuilder& b_;
};

}  // namespace memest

#endif  // MEMEST_ENGINE_IR_GRAPH_H_
