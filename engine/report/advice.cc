#include "engine/report/advice.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>

#include "engine/estimator.h"
#include "engine/passes/passes.h"
#include "engine/step/python_refs.h"

namespace memest {

namespace {

// Consumers of each tensor's storage-independent value (op indices that read it).
std::vector<std::vector<int>> Consumers(const Graph& g) {
  std::vector<std::vector<int>> c(g.tensors.size());
  for (size_t i = 0; i < g.ops.size(); ++i) {
    for (int t : g.ops[i].inputs) c[t].push_back(static_cast<int>(i));
  }
  return c;
}

bool IsScalarOp(const Op& op) { return op.inputs.size() == 1 && HasAttr(op.attrs, "scalar"); }

// mul(a, b) broadcasting to a larger tensor, reduced by sum(dim) right after: the product is
// materialised in full. einsum contracts without it.
std::optional<std::pair<int, int>> FindBroadcastReduce(const Graph& g,
                                                       const std::vector<std::vector<int>>& use) {
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& m = g.ops[i];
    if (m.kind != "mul" || m.inputs.size() != 2) continue;
    const int out = m.outputs[0];
    const int64_t n = Numel(g.tensors[out].shape);
    if (n <= Numel(g.tensors[m.inputs[0]].shape) || n <= Numel(g.tensors[m.inputs[1]].shape)) continue;
    if (use[out].size() != 1) continue;
    const Op& r = g.ops[use[out][0]];
    if (r.kind != "sum" || !HasAttr(r.attrs, "dim") ||
        IntAttr(r.attrs, "keepdim", 0, "").value() != 0) {
      continue;
    }
    return std::make_pair(static_cast<int>(i), use[out][0]);
  }
  return std::nullopt;
}

StatusOr<Graph> RewriteAsEinsum(const Graph& g, int mul, int sum) {
  const Op& m = g.ops[mul];
  const Shape& out = g.tensors[m.outputs[0]].shape;
  const int R = static_cast<int>(out.size());
  std::vector<bool> reduced(R, false);
  for (int64_t d : IntsAttr(g.ops[sum].attrs, "dim", {}, "").value()) reduced[(d % R + R) % R] = true;
  auto emit = [&](int i, GraphBuilder& b, std::vector<int>& map) {
    if (i == sum) return true;  // produced by the einsum below
    if (i != mul) return false;
    std::string eq;
    std::vector<int> operands;
    for (int k = 0; k < 2; ++k) {
      int t = map[m.inputs[k]];
      const Shape shape = b.shape(t);
      const int off = R - static_cast<int>(shape.size());
      std::string term;
      for (int j = static_cast<int>(shape.size()) - 1; j >= 0; --j) {
        if (shape[j] == out[off + j]) {
          term.insert(term.begin(), static_cast<char>('a' + off + j));
        } else {
          t = b.Add1("squeeze", {t}, {{"dim", int64_t{j}}});
        }
      }
      operands.push_back(t);
      eq += (k ? "," : "") + term;
    }
    eq += "->";
    for (int d = 0; d < R; ++d) {
      if (!reduced[d]) eq += static_cast<char>('a' + d);
    }
    map[g.ops[sum].outputs[0]] = b.Add1("einsum", operands, {{"equation", eq}});
    return true;
  };
  return ReplayGraph(g, emit);
}

// x * sigmoid(x): autograd keeps x and sigmoid(x); silu keeps x only.
std::optional<std::pair<int, int>> FindManualSwish(const Graph& g,
                                                   const std::vector<std::vector<int>>& use) {
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& s = g.ops[i];
    if (s.kind != "sigmoid" || use[s.outputs[0]].size() != 1) continue;
    const Op& m = g.ops[use[s.outputs[0]][0]];
    if (m.kind != "mul" || m.inputs.size() != 2) continue;
    const int x = s.inputs[0];
    if ((m.inputs[0] == x && m.inputs[1] == s.outputs[0]) ||
        (m.inputs[1] == x && m.inputs[0] == s.outputs[0])) {
      return std::make_pair(static_cast<int>(i), use[s.outputs[0]][0]);
    }
  }
  return std::nullopt;
}

StatusOr<Graph> RewriteAsSilu(const Graph& g, int sigmoid, int mul) {
  return ReplayGraph(g, [&](int i, GraphBuilder& b, std::vector<int>& map) {
    if (i == sigmoid) return true;
    if (i != mul) return false;
    map[g.ops[mul].outputs[0]] = b.Add1("silu", {map[g.ops[sigmoid].inputs[0]]});
    return true;
  });
}

// scores = q @ k^T, then scores * c or scores / c: a second score-sized tensor. Scaling q and k
// by sqrt(c) each (c^(1/4) of the head dim) avoids it.
std::optional<std::pair<int, int>> FindScoreScaling(const Graph& g,
                                                    const std::vector<std::vector<int>>& use) {
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& mm = g.ops[i];
    if ((mm.kind != "matmul" && mm.kind != "bmm") || use[mm.outputs[0]].size() != 1) continue;
    const Op& sc = g.ops[use[mm.outputs[0]][0]];
    if ((sc.kind != "div" && sc.kind != "mul") || !IsScalarOp(sc)) continue;
    const Shape& s = g.tensors[mm.outputs[0]].shape;
    const Shape& q = g.tensors[mm.inputs[0]].shape;
    if (s.size() < 2 || s.back() < q.back()) continue;  // only when scores outgrow q and k
    return std::make_pair(static_cast<int>(i), use[mm.outputs[0]][0]);
  }
  return std::nullopt;
}

StatusOr<Graph> RewriteScaleQk(const Graph& g, int matmul, int scale) {
  const Op& sc = g.ops[scale];
  const double c = FloatAttr(sc.attrs, "scalar", 1, "").value();
  const double each = sc.kind == "div" ? 1 / std::sqrt(c) : std::sqrt(c);
  return ReplayGraph(g, [&](int i, GraphBuilder& b, std::vector<int>& map) {
    if (i == scale) return true;
    if (i != matmul) return false;
    const Op& mm = g.ops[matmul];
    const int q = b.Add1("mul", {map[mm.inputs[0]]}, {{"scalar", each}});
    const int k = b.Add1("mul", {map[mm.inputs[1]]}, {{"scalar", each}});
    map[sc.outputs[0]] = b.Add1(mm.kind, {q, k});
    return true;
  });
}

// Closes the bracket lo < hi of a search for the largest micro-batch that fits (fits(lo) or lo
// is 0, !fits(hi)), `need` holding the required bytes of the micro-batches tried (-1: refused).
// What a step needs grows almost linearly with its micro-batch: the line through the bracket's
// ends meets `capacity` next to the answer, so one probe there and one beside it usually close
// the bracket; if they do not, bisection closes what is left (at most two probes more than
// bisection alone). Where fits() is monotone on the bracket, as the step's memory is in the
// micro-batch, both find its one boundary: the same answer.
template <typename Fits>
int64_t CloseBracket(int64_t lo, int64_t hi, const std::map<int64_t, int64_t>& need,
                     int64_t capacity, Fits& fits) {
  const auto lo_need = need.find(lo), hi_need = need.find(hi);
  if (hi - lo > 1 && lo_need != need.end() && hi_need != need.end() && lo_need->second >= 0 &&
      hi_need->second > lo_need->second) {
    const double x = static_cast<double>(lo) + static_cast<double>(capacity - lo_need->second) *
                                                   static_cast<double>(hi - lo) /
                                                   static_cast<double>(hi_need->second -
                                                                       lo_need->second);
    const int64_t m = static_cast<int64_t>(std::floor(
        std::clamp(x, static_cast<double>(lo + 1), static_cast<double>(hi - 1))));
    if (fits(m)) {
      lo = m;
      if (hi - lo > 1) (fits(m + 1) ? lo : hi) = m + 1;
    } else {
      hi = m;
      if (hi - lo > 1) (fits(m - 1) ? lo : hi) = m - 1;
    }
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

// The largest micro-batch (grad_accum_steps 1) whose step fits the device, by re-estimating:
// from the configured micro-batch, doubling or halving until the answer changes, then closing
// the bracket. 0 when even one sample does not fit; -1 when the model's memory does not grow
// with the batch (an op graph with no batch dims) or the search passes 2^20. `report` is
// `config`'s own estimate, which is the configured micro-batch's when it has one micro-batch.
int64_t LargestFittingMicroBatch(const ModelSpec& model, const RunConfig& config,
                                 const Report& report, Budget* budget) {
  constexpr int64_t kCap = int64_t{1} << 20;
  const EstimateOptions quiet{std::numeric_limits<int64_t>::max(), false, budget};
  std::map<int64_t, int64_t> peaks;  // micro-batch -> peak reserved (-1: error)
  std::map<int64_t, int64_t> need;   // micro-batch -> the fit's required bytes (-1: error)
  std::map<int64_t, bool> fit;
  const int64_t capacity = report.fit->capacity_bytes;
  auto record = [&](int64_t m, const StatusOr<Report>& r) {
    peaks[m] = r.ok() ? r->peak_reserved_bytes : -1;
    need[m] = r.ok() && r->fit ? r->fit->required_bytes : -1;
    return fit[m] = r.ok() && r->fit && r->fit->fits;
  };
  const int64_t m0 = std::max<int64_t>(1, config.micro_batch());
  if (config.grad_accum_steps == 1 && config.batch_size == m0) record(m0, report);
  auto fits = [&](int64_t m) {
    auto it = fit.find(m);
    if (it != fit.end()) return it->second;
    RunConfig alt = config;
    alt.batch_size = m;
    alt.grad_accum_steps = 1;
    if (!budget->status().ok()) return false;  // stopped: the caller looks at the budget
    return record(m, Estimate(model, alt, quiet));
  };
  int64_t lo, hi;  // fits(lo) (or lo == 0), !fits(hi)
  if (fits(m0)) {
    if (m0 >= kCap) return -1;  // past the search's cap already (and 2 * m0 must not wrap)
    lo = m0;
    hi = 2 * m0;
    while (fits(hi)) {
      if (peaks[hi] == peaks[lo]) return -1;  // does not grow with the batch
      if (hi >= kCap) return -1;
      lo = hi;
      hi *= 2;
    }
  } else {
    hi = m0;
    lo = m0 / 2;
    while (lo >= 1 && !fits(lo)) {
      if (peaks[lo] == peaks[hi]) return -1;
      hi = lo;
      lo /= 2;
    }
    if (lo == 0 && peaks[1] < 0) return -1;
  }
  return CloseBracket(lo, hi, need, capacity, fits);
}

std::string Where(const Graph& g, int op) {
  const std::string& scope = g.ops[op].scope;
  return scope.empty() ? "at the model's top level" : "in " + scope;
}

}  // namespace

StatusOr<std::vector<Advice>> MakeAdvice(const ModelSpec& model, const Graph& graph,
                                         const RunConfig& config, const Report& report,
                                         Budget* budget) {
  std::vector<Advice> fixes;
  const int64_t base = report.peak.allocated_bytes;
  const EstimateOptions quiet{std::numeric_limits<int64_t>::max(), false, budget};
  // Each alternative is measured only while the budget lasts; measure() drops an alternative
  // whose re-estimate failed, the budget's refusal included.
  auto measure = [&](const StatusOr<Report>& alt, Advice a) {
    if (!alt.ok() || alt->peak.allocated_bytes >= base) return;
    a.saving_bytes = base - alt->peak.allocated_bytes;
    a.message += " (peak " + FormatBytes(base) + " -> " + FormatBytes(alt->peak.allocated_bytes) + ")";
    fixes.push_back(std::move(a));
  };
  auto regraph = [&](const StatusOr<Graph>& g) -> StatusOr<Report> {
    if (!g.ok()) return g.status();
    return EstimateGraph(*g, config, quiet);
  };
  const auto use = Consumers(graph);

  if (auto br = FindBroadcastReduce(graph, use)) {
    const Tensor& prod = graph.tensors[graph.ops[br->first].outputs[0]];
    measure(regraph(RewriteAsEinsum(graph, br->first, br->second)),
            {"broadcast_reduce",
             "the broadcast multiply " + Where(graph, br->first) + " materialises a " +
                 ShapeToString(prod.shape) + " product (" + FormatBytes(Bytes(prod.shape, prod.dtype)) +
                 ") only to sum it; write it as one torch.einsum contraction, which never builds it",
             0, graph.ops[br->first].scope});
  }
  if (config.mode == Mode::kTraining) {
    if (auto sw = FindManualSwish(graph, use)) {
      measure(regraph(RewriteAsSilu(graph, sw->first, sw->second)),
              {"fused_activation",
               "x * sigmoid(x) " + Where(graph, sw->second) +
                   " keeps both x and sigmoid(x) for backward; F.silu(x) keeps only x",
               0, graph.ops[sw->second].scope});
    }
    if (auto qk = FindScoreScaling(graph, use)) {
      measure(regraph(RewriteScaleQk(graph, qk->first, qk->second)),
              {"attention_scaling",
               "the attention scores " + Where(graph, qk->second) +
                   " are scaled after q @ k^T, which makes a second score-sized tensor; scale q "
                   "and k by d^-1/4 each before the product instead",
               0, graph.ops[qk->second].scope});
    }
    if (config.hold_outputs && config.parallelism.pipeline == 1 && OutputsHoldCache(config) &&
        !graph.cache.empty()) {
      Graph without = graph;
      without.cache.clear();
      measure(EstimateGraph(without, config, quiet),
              {"use_cache",
               "the forward returns every layer's keys and values (past_key_values: use_cache is "
               "true in the model's config) and the loop's outputs hold them through backward "
               "and the optimizer step; call the model with use_cache=False in training (or set "
               "model.config.use_cache = False)",
               0, ""});
    }
    // bitsandbytes' 8-bit layers keep their inputs as attributes of their autograd nodes, which
    // live as long as the graph (OpMemory::saved_until_graph_freed): what frees the graph sooner.
    bool int8 = false;
    for (const Op& op : graph.ops) int8 = int8 || op.kind == "linear_8bit";
    if (int8 && config.checkpoint.non_reentrant &&
        config.checkpoint.policy != CheckpointPolicy::kNone) {
      RunConfig alt = config;
      alt.checkpoint.non_reentrant = false;
      measure(EstimateGraph(graph, alt, quiet),
              {"reentrant_checkpoint",
               "bitsandbytes' 8-bit layers keep their inputs as attributes of their autograd "
               "nodes, which non-reentrant checkpointing's hooks never free; checkpoint with "
               "use_reentrant=True (gradient_checkpointing_kwargs={\"use_reentrant\": True}): "
               "the recomputed region's nodes go with its backward",
               0, ""});
    }
    if (int8 && config.hold_outputs && config.parallelism.pipeline == 1) {
      RunConfig alt = config;
      alt.hold_outputs = false;
      measure(EstimateGraph(graph, alt, quiet),
              {"free_graph",
               "the loop keeps the outputs and the loss, and with them the graph, whose 8-bit "
               "layers' nodes keep their inputs into the next step's forward; drop them once "
               "loss.backward() has run (del outputs, loss; or loss = loss.item())",
               0, ""});
    }
    // (A model that checkpoints in its own code gets no checkpoint policy advice.)
    const bool blocks = graph.blocks.size() >= 2 && graph.checkpoints.empty();
    if (blocks && config.checkpoint.policy == CheckpointPolicy::kNone) {
      for (CheckpointPolicy p : {CheckpointPolicy::kEveryBlock, CheckpointPolicy::kSqrtBlocks}) {
        RunConfig alt = config;
        alt.checkpoint.policy = p;
        const int64_t L = static_cast<int64_t>(graph.blocks.size());
        const int64_t k = p == CheckpointPolicy::kEveryBlock
                              ? 1 : std::max<int64_t>(1, std::llround(std::sqrt(double(L))));
        if (p == CheckpointPolicy::kSqrtBlocks && k == 1) continue;  // every block: said above
        measure(EstimateGraph(graph, alt, quiet),
                {"checkpoint",
                 "checkpoint every " + (k == 1 ? std::string("block") : std::to_string(k) + " blocks") +
                     " (torch.utils.checkpoint; " + std::to_string((L + k - 1) / k) +
                     " segments of " + std::to_string(L) + " blocks): costs one extra forward pass",
                 0, ""});
      }
    }
    if (config.micro_batch() >= 2 && config.batch_size % (config.grad_accum_steps * 2) == 0) {
      RunConfig alt = config;
      alt.grad_accum_steps *= 2;
      measure(Estimate(model, alt, quiet),
              {"micro_batch",
               "use micro-batches of " + std::to_string(alt.micro_batch()) + " with " +
                   std::to_string(alt.grad_accum_steps) +
                   " accumulation steps: the same batch of " + std::to_string(config.batch_size) +
                   " per step, half the activations",
               0, ""});
    }
    if (config.optimizer.impl == OptimizerImpl::kForeach) {
      RunConfig alt = config;
      // PyTorch 1.13 has no fused optimizer for CPU tensors.
      const bool fused_ok = config.runtime == Runtime::kCuda &&
                            (config.optimizer.kind == OptimizerKind::kAdam ||
                             config.optimizer.kind == OptimizerKind::kAdamW ||
                             config.optimizer.kind == OptimizerKind::kSgd ||
                             config.optimizer.kind == OptimizerKind::kSgdMomentum ||
                             config.optimizer.kind == OptimizerKind::kAdagrad);
      alt.optimizer.impl = fused_ok ? OptimizerImpl::kFused : OptimizerImpl::kForLoop;
      measure(EstimateGraph(graph, alt, quiet),
              {"optimizer",
               std::string("the foreach optimizer step allocates scratch for every parameter at "
                           "once; pass ") + (fused_ok ? "fused=True" : "foreach=False") + " to " +
                   OptimizerKindName(config.optimizer.kind),
               0, ""});
    }
    if (config.parallelism.sharding != DataSharding::kNone &&
        !config.parallelism.gradient_as_bucket_view) {
      RunConfig alt = config;
      alt.parallelism.gradient_as_bucket_view = true;
      measure(EstimateGraph(graph, alt, quiet),
              {"ddp_buckets",
               "DistributedDataParallel keeps a copy of every gradient in its buckets; pass "
               "gradient_as_bucket_view=True and .grad becomes the bucket's view",
               0, ""});
    }
    if (config.precision == Precision::kFp32) {
      RunConfig alt = config;
      alt.precision = Precision::kBf16Amp;
      measure(EstimateGraph(graph, alt, quiet),
              {"precision",
               "train under torch.autocast(\"cuda\", dtype=torch.bfloat16): activations of "
               "matmuls and convolutions are kept in bfloat16",
               0, ""});
    }
  }
  std::sort(fixes.begin(), fixes.end(),
            [](const Advice& a, const Advice& b) { return a.saving_bytes > b.saving_bytes; });

  // What fits: the largest micro-batch for this device.
  if (report.fit && budget->status().ok()) {
    const int64_t m = LargestFittingMicroBatch(model, config, report, budget);
    const std::string device = report.fit->device;
    if (m == 0 && budget->status().ok()) {
      fixes.push_back({"max_batch", "even a micro-batch of 1 does not fit " + device, 0, ""});
    } else if (m > 0 && budget->status().ok()) {
      std::string msg = "the largest micro-batch that fits " + device + " is " + std::to_string(m);
      if (config.mode == Mode::kTraining && m < config.batch_size) {
        const int64_t steps = (config.batch_size + m - 1) / m;
        msg += "; for a batch of " + std::to_string(config.batch_size) + ", accumulate over " +
               std::to_string(steps) + " micro-batches of at most " + std::to_string(m);
      }
      fixes.push_back({"max_batch", msg, 0, ""});
    }
  }

  // First: what dominates the peak, and where.
  int top = 0;
  for (int c = 0; c < kNumCategories; ++c) {
    if (c == static_cast<int>(Category::kCudaContext) || c == static_cast<int>(Category::kNccl)) {
      continue;
    }
    if (report.breakdown[c] > report.breakdown[top]) top = c;
  }
  int64_t total = 0;
  for (int64_t b : report.breakdown) total += b;
  std::string msg = "the peak (" + FormatBytes(report.peak.allocated_bytes) + " allocated) is in " +
                    PhaseName(report.peak.phase) +
                    (report.peak.op.empty() ? std::string() : " at " + report.peak.op) +
                    (report.peak.scope.empty() ? std::string() : " (" + report.peak.scope + ")") +
                    "; the biggest part is " + CategoryName(static_cast<Category>(top)) + ": " +
                    FormatBytes(report.breakdown[top]) + " of " + FormatBytes(total);
  const LayerRow* big = nullptr;
  for (const LayerRow& row : report.layers) {
    if (!big || row.saved_bytes > big->saved_bytes) big = &row;
  }
  if (big && big->saved_bytes > 0 && top == static_cast<int>(Category::kActivations)) {
    msg += "; the layer that keeps the most for backward is " +
           (big->scope.empty() ? std::string("the top level (the loss)") : big->scope) + " (" +
           FormatBytes(big->saved_bytes) + ")";
  }
  if (!budget->status().ok() && !budget->spent_out()) return budget->status();
  std::vector<Advice> out{{"peak", msg, 0, report.peak.scope}};
  out.insert(out.end(), fixes.begin(), fixes.end());
  return out;
}

}  // namespace memest
