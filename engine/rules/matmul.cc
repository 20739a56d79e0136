// Rules for linear algebra: linear, addmm, matmul, bmm, einsum.
//
// derivatives.yaml: mm/addmm/bmm save mat1 when mat2 needs grad and mat2 when mat1 needs grad;
// the output is never saved. torch.matmul on batched operands expands them to a common batch
// shape and reshapes each to 3-D: when that reshape cannot be a view (a permuted or broadcast
// operand), aten copies the operand, and bmm saves the copy rather than the original. einsum
// (sumproduct_pair) permutes each operand to [batch, free, contracted] and reshapes it to 3-D
// for bmm, with the same copy-when-not-viewable behaviour.
#include <algorithm>
#include <map>
#include <set>

#include "engine/ir/text.h"
#include "engine/rules/internal.h"

namespace memest {
namespace rules {
namespace {

// ---- linear(x, weight, bias?) and addmm(bias, a, b) ----

StatusOr<std::vector<OutputSpec>> InferLinear(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 1, 8));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 1, 2, 2));
  const Shape& x = c.in(0).shape;
  const Shape& w = c.in(1).shape;
  if (x.back() != w[1]) {
    return InvalidArgument(InputField(c, 1) + ": linear weight " + ShapeToString(w) +
                           " expects in_features " + std::to_string(w[1]) +
                           ", but the input " + ShapeToString(x) + " has " +
                           std::to_string(x.back()));
  }
  if (c.inputs.size() == 3 && c.in(2).shape != Shape{w[0]}) {
    return InvalidArgument(InputField(c, 2) + ": linear bias must have shape [" +
                           std::to_string(w[0]) + "], got " + ShapeToString(c.in(2).shape));
  }
  Shape out = x;
  out.back() = w[0];
  return std::vector<OutputSpec>{{out, PromoteTypes(c.in(0).dtype, c.in(1).dtype)}};
}

void LinearMemory(const OpCall& c, OpMemory* m);  // below, with the folding helpers

StatusOr<std::vector<OutputSpec>> InferAddmm(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 1, 2, 2));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 2, 2, 2));
  const Shape& a = c.in(1).shape;
  const Shape& b = c.in(2).shape;
  if (a[1] != b[0]) {
    return InvalidArgument(InputField(c, 2) + ": addmm shapes " + ShapeToString(a) + " and " +
                           ShapeToString(b) + " cannot be multiplied");
  }
  Shape out{a[0], b[1]};
  StatusOr<Shape> bc = BroadcastShapes(c.in(0).shape, out);
  if (!bc.ok() || *bc != out) {
    return InvalidArgument(InputField(c, 0) + ": addmm bias " + ShapeToString(c.in(0).shape) +
                           " does not broadcast to " + ShapeToString(out));
  }
  return std::vector<OutputSpec>{{out, PromoteTypes(c.in(1).dtype, c.in(2).dtype)}};
}

// The gradient of a bias [C] added to every row of [N, C] is the sum of the rows (sum_to_size),
// over the output's gradient, in the output's dtype.
void BiasGradScratch(const OpCall& c, int64_t rows, const Tensor& bias, OpMemory* m) {
  if (bias.shape.size() != 1) return;
  RowSumScratchTemps(c, rows, bias.shape[0], c.outputs.empty() ? bias.dtype : c.out(0).dtype, m);
}

void AddmmMemory(const OpCall& c, OpMemory* m) {
  m->backward_needs_dense_grad = true;
  SaveInputIf(m, c.needs_grad(2), 1);
  SaveInputIf(m, c.needs_grad(1), 2);
  if (c.needs_grad(0)) BiasGradScratch(c, c.in(1).shape[0], c.in(0), m);
}

// ---- matmul / bmm ----

// How one operand reaches bmm/mm: as a view of the input, or as a contiguous copy.
struct Operand3d {
  bool copied = false;
  int64_t bytes = 0;  // bytes of the (possibly copied) operand
};

Operand3d FoldOperand(const Tensor& t, const Shape& expanded, const Shape& folded) {
  // Strides of the expanded tensor: broadcast dims get stride 0.
  Strides s(expanded.size(), 0);
  const size_t off = expanded.size() - t.shape.size();
  for (size_t i = 0; i < t.shape.size(); ++i) {
    s[off + i] = (t.shape[i] == 1 && expanded[off + i] != 1) ? 0 : t.strides[i];
  }
  Strides unused;
  Operand3d r;
  r.copied = !ComputeViewStrides(expanded, s, folded, &unused);
  r.bytes = r.copied ? Bytes(folded, t.dtype) : 0;
  return r;
}

struct MatmulPlan {
  Shape out;
  Operand3d a, b;
};

StatusOr<MatmulPlan> PlanMatmul(const OpCall& c) {
  const Shape& a = c.in(0).shape;
  const Shape& b = c.in(1).shape;
  if (a.empty() || b.empty()) {
    return InvalidArgument(c.field + ".inputs: matmul needs tensors of rank >= 1, got " +
                           ShapeToString(a) + " and " + ShapeToString(b));
  }
  const int64_t k_a = a.back();
  const int64_t k_b = b.size() == 1 ? b[0] : b[b.size() - 2];
  if (k_a != k_b) {
    return InvalidArgument(c.field + ".inputs: matmul shapes " + ShapeToString(a) + " and " +
                           ShapeToString(b) + " cannot be multiplied (" +
                           std::to_string(k_a) + " vs " + std::to_string(k_b) + ")");
  }
  MatmulPlan p;
  if (a.size() <= 2 && b.size() <= 2) {  // mm / mv / dot: no folding
    if (a.size() == 2) p.out.push_back(a[0]);
    if (b.size() == 2) p.out.push_back(b[1]);
    return p;
  }
  if (b.size() <= 2) {  // fold a's leading dims into rows: a.reshape(-1, k)
    Shape folded{Numel(a) / std::max<int64_t>(k_a, 1), k_a};
    p.a = FoldOperand(c.in(0), a, folded);
    p.out = Shape(a.begin(), a.end() - 1);
    if (b.size() == 2) p.out.push_back(b[1]);
    return p;
  }
  // Batched: broadcast the batch dims, then fold each operand to 3-D.
  Shape a_mat = a.size() == 1 ? Shape{1, a[0]} : Shape(a.end() - 2, a.end());
  Shape b_mat(b.end() - 2, b.end());
  Shape a_batch = a.size() <= 2 ? Shape{} : Shape(a.begin(), a.end() - 2);
  Shape b_batch(b.begin(), b.end() - 2);
  StatusOr<Shape> batch = BroadcastShapes(a_batch, b_batch);
  if (!batch.ok()) return batch.status().Prefixed(c.field + ".inputs: matmul batch dims: ");
  const int64_t nb = Numel(*batch);
  Shape a_exp = *batch, b_exp = *batch;
  a_exp.insert(a_exp.end(), a_mat.begin(), a_mat.end());
  b_exp.insert(b_exp.end(), b_mat.begin(), b_mat.end());
  if (a.size() >= 2) p.a = FoldOperand(c.in(0), a_exp, {nb, a_mat[0], a_mat[1]});
  p.b = FoldOperand(c.in(1), b_exp, {nb, b_mat[0], b_mat[1]});
  p.out = *batch;
  if (a.size() >= 2) p.out.push_back(a_mat[0]);
  p.out.push_back(b_mat[1]);
  return p;
}

StatusOr<std::vector<OutputSpec>> InferMatmul(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(MatmulPlan p, PlanMatmul(c));
  return std::vector<OutputSpec>{{p.out, PromoteTypes(c.in(0).dtype, c.in(1).dtype)}};
}

// Saves each operand (or its folded copy) when the other one needs grad; a copy that is not
// saved is scratch that dies with the op.
void SaveOperands(const OpCall& c, const Operand3d& a, const Operand3d& b, OpMemory* m) {
  const Operand3d* ops[2] = {&a, &b};
  for (int i = 0; i < 2; ++i) {
    const bool saved = c.needs_grad(1 - i);
    if (ops[i]->copied) {
      (saved ? m->saved_extras : m->forward_temps)
          .push_back(Alloc{ops[i]->bytes, "contiguous copy of a matmul operand"});
    } else if (saved) {
      m->saved_inputs.push_back(i);
    }
  }
}

// linear folds an N-D input to [N, in] for addmm: a view when the strides allow it, else aten
// copies it (and the copy is what is kept for the weight's gradient).
void LinearMemory(const OpCall& c, OpMemory* m) {
  m->backward_needs_dense_grad = true;  // mm cannot read an expanded (stride 0) gradient
  // addmm's (or add's, then mm's) edges: bias, x, then the weight through t()'s backward.
  m->grad_order = c.inputs.size() == 3 ? std::vector<int>{2, 0, 1} : std::vector<int>{0, 1};
  const Tensor& x = c.in(0);
  if (c.inputs.size() == 3 && c.needs_grad(2)) {
    BiasGradScratch(c, Numel(x.shape) / std::max<int64_t>(x.shape.back(), 1), c.in(2), m);
  }
  if (x.shape.size() >= 3) {
    const Operand3d folded =
        FoldOperand(x, x.shape, {Numel(x.shape) / std::max<int64_t>(x.shape.back(), 1), x.shape.back()});
    if (folded.copied) {
      (c.needs_grad(1) ? m->saved_extras : m->forward_temps)
          .push_back(Alloc{folded.bytes, "contiguous copy of the linear input"});
      SaveInputIf(m, c.needs_grad(0), 1);
      return;
    }
  }
  SaveInputIf(m, c.needs_grad(1), 0);  // x, for grad_weight
  SaveInputIf(m, c.needs_grad(0), 1);  // weight, for grad_input
}

// PyTorch 2.x (should_fold): an N-D `a` times a matrix `b` is folded into one mm only when that
// needs no copy of `a`, or when `b` needs grad (bmm's backward would otherwise make a
// batch-sized gradient for `b`). Else `b` is expanded over the batch (a view) and `a` reshaped
// to 3-D, a view when its batch dims merge. 1.13 always folds.
void MatmulMemory(const OpCall& c, OpMemory* m) {
  m->backward_needs_dense_grad = true;
  StatusOr<MatmulPlan> p = PlanMatmul(c);
  if (!p.ok()) return;
  const Tensor& a = c.in(0);
  const bool folded = a.shape.size() >= 3 && c.in(1).shape.size() <= 2;
  if (folded && p->a.copied && !c.needs_grad(1) && c.runtime == Runtime::kCuda) {
    const int64_t n = a.shape[a.shape.size() - 2], k = a.shape.back();
    const int64_t batch = Numel(a.shape) / std::max<int64_t>(n * k, 1);
    p->a = FoldOperand(a, a.shape, {batch, n, k});
  }
  SaveOperands(c, p->a, p->b, m);
}

StatusOr<std::vector<OutputSpec>> InferBmm(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(Shape out, BmmProduct(c, 0, 1));
  return std::vector<OutputSpec>{{out, PromoteTypes(c.in(0).dtype, c.in(1).dtype)}};
}

void BmmMemory(const OpCall& c, OpMemory* m) {
  m->backward_needs_dense_grad = true;
  SaveInputIf(m, c.needs_grad(1), 0);
  SaveInputIf(m, c.needs_grad(0), 1);
}

// baddbmm(self, batch1, batch2; beta=1, alpha=1) = beta * self + alpha * batch1 @ batch2, self
// broadcast to [B, n, p] (nn.MultiheadAttention's attn_mask in 1.13). Saves like bmm. Backward
// (derivatives.yaml, maybe_multiply): self gets the incoming gradient itself when beta is 1 and
// self has the output's shape, else grad * beta, reduced to self's shape; each batch gradient is
// a bmm, then multiplied by alpha when alpha is not 1 (the bmm result is scratch while the
// product is made).
StatusOr<std::vector<OutputSpec>> InferBaddbmm(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 1, 3, 3));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 2, 3, 3));
  MEMEST_RETURN_IF_ERROR(FloatAttr(c.op.attrs, "beta", 1.0, c.field).status());
  MEMEST_RETURN_IF_ERROR(FloatAttr(c.op.attrs, "alpha", 1.0, c.field).status());
  const Shape& a = c.in(1).shape;
  const Shape& b = c.in(2).shape;
  if (a[0] != b[0] || a[2] != b[1]) {
    return InvalidArgument(c.field + ".inputs: baddbmm shapes " + ShapeToString(a) + " and " +
                           ShapeToString(b) + " cannot be multiplied");
  }
  const Shape out{a[0], a[1], b[2]};
  StatusOr<Shape> bc = BroadcastShapes(c.in(0).shape, out);
  if (!bc.ok() || *bc != out) {
    return InvalidArgument(InputField(c, 0) + ": baddbmm self " + ShapeToString(c.in(0).shape) +
                           " does not broadcast to " + ShapeToString(out));
  }
  return std::vector<OutputSpec>{{out, PromoteTypes(c.in(1).dtype, c.in(2).dtype)}};
}

void BaddbmmMemory(const OpCall& c, OpMemory* m) {
  m->backward_needs_dense_grad = true;
  SaveInputIf(m, c.needs_grad(2), 1);
  SaveInputIf(m, c.needs_grad(1), 2);
  const StatusOr<double> beta = FloatAttr(c.op.attrs, "beta", 1.0, c.field);
  const StatusOr<double> alpha = FloatAttr(c.op.attrs, "alpha", 1.0, c.field);
  const bool unit_beta = !beta.ok() || *beta == 1.0;
  const bool same = c.in(0).shape == c.out(0).shape && c.in(0).dtype == c.out(0).dtype;
  m->grad_flow = {same && unit_beta ? GradFlow::kPassThrough : GradFlow::kFresh,
                  GradFlow::kFresh, GradFlow::kFresh};
  // The gradients are made one after the other (batch1, batch2, self), each one's scratch freed
  // before the next: the largest counts.
  int64_t scratch = 0;
  if (alpha.ok() && *alpha != 1.0) {
    for (int i : {1, 2}) {
      if (c.needs_grad(i)) scratch = std::max(scratch, BytesOf(c.in(i)));
    }
  }
  if (c.needs_grad(0) && !unit_beta && !same) scratch = std::max(scratch, BytesOf(c.out(0)));
  if (scratch > 0) m->backward_temps.push_back(Alloc{scratch, "baddbmm backward: before * alpha / beta"});
}

// ---- einsum(a, b; equation) ----

struct EinsumPlan {
  Shape out;
  Operand3d a, b;
  int64_t reduce_bytes = 0;  // sums over letters that appear in one operand only
};

StatusOr<EinsumPlan> PlanEinsum(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(std::string eq, StringAttr(c.op.attrs, "equation", "", c.field));
  const std::string field = AttrField(c, "equation");
  const size_t arrow = eq.find("->");
  if (eq.empty() || arrow == std::string::npos) {
    return InvalidArgument(field + ": expected an explicit equation like 'ijk,ljk->lij', got " +
                           Quote(eq));
  }
  std::vector<std::string> terms;
  std::string lhs = eq.substr(0, arrow), rhs = eq.substr(arrow + 2), cur;
  for (char ch : lhs) {
    if (ch == ',') { terms.push_back(cur); cur.clear(); }
    else if (ch != ' ') cur += ch;
  }
  terms.push_back(cur);
  if (terms.size() != c.inputs.size()) {
    return InvalidArgument(field + ": names " + std::to_string(terms.size()) +
                           " operands but the op has " + std::to_string(c.inputs.size()));
  }
  std::map<char, int64_t> size;
  for (size_t t = 0; t < terms.size(); ++t) {
    const Shape& s = c.in(t).shape;
    if (terms[t].size() != s.size()) {
      return InvalidArgument(field + ": operand " + std::to_string(t) + " " + Quote(terms[t]) +
                             " has " + std::to_string(terms[t].size()) + " letters but shape " +
                             ShapeToString(s));
    }
    for (size_t i = 0; i < s.size(); ++i) {
      const char l = terms[t][i];
      if (!std::isalpha(static_cast<unsigned char>(l))) {
        return InvalidArgument(field + ": " + Quote(std::string(1, l)) + " is not a letter");
      }
      auto [it, fresh] = size.emplace(l, s[i]);
      if (!fresh && it->second != s[i] && it->second != 1 && s[i] != 1) {
        return InvalidArgument(field + ": letter " + Quote(std::string(1, l)) + " has sizes " +
                               std::to_string(it->second) + " and " + std::to_string(s[i]));
      }
      it->second = std::max(it->second, s[i]);
    }
  }
  EinsumPlan p;
  for (char l : rhs) {
    if (size.count(l) == 0) {
      return InvalidArgument(field + ": output letter " + Quote(std::string(1, l)) +
                             " appears in no operand");
    }
    p.out.push_back(size[l]);
  }
  if (c.inputs.size() == 1) {
    return p;  // a permutation and/or sum of one operand
  }
  // Two operands: letters summed away inside one operand first, then bmm over
  // [batch, free_a, contracted] x [batch, contracted, free_b].
  const std::string& ta = terms[0];
  const std::string& tb = terms[1];
  auto in = [](const std::string& s, char l) { return s.find(l) != std::string::npos; };
  std::string order_a, order_b, batch, contracted, free_a, free_b;
  for (char l : ta) {
    if (in(tb, l) && in(rhs, l)) batch += l;
    else if (in(tb, l)) contracted += l;
    else if (in(rhs, l)) free_a += l;
  }
  for (char l : tb) {
    if (!in(ta, l) && in(rhs, l)) free_b += l;
  }
  auto prod = [&](const std::string& ls) {
    int64_t n = 1;
    for (char l : ls) n *= size[l];
    return n;
  };
  auto plan_operand = [&](size_t idx, const std::string& term, const std::string& want,
                          const Shape& folded) {
    const Tensor& t = c.in(idx);
    // Drop letters summed away (a reduction makes a fresh contiguous tensor).
    bool reduced = false;
    for (char l : term) reduced |= !in(want, l);
    Operand3d r;
    if (reduced) {
      Shape kept;
      for (char l : want) kept.push_back(size[l]);
      p.reduce_bytes += Bytes(kept, t.dtype);
      return r;  // the reduced tensor is contiguous in `want` order only by luck: treat as view
    }
    Shape perm_shape;
    Strides perm_strides;
    for (char l : want) {
      const size_t pos = term.find(l);
      perm_shape.push_back(t.shape[pos]);
      perm_strides.push_back(t.strides[pos]);
    }
    Strides unused;
    r.copied = !ComputeViewStrides(perm_shape, perm_strides, folded, &unused);
    r.bytes = r.copied ? Bytes(folded, t.dtype) : 0;
    return r;
  };
  const int64_t nb = prod(batch), nk = prod(contracted);
  p.a = plan_operand(0, ta, batch + free_a + contracted, {nb, prod(free_a), nk});
  p.b = plan_operand(1, tb, batch + contracted + free_b, {nb, nk, prod(free_b)});
  return p;
}

StatusOr<std::vector<OutputSpec>> InferEinsum(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(EinsumPlan p, PlanEinsum(c));
  DType d = c.in(0).dtype;
  for (size_t i = 1; i < c.inputs.size(); ++i) d = PromoteTypes(d, c.in(i).dtype);
  return std::vector<OutputSpec>{{p.out, d}};
}

void EinsumMemory(const OpCall& c, OpMemory* m) {
  StatusOr<EinsumPlan> p = PlanEinsum(c);
  if (!p.ok() || c.inputs.size() != 2) return;
  if (p->reduce_bytes > 0) m->forward_temps.push_back(Alloc{p->reduce_bytes, "einsum partial sum"});
  SaveOperands(c, p->a, p->b, m);
}

}  // namespace

StatusOr<Shape> BmmProduct(const OpCall& c, size_t a_index, size_t b_index) {
  MEMEST_RETURN_IF_ERROR(RequireRank(c, a_index, 3, 3));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, b_index, 3, 3));
  const Shape& a = c.in(a_index).shape;
  const Shape& b = c.in(b_index).shape;
  if (a[0] != b[0] || a[2] != b[1]) {
    return InvalidArgument(c.field + ".inputs: bmm shapes " + ShapeToString(a) + " and " +
                           ShapeToString(b) + " cannot be multiplied");
  }
  return Shape{a[0], a[1], b[2]};
}

void RowSumScratchTemps(const OpCall& c, int64_t rows, int64_t cols, DType dtype, OpMemory* m) {
  if (c.runtime != Runtime::kCuda) return;
  const ReduceScratch s =
      RowSumScratch(rows, cols, DTypeSize(dtype), dtype == DType::kFloat64 ? 8 : 4, c.gpu);
  if (s.staging == 0) return;
  m->backward_temps.push_back(Alloc{s.staging, "row-sum staging (Reduce.cuh)"});
  m->backward_temps.push_back(Alloc{s.semaphores, "its semaphores"});
  if (s.accumulator > 0) {
    m->backward_temps.push_back(Alloc{s.accumulator, "float accumulator of a sum in pieces"});
  }
}

void RegisterMatmulRules(std::vector<OpRule>* r) {
  r->push_back({"linear", 2, 3, InferLinear, LinearMemory});
  r->push_back({"addmm", 3, 3, InferAddmm, AddmmMemory});
  r->push_back({"matmul", 2, 2, InferMatmul, MatmulMemory});
  r->push_back({"bmm", 2, 2, InferBmm, BmmMemory});
  r->push_back({"baddbmm", 3, 3, InferBaddbmm, BaddbmmMemory});
  r->push_back({"einsum", 1, 2, InferEinsum, EinsumMemory});
}

}  // namespace rules
}  // namespace memest
