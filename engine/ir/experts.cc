#include "engine/ir/experts.h"

#include "engine/ir/shape.h"

namespace memest {

std::vector<int64_t> ExpertTokens(int64_t tokens, int64_t experts, int64_t top_k,
                                  ExpertLoad load) {
  if (experts <= 0) return {};
  std::vector<int64_t> n(static_cast<size_t>(experts), 0);
  if (top_k <= 0 || top_k > experts) return n;
  if (load == ExpertLoad::kBalanced) {
    // tokens * top_k choices (SparseMoe's one_hot of [tokens, top_k, experts] int64 already
    // counts in bytes; checked all the same).
    StatusOr<int64_t> product = CheckedMul(tokens, top_k);
    if (!product.ok()) return n;
    const int64_t choices = *product;
    for (int64_t e = 0; e < experts; ++e) n[e] = choices / experts + (e < choices % experts);
  } else {
    for (int64_t e = experts - top_k; e < experts; ++e) n[e] = tokens;
  }
  return n;
}

}  // namespace memest
