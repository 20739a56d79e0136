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

// The modules that own parameters: an op's scope is its module; a module's forward ends with
// the last op within its scope (its children's included). The root's parameters (scope "")
// are gathered before the first op and released after the last op of the forward.
std::vector<Zero3Module> ModulesOf(const Graph& g) {
  std::vector<Zero3Module> modules;
  std::unordered_map<std::string, int> index;
  const int forward_end =
      (g.loss_begin > 0 ? g.loss_begin : static_cast<int>(g.ops.size())) - 1;
  for (int i = 0; i < static_cast<int>(g.ops.size()); ++i) {
    const Op& op = g.ops[i];
    for (int t : op.inputs) {
      if (g.tensors[t].role != TensorRole::kParameter) continue;
      auto [it, added] = index.try_emplace(op.scope, static_cast<int>(modules.size()));
      if (added) modules.push_back({op.scope, op.scope.empty() ? 0 : i, i, {}});
      std::vector<int>& params = modules[it->second].params;
      if (std::find(params.begin(), params.end(), t) == params.end()) params.push_back(t);
    }
    // This op ends every module whose scope holds it (walk up the scope's prefixes).
    std::string scope = op.scope;
    while (!scope.empty()) {
      auto it = index.find(scope);
      if (it != index.end()) modules[it->second].last_op = i;
      const size_t dot = scope.rfind('.');
      scope = dot == std::string::npos ? "" : scope.substr(0, dot);
    }
  }
  for (Zero3Module& m : modules) {
    if (m.scope.empty()) m.last_op = std::max(forward_end, m.first_op);
  }
  std::stable_sort(modules.begin(), modules.end(),
                   [](const Zero3Module& a, const Zero3Module& b) { return a.first_op < b.first_op; });
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
  int64_t sub_group = 0;
  const std::string field = "model: a ZeRO-3 partition";
  for (size_t t = 0; t < g.tensors.size(); ++t) {
    const Tensor& ten = g.tensors[t];
    if (ten.role != TensorRole::kParameter) continue;
    z.element_bytes = DTypeSize(ten.dtype);  // the model's own dtype
    const int64_t n = Numel(ten.shape);      // below 2^62: the builder checked its bytes
    z.numel[t] = n;
    z.partition[t] = (n + z.world - 1) / z.world;
    // mark_persistent_parameters: ds_numel (the whole parameter) at most the threshold.
    z.persistent[t] = n <= p.stage3_param_persistence_threshold;
    if (z.persistent[t]) {
      MEMEST_ASSIGN_OR_RETURN(const int64_t whole,
                              CheckedMul(z.partition[t] * z.world, z.element_bytes));
      MEMEST_ASSIGN_OR_RETURN(z.persistent_bytes, CheckedAdd(z.persistent_bytes, whole));
    }
    if (!ten.requires_grad) continue;
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
  return z;
}

void AddDeepSpeedZero3Notes(const RunConfig& c, const DeepSpeedZero3& z, Report* r) {
  int64_t persistent = 0;
  for (char k : z.persistent) persistent += k;
  r->notes.push_back(
      "DeepSpeed ZeRO-3 over " + std::to_string(z.world) + " ranks, rank 0 estimated: each "
      "parameter a 1/" + std::to_string(z.world) + " partition, gathered by " +
      std::to_string(z.modules.size()) + " modules around their forward and backward; fp32 "
      "master " + FormatBytes(z.master_bytes) + ", optimizer state " + FormatBytes(z.state_bytes) +
      ", gradient partitions " + FormatBytes(z.grad_partition_bytes) + ", and an ipg bucket of " +
      std::to_string(z.ipg_elements) + " elements (" + FormatBytes(z.ipg_bytes) +
      ") made at initialisation whatever the model's size; " + std::to_string(persistent) +
      " persistent parameters (at most " +
      std::to_string(c.parallelism.stage3_param_persistence_threshold) + " elements) kept "
      "gathered between steps (" + FormatBytes(z.persistent_bytes) + ")");
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
