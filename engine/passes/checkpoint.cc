// The checkpoint pass: a checkpoint policy turned into op ranges (engine/passes/checkpoint.h).
#include "engine/passes/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/ir/text.h"
#include "engine/passes/checkpoint_rules.h"

namespace memest {
namespace {

// Scopes by name, each with the indices it has in its list.
using ScopeIndex = std::unordered_map<std::string_view, std::vector<int64_t>>;

ScopeIndex IndexScopes(const std::vector<std::string>& scopes) {
  ScopeIndex index;
  for (size_t j = 0; j < scopes.size(); ++j) index[scopes[j]].push_back(static_cast<int64_t>(j));
  return index;
}

// Calls fn(j) for every indexed scope j that `scope` lies within (ScopeWithin): the scope itself
// and each of its prefixes at a '.' boundary, "" included; linear in the scope's length.
template <typename Fn>
void ForEachEnclosing(const ScopeIndex& index, std::string_view scope, Fn fn) {
  for (size_t cut = 0; cut <= scope.size(); ++cut) {
    if (cut > 0 && cut < scope.size() && scope[cut] != '.') continue;
    const auto it = index.find(scope.substr(0, cut));
    if (it == index.end()) continue;
    for (int64_t j : it->second) fn(j);
  }
}

}  // namespace

StatusOr<CheckpointRegions> PlanCheckpoints(const Graph& g, const CheckpointConfig& cfg) {
  if (!g.checkpoints.empty()) {  // the model's code checkpoints (a traced torch.utils.checkpoint)
    if (cfg.policy != CheckpointPolicy::kNone) {
      return FailedPrecondition(
          "config.checkpoint.policy: the model checkpoints in its own code (" +
          std::to_string(g.checkpoints.size()) +
          " regions in model.checkpoints); a policy would checkpoint twice: leave it unset");
    }
    return CheckpointRegions(g.checkpoints.begin(), g.checkpoints.end());
  }
  MEMEST_RETURN_IF_ERROR(CheckBlockPolicy(g, cfg));
  CheckpointRegions regions;
  const int end = g.loss_begin >= 0 ? g.loss_begin : static_cast<int>(g.ops.size());
  auto add_run = [&](auto in_region) {
    int start = -1;
    for (int i = 0; i <= end; ++i) {
      const bool in = i < end && in_region(g.ops[i].scope);
      if (in && start < 0) start = i;
      if (!in && start >= 0) {
        regions.emplace_back(start, i - 1);
        start = -1;
      }
    }
  };
  switch (cfg.policy) {
    case CheckpointPolicy::kNone:
      return regions;
    case CheckpointPolicy::kEveryBlock:
    case CheckpointPolicy::kEveryKBlocks:
    case CheckpointPolicy::kSqrtBlocks: {
      const int64_t L = static_cast<int64_t>(g.blocks.size());
      int64_t k = cfg.policy == CheckpointPolicy::kEveryBlock ? 1 : cfg.every_k;
      if (cfg.policy == CheckpointPolicy::kSqrtBlocks) {
        k = std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(L))));
      }
      // Each group of k consecutive blocks is one region, from the first to the last op that
      // runs inside any of its blocks. An op is inside the blocks its scope or one of its
      // prefixes names (ScopeWithin), found by looking each prefix up: linear in the ops.
      const ScopeIndex blocks_of = IndexScopes(g.blocks);
      const int64_t groups = (L - 1) / k + 1;
      std::vector<std::pair<int, int>> span(groups, {-1, -1});
      for (int i = 0; i < end; ++i) {
        ForEachEnclosing(blocks_of, g.ops[i].scope, [&](int64_t j) {
          auto& [first, last] = span[j / k];
          if (first < 0) first = i;
          last = i;
        });
      }
      for (const auto& [first, last] : span) {
        if (first >= 0) regions.emplace_back(first, last);
      }
      break;
    }
    case CheckpointPolicy::kAttentionCore:
      add_run([](const std::string& scope) {
        return scope == "core" || scope.find(".core") != std::string::npos;
      });
      if (regions.empty()) {
        return FailedPrecondition("config.checkpoint.policy: the model has no attention core "
                                  "(scopes named '<...>.core') to checkpoint");
      }
      break;
    case CheckpointPolicy::kScopes: {
      // Each scope's runs of consecutive ops inside it, found in one pass over the ops.
      const ScopeIndex scopes_of = IndexScopes(cfg.scopes);
      const size_t n = cfg.scopes.size();
      std::vector<int> start(n, -1), last(n, -1);
      for (int i = 0; i < end; ++i) {
        ForEachEnclosing(scopes_of, g.ops[i].scope, [&](int64_t k) {
          if (last[k] == i) return;  // the same scope listed twice
          if (start[k] >= 0 && last[k] < i - 1) regions.emplace_back(start[k], last[k]);
          if (start[k] < 0 || last[k] < i - 1) start[k] = i;
          last[k] = i;
        });
      }
      for (size_t k = 0; k < n; ++k) {
        if (start[k] < 0) {
          return InvalidArgument("config.checkpoint.scopes[" + std::to_string(k) +
                                 "]: no op runs in scope " + Quote(cfg.scopes[k]));
        }
        regions.emplace_back(start[k], last[k]);
      }
      std::sort(regions.begin(), regions.end());
      break;
    }
  }
  // Merge overlapping regions (nested scopes).
  CheckpointRegions merged;
  for (const auto& r : regions) {
    if (!merged.empty() && r.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

}  // namespace memest
