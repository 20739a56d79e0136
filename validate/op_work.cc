#include "validate/op_work.h"

#include <algorithm>
#include <map>

#include "engine/ir/shape.h"

namespace memest::validate {
namespace {

bool Kernelable(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16;
}

class Planner {
 public:
  Planner(const Graph& g, int i, bool backward, const ResolvedOperands& r)
      : g_(g), op_(g.ops[i]), backward_(backward), r_(r) {}

  OpWork Plan() {
    if (!backward_ && Views()) return out_;  // views and aliases write nothing
    const std::string& k = op_.kind;
    if (k == "linear" || k == "addmm" || k == "matmul" || k == "bmm") {
      Matmul();
    } else if (k == "einsum") {
      Einsum();
    } else if (k == "conv1d" || k == "conv2d") {
      Conv();
    } else if (backward_) {
      GenericBackward();
    } else if (k == "softmax" || k == "log_softmax") {
      RowOp(WorkKind::kSoftmax, Numel(In(0).shape) / std::max<int64_t>(1, LastExtent()));
    } else if (k == "layer_norm" || k == "rms_norm") {
      const int64_t cols = op_.inputs.size() > 1 ? Numel(In(1).shape) : LastExtent();
      RowOp(WorkKind::kLayerNorm, Numel(In(0).shape) / std::max<int64_t>(1, cols));
    } else if (k == "scaled_dot_product_attention") {
      MemoryOnly("scaled_dot_product_attention: its kernels are not replayed");
    } else if (IsReduction()) {
      Reduce();
    } else {
      Elementwise(0, {0, 1, 2});
    }
    return out_;
  }

 private:
  const Tensor& In(int k) const { return g_.tensors[op_.inputs[k]]; }
  const Tensor& Out(int k) const { return g_.tensors[op_.outputs[k]]; }
  int64_t LastExtent() const {
    const Shape& s = In(0).shape;
    return s.empty() ? 1 : s.back();
  }

  // Forward of an op whose outputs all share a storage with an input: a view (reshape,
  // transpose, slice, ...) or an in-place op (add_, which does write).
  bool Views() const {
    if (op_.kind.back() == '_') return false;
    for (size_t o = 0; o < r_.outputs.size(); ++o) {
      bool shared = false;
      for (const BufferView& in : r_.inputs) shared |= in.ptr != 0 && in.ptr == r_.outputs[o].ptr;
      if (!shared && r_.outputs[o].ptr != 0) return false;
    }
    return true;
  }

  bool IsReduction() const {
    const std::string& k = op_.kind;
    const bool reducing = k == "sum" || k == "mean" || k == "cross_entropy" || k == "nll_loss" ||
                          k == "mse_loss";
    return reducing && Numel(Out(0).shape) > 0 && Numel(Out(0).shape) < Numel(In(0).shape);
  }

  void MemoryOnly(std::string why) {
    out_.work.clear();
    if (out_.reason.empty()) out_.reason = std::move(why);
  }

  // Adds `w` if every operand is present and large enough; otherwise the op is memory only.
  bool Add(Work w, const std::vector<BufferView>& inputs, const BufferView& output,
           const char* what) {
    if (!Kernelable(w.dtype) && w.kind != WorkKind::kElementwise) {
      MemoryOnly(std::string(what) + ": " + std::string(DTypeName(w.dtype)) + " is not replayed");
      return false;
    }
    for (const BufferView& b : inputs) w.inputs.push_back(b.ptr);
    w.output = output.ptr;
    const WorkBytes need = BytesNeeded(w);
    if (output.ptr == 0 || output.bytes < need.output) {
      MemoryOnly(std::string(what) + ": output not live or smaller than its shape");
      return false;
    }
    for (size_t k = 0; k < inputs.size(); ++k) {
      if (inputs[k].ptr == 0) {
        MemoryOnly(std::string(what) + ": operand " + std::to_string(k) + " is not live here");
        return false;
      }
      if (inputs[k].bytes < need.inputs[k]) {
        MemoryOnly(std::string(what) + ": operand " + std::to_string(k) +
                   " is broadcast (smaller than the shape needs)");
        return false;
      }
    }
    out_.work.push_back(std::move(w));
    return true;
  }

  Work Gemm(int64_t batch, int64_t m, int64_t n, int64_t k, DType dtype) const {
    Work w;
    w.kind = WorkKind::kGemm;
    w.dtype = dtype;
    w.gemm = {batch, m, n, k};
    return w;
  }

  // C[batch, m, n] = A[batch, m, k] @ B[batch, k, n] for the forward; backward runs
  // dA = dC @ B^T and dB = A^T @ dC (the same GEMM shapes, permuted).
  void GemmOp(int a, int b, int64_t batch, int64_t m, int64_t n, int64_t k) {
    const DType dt = Out(0).dtype;
    if (!backward_) {
      Add(Gemm(batch, m, n, k, dt), {r_.inputs[a], r_.inputs[b]}, r_.outputs[0], op_.kind.c_str());
      return;
    }
    if (Grad(a).ptr != 0 && Grad(a).ptr != r_.output_grad.ptr) {
      Add(Gemm(batch, m, k, n, dt), {r_.output_grad, r_.inputs[b]}, Grad(a), op_.kind.c_str());
    }
    if (Grad(b).ptr != 0 && Grad(b).ptr != r_.output_grad.ptr) {
      Add(Gemm(batch, k, n, m, dt), {r_.inputs[a], r_.output_grad}, Grad(b), op_.kind.c_str());
    }
    // addmm's and linear's bias gradient: a reduction of dC over its rows.
    for (size_t j = 0; j < op_.inputs.size(); ++j) {
      if (static_cast<int>(j) == a || static_cast<int>(j) == b) continue;
      if (Grad(j).ptr == 0 || Grad(j).ptr == r_.output_grad.ptr) continue;
      Work w;
      w.kind = WorkKind::kReduce;
      w.dtype = In(j).dtype;
      w.rows = Numel(In(j).shape);
      w.cols = batch * m * n / std::max<int64_t>(1, w.rows);
      Add(w, {r_.output_grad}, Grad(j), "bias gradient");
    }
  }

  const BufferView& Grad(size_t k) const {
    static const BufferView none;
    return k < r_.input_grads.size() ? r_.input_grads[k] : none;
  }

  void Matmul() {
    const std::string& kd = op_.kind;
    int a = 0, b = 1;
    if (kd == "addmm") a = 1, b = 2;
    const Shape& sa = In(a).shape;
    const Shape& sb = In(b).shape;
    const Shape& so = Out(0).shape;
    if (kd == "linear") {  // x[..., k] @ w[n, k]^T
      const int64_t k = sa.back(), n = sb[0];
      GemmOp(a, b, 1, Numel(sa) / std::max<int64_t>(1, k), n, k);
      return;
    }
    if (sa.size() < 2 || sb.size() < 2) {
      const int64_t k = sa.back();
      GemmOp(a, b, 1, sa.size() < 2 ? 1 : Numel(sa) / k, sb.size() < 2 ? 1 : sb.back(), k);
      return;
    }
    const int64_t m = sa[sa.size() - 2], k = sa.back(), n = sb.back();
    GemmOp(a, b, Numel(so) / std::max<int64_t>(1, m * n), m, n, k);
  }

  // Two-operand contractions "bik,bkj->bij": indices in both inputs and the output are batch,
  // in one input and the output are rows or columns, in both inputs only are contracted.
  void Einsum() {
    std::string eq;
    if (auto s = StringAttr(op_.attrs, "equation", "", "einsum"); s.ok()) eq = *s;
    const size_t arrow = eq.find("->");
    const size_t comma = eq.find(',');
    if (op_.inputs.size() != 2 || arrow == std::string::npos || comma == std::string::npos ||
        eq.find('.') != std::string::npos) {
      backward_ ? GenericBackward() : Elementwise(0, {});
      return;
    }
    const std::string ia = eq.substr(0, comma), ib = eq.substr(comma + 1, arrow - comma - 1);
    const std::string io = eq.substr(arrow + 2);
    std::map<char, int64_t> size;
    for (size_t j = 0; j < ia.size() && j < In(0).shape.size(); ++j) size[ia[j]] = In(0).shape[j];
    for (size_t j = 0; j < ib.size() && j < In(1).shape.size(); ++j) size[ib[j]] = In(1).shape[j];
    int64_t batch = 1, m = 1, n = 1, k = 1;
    for (auto [c, extent] : size) {
      const bool in_a = ia.find(c) != std::string::npos, in_b = ib.find(c) != std::string::npos;
      const bool in_o = io.find(c) != std::string::npos;
      if (in_a && in_b && in_o) batch *= extent;
      else if (in_a && in_b) k *= extent;
      else if (in_a && in_o) m *= extent;
      else if (in_b && in_o) n *= extent;
      else {  // summed out of one operand alone: not a GEMM
        backward_ ? GenericBackward() : Elementwise(0, {});
        return;
      }
    }
    GemmOp(0, 1, batch, m, n, k);
  }

  void Conv() {
    const bool one_d = op_.kind == "conv1d";
    const Shape& x = In(0).shape;
    const Shape& wt = In(1).shape;
    auto spatial = [&](const char* name, int64_t fallback) {
      std::vector<int64_t> v = {fallback};
      if (auto s = IntsAttr(op_.attrs, name, {fallback}, "conv"); s.ok() && !s->empty()) v = *s;
      if (v.size() == 1) v.push_back(v[0]);
      return v;
    };
    const auto stride = spatial("stride", 1), pad = spatial("padding", 0);
    const auto dil = spatial("dilation", 1);
    ConvShape c;
    c.n = x[0];
    c.c = x[1];
    c.h = one_d ? 1 : x[2];
    c.w = x.back();
    c.k = wt[0];
    c.r = one_d ? 1 : wt[2];
    c.s = wt.back();
    c.stride_h = one_d ? 1 : stride[0];
    c.stride_w = one_d ? stride[0] : stride[1];
    c.pad_h = one_d ? 0 : pad[0];
    c.pad_w = one_d ? pad[0] : pad[1];
    c.dilation_h = one_d ? 1 : dil[0];
    c.dilation_w = one_d ? dil[0] : dil[1];
    if (auto g = IntAttr(op_.attrs, "groups", 1, "conv"); g.ok()) c.groups = *g;
    Work w;
    w.dtype = Out(0).dtype;
    w.conv = c;
    if (!backward_) {
      w.kind = WorkKind::kConvForward;
      Add(w, {r_.inputs[0], r_.inputs[1]}, r_.outputs[0], op_.kind.c_str());
      return;
    }
    if (Grad(0).ptr != 0) {
      w.kind = WorkKind::kConvBackwardData;
      Add(w, {r_.output_grad, r_.inputs[1]}, Grad(0), op_.kind.c_str());
    }
    if (Grad(1).ptr != 0) {
      w.kind = WorkKind::kConvBackwardFilter;
      Add(w, {r_.inputs[0], r_.output_grad}, Grad(1), op_.kind.c_str());
    }
    if (op_.inputs.size() > 2 && Grad(2).ptr != 0) {  // bias: dy summed over all but channels
      Work b;
      b.kind = WorkKind::kReduce;
      b.dtype = In(2).dtype;
      b.rows = c.k;
      b.cols = Numel(Out(0).shape) / std::max<int64_t>(1, c.k);
      Add(b, {r_.output_grad}, Grad(2), "conv bias gradient");
    }
  }

  void RowOp(WorkKind kind, int64_t rows) {
    Work w;
    w.kind = kind;
    w.dtype = Out(0).dtype;
    w.rows = rows;
    w.cols = Numel(In(0).shape) / std::max<int64_t>(1, rows);
    Add(w, {r_.inputs[0]}, r_.outputs[0], op_.kind.c_str());
  }

  void Reduce() {
    Work w;
    w.kind = WorkKind::kReduce;
    w.dtype = Out(0).dtype;
    w.rows = Numel(Out(0).shape);
    w.cols = Numel(In(0).shape) / w.rows;
    if (!Kernelable(w.dtype)) w.dtype = In(0).dtype;
    Add(w, {r_.inputs[0]}, r_.outputs[0], op_.kind.c_str());
  }

  // An elementwise kernel writing `out` (`elements` of `dtype`), reading up to three of
  // `candidates` that are live and as large as it; with none it reads its own output (a
  // gather, a fill).
  bool ElementwiseInto(const BufferView& out, DType dtype, int64_t elements,
                       const std::vector<BufferView>& candidates) {
    Work w;
    w.kind = WorkKind::kElementwise;
    w.dtype = dtype;
    w.elements = elements;
    const int64_t need = elements * DTypeSize(dtype);
    std::vector<BufferView> ins;
    for (const BufferView& b : candidates) {
      if (b.ptr != 0 && b.bytes >= need && ins.size() < 3) ins.push_back(b);
    }
    if (ins.empty()) ins.push_back(out);
    return Add(w, ins, out, op_.kind.c_str());
  }

  // Output `o` of the forward, from the inputs `candidates` names.
  void Elementwise(int o, const std::vector<int>& candidates) {
    if (static_cast<size_t>(o) >= r_.outputs.size() || r_.outputs[o].ptr == 0) return;
    std::vector<BufferView> ins;
    for (int k : candidates) {
      if (static_cast<size_t>(k) < r_.inputs.size()) ins.push_back(r_.inputs[k]);
    }
    ElementwiseInto(r_.outputs[o], Out(o).dtype, Numel(Out(o).shape), ins);
  }

  // Each new input gradient, from the incoming gradient and the saved input.
  void GenericBackward() {
    for (size_t k = 0; k < op_.inputs.size(); ++k) {
      const BufferView& g = Grad(k);
      if (g.ptr == 0 || g.ptr == r_.output_grad.ptr) continue;
      if (!ElementwiseInto(g, In(k).dtype, Numel(In(k).shape), {r_.output_grad, r_.inputs[k]})) {
        return;
      }
    }
  }

  const Graph& g_;
  const Op& op_;
  bool backward_;
  const ResolvedOperands& r_;
  OpWork out_;
};

}  // namespace

OpWork WorkOfResolved(const Graph& graph, int op, bool backward, const ResolvedOperands& r) {
  return Planner(graph, op, backward, r).Plan();
}

}  // namespace memest::validate
