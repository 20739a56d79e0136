// The rule for TransformerEngine's te.Linear under fp8_autocast (engine/passes/fp8_te.h adds it),
// read in TransformerEngine 2.20.0.dev0 (d0067d0d, 2026-08; transformer_engine/pytorch/module/
// linear.py `_Linear`, module/base.py, csrc/quantizer.cpp, tensor/float8_tensor.py).
//
//   te_linear(x, weight, bias?; activation_dtype, transposes)
//     x is quantized to fp8 in its own dtype (no cast first), the weight too (no cache: accelerate
//     passes no is_first_microbatch); the GEMM writes y [rows, out] in activation_dtype
//     (autocast's, or the parameters'), the bias fused. `transposes` (sm_89, sm_9x, sm_12x: fp8
//     GEMMs take the TN layout only): each fp8 tensor a later GEMM reads transposed is made as a
//     second copy in the same kernel. With grad, backward keeps x's fp8 data for wgrad (its
//     transpose; the rowwise copy is dropped after the GEMM) where the weight trains, and the fp8
//     weight (with its transpose where x needs a gradient). Backward: grad_output (contiguous)
//     quantized to e5m2 (with its transpose); dgrad [rows, in] and wgrad [out, in] in
//     activation_dtype, which autograd casts to x's and the weight's dtype where they differ (a new
//     tensor each); the bias's gradient comes out of the quantization kernel, [out]. TE takes rows
//     in multiples of 8 and dims in multiples of 16 (utils.py assert_dim_for_fp8_exec).
#include "engine/ir/text.h"
#include "engine/rules/internal.h"

namespace memest::rules {
namespace {

StatusOr<DType> ActivationDType(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(std::string name,
                          StringAttr(c.op.attrs, "activation_dtype", "", c.field));
  StatusOr<DType> d = ParseDType(name);
  if (!d.ok() || !IsFloating(*d) || *d == DType::kFloat64) {
    return InvalidArgument(AttrField(c, "activation_dtype") +
                           ": float32, float16 or bfloat16, got " + Quote(name));
  }
  return *d;
}

StatusOr<std::vector<OutputSpec>> InferTeLinear(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 1));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 1, 8));
  MEMEST_ASSIGN_OR_RETURN(DType act, ActivationDType(c));
  const Shape& w = c.in(1).shape;
  const int64_t in = c.in(0).shape.back();
  if (w.size() != 2 || w[1] != in) {
    return InvalidArgument(InputField(c, 1) + ": the weight of a linear of " + std::to_string(in) +
                           " inputs, [out, " + std::to_string(in) + "], got " + ShapeToString(w));
  }
  if (w[0] % 16 != 0 || in % 16 != 0) {
    return InvalidArgument(InputField(c, 1) +
                           ": fp8 GEMMs take dimensions that are multiples "
                           "of 16, got " +
                           ShapeToString(w));
  }
  const int64_t rows = in > 0 ? Numel(c.in(0).shape) / in : 0;
  if (rows % 8 != 0) {
    return InvalidArgument(InputField(c, 0) +
                           ": TransformerEngine's fp8 GEMMs take a multiple "
                           "of 8 tokens, got " +
                           std::to_string(rows) + " (batch x sequence)");
  }
  MEMEST_RETURN_IF_ERROR(IntAttr(c.op.attrs, "transposes", 1, c.field).status());
  if (c.inputs.size() == 3 && c.in(2).shape != Shape{w[0]}) {
    return InvalidArgument(InputField(c, 2) + ": bias must have shape [" + std::to_string(w[0]) +
                           "], got " + ShapeToString(c.in(2).shape));
  }
  Shape y = c.in(0).shape;
  y.back() = w[0];
  return std::vector<OutputSpec>{{y, act}};
}

// Within kMaxTensorBytes each: x's and the weight's values, one to two bytes a value.
void TeLinearMemory(const OpCall& c, OpMemory* m) {
  const Tensor& x = c.in(0);
  const Tensor& w = c.in(1);
  const DType act = c.out(0).dtype;
  const int64_t x_values = Numel(x.shape), w_values = Numel(w.shape);
  const int64_t y_values = Numel(c.out(0).shape);
  const bool x_grad = c.needs_grad(0), w_grad = c.needs_grad(1);
  StatusOr<int64_t> t = IntAttr(c.op.attrs, "transposes", 1, c.field);
  const bool transposes = !t.ok() || *t != 0;
  m->grad_flow.assign(c.inputs.size(), GradFlow::kFresh);
  if (!x_grad && !w_grad) {  // no_grad: the fp8 copies live while the GEMM runs
    m->forward_temps = {Alloc{x_values, "x in fp8"}, Alloc{w_values + 4, "the weight in fp8"}};
    return;
  }
  // x's fp8 data: with transposes the rowwise copy feeds the GEMM and the transpose is kept.
  if (transposes) m->forward_temps.push_back(Alloc{x_values, "x in fp8, rowwise"});
  if (w_grad) {
    m->saved_extras.push_back(Alloc{x_values + 4, "x in fp8 for wgrad"});
  } else if (!transposes) {
    m->forward_temps.push_back(Alloc{x_values, "x in fp8"});
  }
  m->saved_extras.push_back(
      Alloc{(transposes && x_grad ? 2 : 1) * w_values + 4, "the weight in fp8"});
  m->backward_needs_contiguous_grad = true;
  m->backward_temps.push_back(Alloc{(transposes ? 2 : 1) * y_values, "grad_output in e5m2"});
  if (x_grad && x.dtype != act) {
    m->backward_temps.push_back(Alloc{x_values * DTypeSize(act), "dgrad before autograd's cast"});
  }
  if (w_grad && w.dtype != act) {
    m->backward_temps.push_back(Alloc{w_values * DTypeSize(act), "wgrad before autograd's cast"});
  }
}

}  // namespace

void RegisterFp8TeRules(std::vector<OpRule>* r) {
  r->push_back({"te_linear", 2, 3, InferTeLinear, TeLinearMemory});
}

}  // namespace memest::rules
