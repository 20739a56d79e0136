#include "engine/passes/deepspeed_zero3.h"

#include <algorithm>
#include <string>
#include <unordered_map>

#include "engine/ir/shape.h"
#include "engine/step/optimizers.h"

namespace memest {
namespace {

// zero_optimization.sub_group_size's default (config.py; the engine passes it to the stage-3
// optimizer, whose own default is 1e12).
constexpr int64_t kSubGroupElements = 1'000'000'000;

// Where offload puts the rank's buffers (deepspeed_zero3.h says what DeepSpeed does).
Status PlanOffload(const Graph& g, const ParallelismConfig& p, DeepSpeedZero3& z) {
  z.offload_optimizer = p.offload_optimizer;
  z.offload_param = p.offload_param;
  z.on_host.assign(g.tensors.size(), 0);
  if (z.offload_param) {
    for (size_t t = 0; t < g.tensors.size(); ++t) {
      const Tensor& ten = g.tensors[t];
      if (ten.role != TensorRole::kParameter || (!ten.requires_grad && z.persistent[t])) continue;
      z.on_host[t] = 1;
      if (ten.requires_grad) continue;  // in the trainable flat buffer below
      MEMEST_ASSIGN_OR_RETURN(const int64_t b, CheckedMul(z.partition[t], z.bytes[t]));
      MEMEST_ASSIGN_OR_RETURN(z.host_param_bytes, CheckedAdd(z.host_param_bytes, b));
    }
    // The trainable partitions: one pinned buffer of the model's dtype (one parameter group).
    MEMEST_ASSIGN_OR_RETURN(const int64_t flat, PinnedHostBytes(z.grad_partition_bytes));
    MEMEST_ASSIGN_OR_RETURN(z.host_param_bytes, CheckedAdd(z.host_param_bytes, flat));
  }
  if (!z.offload_optimizer) return Status::Ok();
  z.host_master_bytes = z.master_bytes;
  z.host_grad_bytes = z.master_bytes;
  z.host_state_bytes = z.state_bytes;
  z.host_grad_partition_bytes = z.grad_partition_bytes;
  MEMEST_ASSIGN_OR_RETURN(const int64_t largest, CheckedMul(z.largest_partition, 4));
  MEMEST_ASSIGN_OR_RETURN(z.host_pinned_bytes, PinnedHostBytes(largest));
  z.master_bytes = z.state_bytes = z.grad_partition_bytes = 0;  // none on the GPU
  return Status::Ok();
}

// The module path a parameter's name gives ("h.0.attn.weight" -> "h.0.attn"); a bare name (a
// model file's "wte") stands for a module of its own.
std::string OwnerOf(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

// Every module the forward runs, as the coordinator's trace sees them: the root (the model,
// before its first op and after the last op of the forward), the modules that own parameters
// and the containers above them (a block: its hooks gather nothing but prefetch), in the order
// their forward starts, parents before children. A parameter belongs to the module its name
// says when the reading op's scope holds that module (a graph whose scopes stop at the
// blocks), else to the op's scope (a tied weight read by another module). A module's forward
// spans the ops within its scope, and at least its parameters' reads.
std::vector<Zero3Module> ModulesOf(const Graph& g) {
  const int forward_end =
      (g.loss_begin >= 0 ? g.loss_begin : static_cast<int>(g.ops.size())) - 1;
  if (forward_end < 0) return {};  // no forward op: nothing is gathered
  std::vector<Zero3Module> modules = {{"", 0, forward_end, {}, {}}};
  std::unordered_map<std::string, int> index = {{"", 0}};
  std::unordered_map<int64_t, int> slot;  // (module, parameter) -> its index in params
  auto touch = [&](const std::string& scope, int i) -> Zero3Module& {
    auto [at, added] = index.try_emplace(scope, static_cast<int>(modules.size()));
    if (added) modules.push_back({scope, i, i, {}, {}});
    Zero3Module& m = modules[at->second];
    m.first_op = std::min(m.first_op, i);
    m.last_op = std::max(m.last_op, i);
    return m;
  };
  // The scope and every scope above it (not the root).
  auto prefixes = [](std::string scope) {
    std::vector<std::string> out;
    while (!scope.empty()) {
      out.push_back(scope);
      const size_t dot = scope.rfind('.');
      scope = dot == std::string::npos ? "" : scope.substr(0, dot);
    }
    return out;
  };
  // Per tensor: the parameter it is a view of (t, transpose, view... of one), or -1.
  std::vector<int> view_of(g.tensors.size(), -1);
  for (int t = 0; t < static_cast<int>(g.tensors.size()); ++t) {
    if (g.tensors[t].role == TensorRole::kParameter) view_of[t] = t;
  }
  static const char* const kViews[] = {"transpose", "permute", "view", "reshape", "expand",
                                       "slice"};
  static const char* const kMatmuls[] = {"linear", "matmul", "bmm", "addmm", "baddbmm"};
  auto is = [](const std::string& kind, const auto& kinds) {
    return std::find(std::begin(kinds), std::end(kinds), kind) != std::end(kinds);
  };
  for (int i = 0; i <= forward_end; ++i) {
    const Op& op = g.ops[i];
    const std::vector<std::string> scopes = prefixes(op.scope);
    for (auto it = scopes.rbegin(); it != scopes.rend(); ++it) touch(*it, i);
    if (is(op.kind, kViews) && !op.inputs.empty() && view_of[op.inputs[0]] >= 0) {
      for (int out : op.outputs) view_of[out] = view_of[op.inputs[0]];
    }
    for (size_t k = 0; k < op.inputs.size(); ++k) {
      const int in = op.inputs[k];
      const int t = view_of[in];
      if (t < 0 || (in == t && g.tensors[t].role != TensorRole::kParameter)) continue;
      if (in != t && is(op.kind, kViews)) continue;  // a view of a view: its reader decides
      const std::string owner = OwnerOf(g.tensors[t].name);
      const std::string key = ScopeWithin(owner, op.scope) ? owner : op.scope;
      const std::vector<std::string> above = prefixes(key);
      for (auto it = above.rbegin(); it != above.rend(); ++it) touch(*it, i);
      const int mi = key.empty() ? 0 : index.at(key);
      Zero3Module& own = modules[mi];
      auto [at, added] =
          slot.try_emplace((int64_t{mi} << 32) | t, static_cast<int>(own.params.size()));
      if (added) {
        own.params.push_back(t);
        own.saver.push_back(-1);
      }
      // Autograd saves what a matmul reads for the other operand's gradient. A parameter
      // itself is saved as the leaf, whose data DeepSpeed swaps for an empty tensor; a view
      // of it (F.linear's weight.t(), a model's W.t()) keeps the gathered storage.
      bool other_needs_grad = false;
      for (size_t j = 0; j < op.inputs.size(); ++j) {
        if (j != k && view_of[op.inputs[j]] < 0 && g.tensors[op.inputs[j]].requires_grad) {
          other_needs_grad = true;
        }
      }
      const bool as_view = op.kind == "linear" ? k == 1 : in != t;
      if (is(op.kind, kMatmuls) && as_view && other_needs_grad) {
        int& saver = own.saver[at->second];
        saver = saver < 0 ? i : std::min(saver, i);  // freed by the earliest one's backward
      }
    }
  }
  std::stable_sort(modules.begin(), modules.end(), [](const Zero3Module& a, const Zero3Module& b) {
    return a.first_op < b.first_op;
  });
  return modules;
}

}  // namespace

StatusOr<DeepSpeedZero3> PlanDeepSpeedZero3(const Graph& g, const RunConfig& c) {
  const ParallelismConfig& p = c.parallelism;
  DeepSpeedZero3 z;
  z.world = p.data;
  z.element_bytes = DTypeSize(ParameterDType(c.precision));
  z.prefetch_elements = p.stage3_prefetch_bucket_size;
  z.max_live_elements = p.stage3_max_live_parameters;
  z.max_reuse_elements = p.stage3_max_reuse_distance;
  z.ipg_elements = p.reduce_bucket_elements > 0 ? p.reduce_bucket_elements
                                                : kDeepSpeedReduceBucketElements;
  z.modules = ModulesOf(g);
  z.numel.assign(g.tensors.size(), 0);
  z.partition.assign(g.tensors.size(), 0);
  z.persistent.assign(g.tensors.size(), 0);
  z.bytes.assign(g.tensors.size(), 0);
  int64_t sub_group = 0;
  bool first_trainable = true;
  for (size_t t = 0; t < g.tensors.size(); ++t) {
    const Tensor& ten = g.tensors[t];
    if (ten.role != TensorRole::kParameter) continue;
    const int64_t n = Numel(ten.shape);  // below 2^62 in all: the builder checked the bytes
    z.numel[t] = n;
    z.bytes[t] = DTypeSize(ten.dtype);
    z.partition[t] = (n + z.world - 1) / z.world;
    // mark_persistent_parameters: ds_numel (the whole parameter) at most the threshold.
    z.persistent[t] = n <= p.stage3_param_persistence_threshold;
    if (z.persistent[t]) {
      MEMEST_ASSIGN_OR_RETURN(const int64_t padded, CheckedMul(z.partition[t], z.world));
      MEMEST_ASSIGN_OR_RETURN(const int64_t whole, CheckedMul(padded, z.bytes[t]));
      MEMEST_ASSIGN_OR_RETURN(z.persistent_bytes, CheckedAdd(z.persistent_bytes, whole));
    }
    if (!ten.requires_grad) continue;
    if (first_trainable) z.element_bytes = z.bytes[t];  // the model's dtype
    first_trainable = false;
    z.trainable_partition_elements += z.partition[t];
    z.largest_partition = std::max(z.largest_partition, z.partition[t]);
    // _create_fp16_sub_groups: a sub-group closes once it reaches sub_group_size.
    sub_group += z.partition[t];
    z.largest_sub_group = std::max(z.largest_sub_group, sub_group);
    if (sub_group >= kSubGroupElements) sub_group = 0;
  }
  const int64_t s = z.trainable_partition_elements;
  MEMEST_ASSIGN_OR_RETURN(z.master_bytes, CheckedMul(s, 4));
  const OptimizerCosts oc = CostsOf(c.optimizer, c.runtime);
  MEMEST_ASSIGN_OR_RETURN(z.state_bytes, CheckedMul(z.master_bytes, oc.state));
  MEMEST_ASSIGN_OR_RETURN(z.grad_partition_bytes, CheckedMul(s, z.element_bytes));
  MEMEST_ASSIGN_OR_RETURN(z.ipg_bytes, CheckedMul(z.ipg_elements, z.element_bytes));
  MEMEST_RETURN_IF_ERROR(PlanOffload(g, p, z));
  return z;
}

int64_t DeepSpeedZero3::HostBytes() const {
  int64_t sum = 0;
  for (int64_t b : {host_param_bytes, host_master_bytes, host_grad_bytes, host_state_bytes,
                    host_grad_partition_bytes, host_pinned_bytes}) {
    if (!AddBytes(&sum, b)) return kMaxBytes;
  }
  return sum;
}

void AddDeepSpeedZero3Notes(const RunConfig& c, const DeepSpeedZero3& z, Report* r) {
  int64_t persistent = 0, owners = 0;
  for (char k : z.persistent) persistent += k;
  for (const Zero3Module& m : z.modules) owners += m.params.empty() ? 0 : 1;
  const std::string kept =
      z.offload_optimizer
          ? "offload_optimizer cpu: the fp32 master, its fp32 gradient, the optimizer state "
            "and the gradient partitions are host memory, stepped by the CPU (each reduced "
            "partition comes back to the GPU to be normed and cast on its way to the host)"
          : "fp32 master " + FormatBytes(z.master_bytes) + ", optimizer state " +
                FormatBytes(z.state_bytes) + ", gradient partitions " +
                FormatBytes(z.grad_partition_bytes);
  r->notes.push_back(
      "DeepSpeed ZeRO-3 over " + std::to_string(z.world) + " ranks, rank 0 estimated: each "
      "parameter a 1/" + std::to_string(z.world) + " partition" +
      (z.offload_param ? " in host memory (offload_param cpu), copied to the GPU to be"
                       : ",") +
      " gathered by " + std::to_string(owners) + " modules around their forward and backward; " +
      kept + "; an ipg bucket of " + std::to_string(z.ipg_elements) + " elements (" +
      FormatBytes(z.ipg_bytes) + ") made at initialisation whatever the model's size; " +
      std::to_string(persistent) + " persistent parameters (at most " +
      std::to_string(c.parallelism.stage3_param_persistence_threshold) + " elements) kept "
      "gathered between steps (" + FormatBytes(z.persistent_bytes) + ")");
  if (z.offload_optimizer || z.offload_param) {
    r->notes.push_back(
        "host memory " + FormatBytes(z.HostBytes()) + " per rank (data_parallel.host_bytes): " +
        (z.offload_param ? "parameter partitions " + FormatBytes(z.host_param_bytes) +
                               " (the trainable ones one pinned buffer, rounded up to a power "
                               "of two by PyTorch's pinned allocator); "
                         : std::string()) +
        (z.offload_optimizer
             ? "fp32 master " + FormatBytes(z.host_master_bytes) + ", its gradient " +
                   FormatBytes(z.host_grad_bytes) + ", optimizer state " +
                   FormatBytes(z.host_state_bytes) + ", gradient partitions " +
                   FormatBytes(z.host_grad_partition_bytes) + ", pinned staging " +
                   FormatBytes(z.host_pinned_bytes) + "; "
             : std::string()) +
        "pin_memory false (DeepSpeed's default); not counted: the host copies that copy_ "
        "makes to convert dtypes, DeepSpeedCPUAdam's own buffers");
  }
  r->notes.push_back(
      std::string(c.step == StepKind::kFirstStep
                      ? "first step: the coordinator records the module trace, so nothing is "
                        "prefetched and every module's parameters are released after use"
                      : "steady step: after each module the coordinator prefetches up to " +
                            std::to_string(z.prefetch_elements) +
                            " elements along the trace (while fewer than " +
                            std::to_string(z.max_live_elements) +
                            " are gathered) and keeps a parameter gathered when its next use "
                            "is within " + std::to_string(z.max_reuse_elements) +
                            " elements of the trace: a model below about half that stays "
                            "gathered whole from forward into backward") +
      "; its FusedAdam has no per-parameter scratch (config.optimizer.impl does not apply); "
      "not counted: the CUDA streams the gathers and reductions run on (overlap_comm), whose "
      "cached blocks the compute stream does not reuse");
}

}  // namespace memest
