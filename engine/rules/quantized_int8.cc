// Rules for bitsandbytes' LLM.int8 (Linear8bitLt, transformers' load_in_8bit): the ops
// engine/passes/quantize.h writes one call as. Read in bitsandbytes 0.50 (autograd/
// _functions.py MatMul8bitLt, backends/cuda/ops.py, backends/default/ops.py, _ops.py; the same
// tensors since the 0.45 rewrite), as it runs on CUDA. x is the module's input, `rows` its
// values over its last dim (MatMul8bitLt reshapes a 3-D x to [rows, in]).
//
//   int8_quantize_rows(x; threshold, outlier_columns) -> CA, SCA[, cols]
//     int8_vectorwise_quant(A.to(float16), threshold): CA int8 shaped as x and SCA float32
//     [rows]; with threshold > 0 the outlier columns' int64 indices [outlier_columns]
//     (argwhere((|A| >= threshold).any(0))). Scratch: A's float16 copy where x is not float16;
//     with threshold > 0, |A| in float16 and its bool mask, each [rows, in], and the mask's
//     any(0), bool [in]. Nothing differentiable.
//   int8_outlier_inputs(x, cols) -> subA
//     A[:, cols]: x's outlier columns, [rows, outlier_columns] in x's dtype (int8_mixed_scaled_mm).
//   int8_outlier_weight(weight, SCB, cols) -> float32 [out, outlier_columns]
//     int8_vectorwise_dequant(CB[:, cols].contiguous(), SCB): the int8 gather, then A * SCB's
//     float32 product while * (1/127) makes the result (the `to` x's dtype follows as its own op).
//   linear_8bit(x, weight, SCB, CA, SCA[, bias]; held_grad?) -> y
//     int8_scaled_mm: int8_linear_matmul's int32 [rows, out] (where `in` is not a multiple of 4,
//     cuBLASLt cannot: float32 copies of CA and CB, a float32 product and its int32 copy first),
//     int8_mm_dequant's float16 [rows, out], and its .to(x's dtype), y (the float16 itself where x
//     is float16). x is 2-D or 3-D (int8_linear_matmul's limit).
//     With grad, MatMul8bitLt keeps A (x) in ctx.tensors, an attribute of its autograd node, not
//     through save_for_backward: it stays until the graph is freed, and checkpointing's hooks
//     never see it (OpMemory::saved_until_graph_freed). Backward, for x only (the weight is an
//     Int8Params without grad): CB.to(x's dtype, copy=True).mul_(SCB.unsqueeze(1) * (1/127)), a
//     dequantized [out, in] weight and a float32 [out, 1], then grad_A = grad_output @ CB. A bias
//     that needs grad gets grad_output.sum(0) in its dtype: for a 3-D x that is [seq, out], which
//     autograd's validate_outputs sums to [out]. `held_grad` (float16 or bfloat16): the backward
//     began from a half gradient (the outliers' addmm under autocast), which it holds until it
//     returns.
//   int8_add_outliers(y, subA, subB, CA, SCA, x; autocast?) -> output
//     output.addmm(subA, subB.t()) with subB [out, outlier_columns]: a new [rows, out], while
//     forward's locals CA and SCA are still alive (read by nothing here). addmm is
//     on autocast's list: under autocast (the attribute, float16 or bfloat16) y, subA and subB
//     are cast to it first where they differ, and the output is half. ctx.tensors keeps subA
//     too where x needs grad. Backward hands y the incoming gradient, cast to y's dtype where the
//     output's differs (MatMul8bitLt.backward's grad_output.to(ctx.dtype_A)).
#include <optional>

#include "engine/ir/text.h"
#include "engine/rules/internal.h"

namespace memest::rules {
namespace {

// x's rows: its values over its last dim.
int64_t Rows(const Tensor& x) { return x.shape.back() > 0 ? Numel(x.shape) / x.shape.back() : 0; }

// A float16 or bfloat16 attribute, unset: nullopt.
StatusOr<std::optional<DType>> HalfAttr(const OpCall& c, const char* name) {
  MEMEST_ASSIGN_OR_RETURN(std::string half, StringAttr(c.op.attrs, name, "", c.field));
  if (half.empty()) return std::optional<DType>();
  StatusOr<DType> d = ParseDType(half);
  if (!d.ok() || (*d != DType::kFloat16 && *d != DType::kBFloat16)) {
    return InvalidArgument(AttrField(c, name) + ": float16 or bfloat16, got " + Quote(half));
  }
  return std::optional<DType>(*d);
}

StatusOr<int64_t> OutlierColumns(const OpCall& c, int64_t in) {
  MEMEST_ASSIGN_OR_RETURN(int64_t n, IntAttr(c.op.attrs, "outlier_columns", 0, c.field));
  if (n < 0 || n > in) {
    return InvalidArgument(AttrField(c, "outlier_columns") + ": in [0, " + std::to_string(in) +
                           "] (the input's columns), got " + std::to_string(n));
  }
  return n;
}

Status RequireInt8Weight(const OpCall& c, size_t i) {
  if (c.in(i).dtype != DType::kInt8 || c.in(i).shape.size() != 2) {
    return InvalidArgument(InputField(c, i) + ": the 8-bit weight, int8 [out, in], got " +
                           std::string(DTypeName(c.in(i).dtype)) + " " +
                           ShapeToString(c.in(i).shape));
  }
  return Status::Ok();
}

Status RequireScales(const OpCall& c, size_t i, int64_t n, const char* what) {
  if (c.in(i).dtype != DType::kFloat32 || c.in(i).shape != Shape{n}) {
    return InvalidArgument(InputField(c, i) + ": " + what + ", float32 [" + std::to_string(n) +
                           "], got " + std::string(DTypeName(c.in(i).dtype)) + " " +
                           ShapeToString(c.in(i).shape));
  }
  return Status::Ok();
}

Status RequireColumns(const OpCall& c, size_t i) {
  if (c.in(i).dtype != DType::kInt64 || c.in(i).shape.size() != 1) {
    return InvalidArgument(InputField(c, i) + ": the outlier columns' indices, int64 [n], got " +
                           std::string(DTypeName(c.in(i).dtype)) + " " +
                           ShapeToString(c.in(i).shape));
  }
  return Status::Ok();
}

OutputSpec Detached(Shape shape, DType dtype) {
  return OutputSpec{std::move(shape), dtype, {}, -1, false};
}

StatusOr<std::vector<OutputSpec>> InferQuantizeRows(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 2, 3));
  MEMEST_ASSIGN_OR_RETURN(double threshold, FloatAttr(c.op.attrs, "threshold", 0, c.field));
  if (!(threshold >= 0) || threshold > 1e30) {
    return InvalidArgument(AttrField(c, "threshold") + ": a finite value at least 0, got " +
                           std::to_string(threshold));
  }
  MEMEST_ASSIGN_OR_RETURN(int64_t n, OutlierColumns(c, c.in(0).shape.back()));
  std::vector<OutputSpec> out = {Detached(c.in(0).shape, DType::kInt8),
                                 Detached({Rows(c.in(0))}, DType::kFloat32)};
  if (threshold > 0) out.push_back(Detached({n}, DType::kInt64));
  return out;
}

// Within kMaxTensorBytes each: [rows, in] is x's values, at most 4 bytes a value here.
void QuantizeRowsMemory(const OpCall& c, OpMemory* m) {
  m->grad_flow = {GradFlow::kNone};
  const Tensor& x = c.in(0);
  const int64_t values = Numel(x.shape);
  if (x.dtype != DType::kFloat16) m->forward_temps.push_back(Alloc{2 * values, "A.to(float16)"});
  if (c.outputs.size() == 3) {
    m->forward_temps.push_back(Alloc{2 * values, "|A| in float16"});
    m->forward_temps.push_back(Alloc{values, "the outliers' bool mask"});
    m->forward_temps.push_back(Alloc{x.shape.back(), "the mask's any(0)"});
  }
}

StatusOr<std::vector<OutputSpec>> InferOutlierInputs(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 2, 3));
  MEMEST_RETURN_IF_ERROR(RequireColumns(c, 1));
  if (c.in(1).shape[0] > c.in(0).shape.back()) {
    return InvalidArgument(InputField(c, 1) + ": more outlier columns than x has, " +
                           std::to_string(c.in(1).shape[0]));
  }
  Shape sub = c.in(0).shape;
  sub.back() = c.in(1).shape[0];
  return std::vector<OutputSpec>{Detached(sub, c.in(0).dtype)};  // out of autograd's sight
}

StatusOr<std::vector<OutputSpec>> InferOutlierWeight(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireInt8Weight(c, 0));
  const int64_t out = c.in(0).shape[0];
  MEMEST_RETURN_IF_ERROR(RequireScales(c, 1, out, "SCB, the weight's row scales"));
  MEMEST_RETURN_IF_ERROR(RequireColumns(c, 2));
  if (c.in(2).shape[0] > c.in(0).shape[1]) {
    return InvalidArgument(InputField(c, 2) + ": more outlier columns than the weight has, " +
                           std::to_string(c.in(2).shape[0]));
  }
  return std::vector<OutputSpec>{Detached({out, c.in(2).shape[0]}, DType::kFloat32)};
}

void OutlierWeightMemory(const OpCall& c, OpMemory* m) {
  NoGradient(c, m);
  const int64_t values = Numel(c.out(0).shape);  // within the weight's
  m->forward_temps = {Alloc{values, "CB[:, cols].contiguous()"},
                      Alloc{4 * values, "CB[:, cols] * SCB in float32"}};
}

StatusOr<std::vector<OutputSpec>> InferLinear8bit(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 2, 3));
  MEMEST_RETURN_IF_ERROR(RequireInt8Weight(c, 1));
  const int64_t in = c.in(0).shape.back(), out = c.in(1).shape[0];
  if (c.in(1).shape[1] != in) {
    return InvalidArgument(InputField(c, 1) + ": the weight of a linear of " + std::to_string(in) +
                           " inputs, got " + ShapeToString(c.in(1).shape));
  }
  MEMEST_RETURN_IF_ERROR(RequireScales(c, 2, out, "SCB, the weight's row scales"));
  if (c.in(3).dtype != DType::kInt8 || c.in(3).shape != c.in(0).shape) {
    return InvalidArgument(
        InputField(c, 3) + ": CA, x quantized, int8 " + ShapeToString(c.in(0).shape) + ", got " +
        std::string(DTypeName(c.in(3).dtype)) + " " + ShapeToString(c.in(3).shape));
  }
  MEMEST_RETURN_IF_ERROR(RequireScales(c, 4, Rows(c.in(0)), "SCA, x's row scales"));
  if (c.inputs.size() == 6 && c.in(5).shape != Shape{out}) {
    return InvalidArgument(InputField(c, 5) + ": bias must have shape [" + std::to_string(out) +
                           "], got " + ShapeToString(c.in(5).shape));
  }
  const int64_t rows = Rows(c.in(0));
  if (out > 0 && rows > kMaxTensorBytes / 4 / out) {
    return InvalidArgument(InputField(c, 0) + ": its int32 product with " + std::to_string(out) +
                           " outputs is beyond 2^56 bytes");
  }
  MEMEST_RETURN_IF_ERROR(HalfAttr(c, "held_grad").status());
  Shape y = c.in(0).shape;
  y.back() = out;
  return std::vector<OutputSpec>{{y, c.in(0).dtype}};
}

void Linear8bitMemory(const OpCall& c, OpMemory* m) {
  const Tensor& x = c.in(0);
  const int64_t rows = Rows(x), in = x.shape.back(), out = c.out(0).shape.back();
  const int64_t product = rows * out;  // bounded by InferLinear8bit
  if (in % 4 != 0) {  // cuBLASLt's int8 matmul cannot; bitsandbytes multiplies in float32
    m->forward_temps.push_back(Alloc{4 * Numel(x.shape), "CA.float()"});
    m->forward_temps.push_back(Alloc{4 * Numel(c.in(1).shape), "CB.float()"});
    m->forward_temps.push_back(Alloc{4 * product, "the float32 product"});
    m->forward_temps.push_back(Alloc{4 * product, "the product's int32 copy"});
  }
  m->forward_temps.push_back(Alloc{4 * product, "int8_linear_matmul's int32 result"});
  if (x.dtype != DType::kFloat16) {
    m->forward_temps.push_back(Alloc{2 * product, "int8_mm_dequant's float16 result"});
  }
  m->grad_flow.assign(c.inputs.size(), GradFlow::kNone);
  const bool bias = c.inputs.size() == 6 && c.needs_grad(5);
  if (!c.needs_grad(0) && !bias) return;
  m->backward_needs_contiguous_grad = true;  // grad_output.reshape(-1, out).contiguous()
  StatusOr<std::optional<DType>> held = HalfAttr(c, "held_grad");
  if (held.ok() && held->has_value()) {
    m->backward_temps.push_back(Alloc{product * DTypeSize(**held), "the half grad_output"});
  }
  if (bias) {
    m->grad_flow[5] = GradFlow::kFresh;
    if (x.shape.size() == 3) {  // grad_output.sum(0): [seq, out], then autograd's sum to [out]
      m->backward_temps.push_back(
          Alloc{x.shape[1] * out * DTypeSize(c.in(5).dtype), "grad_output.sum(0), [seq, out]"});
    }
  }
  if (!c.needs_grad(0)) return;  // any(ctx.needs_input_grad[:2]) is false: nothing kept
  m->saved_inputs = {0};         // ctx.tensors' A
  m->saved_until_graph_freed = true;
  m->grad_flow[0] = GradFlow::kFresh;
  m->backward_temps.push_back(Alloc{Numel(c.in(1).shape) * DTypeSize(x.dtype), "CB dequantized"});
  m->backward_temps.push_back(Alloc{4 * out, "SCB / 127"});
}

StatusOr<std::vector<OutputSpec>> InferAddOutliers(const OpCall& c) {
  for (size_t i = 0; i < 3; ++i) MEMEST_RETURN_IF_ERROR(RequireFloating(c, i));
  const Tensor& y = c.in(0);
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 2, 3));
  const int64_t n = c.in(1).shape.empty() ? -1 : c.in(1).shape.back();
  Shape sub = y.shape;
  sub.back() = n;
  if (c.in(1).shape != sub || c.in(2).shape != Shape{y.shape.back(), n}) {
    return InvalidArgument(c.field + ": subA [rows, n] and subB [out, n] for y " +
                           ShapeToString(y.shape) + ", got " + ShapeToString(c.in(1).shape) +
                           " and " + ShapeToString(c.in(2).shape));
  }
  if (c.in(3).dtype != DType::kInt8 || c.in(4).dtype != DType::kFloat32 ||
      c.in(5).shape != c.in(3).shape) {
    return InvalidArgument(c.field + ": CA (int8), SCA (float32) and x after subB, got " +
                           std::string(DTypeName(c.in(3).dtype)) + " and " +
                           std::string(DTypeName(c.in(4).dtype)));
  }
  MEMEST_ASSIGN_OR_RETURN(std::optional<DType> half, HalfAttr(c, "autocast"));
  const DType dtype = half && y.dtype != DType::kFloat64 ? *half : y.dtype;
  return std::vector<OutputSpec>{{y.shape, dtype}};
}

void AddOutliersMemory(const OpCall& c, OpMemory* m) {
  const DType half = c.out(0).dtype;
  for (size_t i = 0; i < 3; ++i) {
    if (c.in(i).dtype != half) {
      m->forward_temps.push_back(
          Alloc{Numel(c.in(i).shape) * DTypeSize(half), "an addmm operand cast by autocast"});
    }
  }
  m->grad_flow.assign(c.inputs.size(), GradFlow::kNone);
  m->grad_flow[0] = half == c.in(0).dtype ? GradFlow::kPassThrough : GradFlow::kFresh;
  if (!c.needs_grad(5)) return;  // any(ctx.needs_input_grad[:2]) is false: nothing kept
  m->saved_inputs = {1};         // ctx.tensors' subA
  m->saved_until_graph_freed = true;
}

}  // namespace

void RegisterQuantizedInt8Rules(std::vector<OpRule>* r) {
  r->push_back({"int8_quantize_rows", 1, 1, InferQuantizeRows, QuantizeRowsMemory});
  r->push_back({"int8_outlier_inputs", 2, 2, InferOutlierInputs, NoGradient});
  r->push_back({"int8_outlier_weight", 3, 3, InferOutlierWeight, OutlierWeightMemory});
  OpRule linear{"linear_8bit", 5, 6, InferLinear8bit, Linear8bitMemory};
  linear.keeps_node_attributes = true;
  r->push_back(linear);
  OpRule outliers{"int8_add_outliers", 6, 6, InferAddOutliers, AddOutliersMemory};
  outliers.keeps_node_attributes = true;
  r->push_back(outliers);
}

}  // namespace memest::rules
