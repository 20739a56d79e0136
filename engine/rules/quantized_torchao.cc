// Rules for torchao's weight-only linears (engine/passes/quantize_torchao.h adds them), read in
// torchao 0.19 (quantize_/workflows/int4/int4_tensor.py and int8/int8_tensor.py, their
// F.linear implementations). Inference only: the weights are tensor subclasses without
// gradients.
//
//   torchao_int4_mm(x, qdata, scale, zero_point; group_size) -> y
//     mslk.bf16i4bf16_rowwise(x.reshape(-1, in), qdata, scale, zero_point): x bfloat16
//     [..., in], qdata int8 [out, in / 2] (two values a byte), scale and zero_point bfloat16
//     [in / group_size, out]; y bfloat16 [..., out]. No scratch.
//   torchao_int8_mm(x, qdata) -> m
//     torch.mm(x.reshape(-1, in), qdata.t().to(x.dtype)): the whole weight cast to x's dtype
//     while the product is made; m [..., out] in x's dtype.
//   torchao_int8_scale(m, scale) -> y
//     m * scale.to(m.dtype).flatten(): scale float32 [out, 1], cast where m is not float32.
#include "engine/ir/text.h"
#include "engine/rules/internal.h"

namespace memest::rules {
namespace {

Status RequireQdata(const OpCall& c, int64_t in, bool int4) {
  const Tensor& w = c.in(1);
  const int64_t packed = int4 ? (in + 1) / 2 : in;
  if (w.dtype != DType::kInt8 || w.shape.size() != 2 || w.shape[1] != packed) {
    return InvalidArgument(InputField(c, 1) + ": qdata, int8 [out, " + std::to_string(packed) +
                           "] for " + std::to_string(in) + " input features, got " +
                           std::string(DTypeName(w.dtype)) + " " + ShapeToString(w.shape));
  }
  return Status::Ok();
}

OutputSpec Output(const Tensor& x, int64_t out) {
  Shape y = x.shape;
  y.back() = out;
  return OutputSpec{y, x.dtype, {}, -1, false};
}

StatusOr<std::vector<OutputSpec>> InferInt4(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 1, 8));
  if (c.in(0).dtype != DType::kBFloat16) {
    return InvalidArgument(InputField(c, 0) + ": the int4 kernel takes bfloat16, got " +
                           std::string(DTypeName(c.in(0).dtype)));
  }
  MEMEST_ASSIGN_OR_RETURN(int64_t group, IntAttr(c.op.attrs, "group_size", 0, c.field));
  const int64_t in = c.in(0).shape.back();
  if (group <= 0 || in % group != 0) {
    return InvalidArgument(AttrField(c, "group_size") + ": must divide the " + std::to_string(in) +
                           " input features, got " + std::to_string(group));
  }
  MEMEST_RETURN_IF_ERROR(RequireQdata(c, in, true));
  const Shape groups{in / group, c.in(1).shape[0]};
  for (size_t k = 2; k < 4; ++k) {
    if (c.in(k).shape != groups || c.in(k).dtype != DType::kBFloat16) {
      return InvalidArgument(InputField(c, k) + ": bfloat16 " + ShapeToString(groups) +
                             ", one per group and output, got " +
                             std::string(DTypeName(c.in(k).dtype)) + " " +
                             ShapeToString(c.in(k).shape));
    }
  }
  return std::vector<OutputSpec>{Output(c.in(0), c.in(1).shape[0])};
}

StatusOr<std::vector<OutputSpec>> InferInt8(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 1, 8));
  MEMEST_RETURN_IF_ERROR(RequireQdata(c, c.in(0).shape.back(), false));
  return std::vector<OutputSpec>{Output(c.in(0), c.in(1).shape[0])};
}

// The weight's cast: [out, in] values in x's dtype, within 8x the weight's bytes.
void Int8Memory(const OpCall& c, OpMemory* m) {
  m->grad_flow.assign(c.inputs.size(), GradFlow::kNone);
  m->forward_temps.push_back(
      Alloc{Numel(c.in(1).shape) * DTypeSize(c.in(0).dtype), "the int8 weight cast to x's dtype"});
}

StatusOr<std::vector<OutputSpec>> InferScale(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 1, 8));
  const Shape rows{c.in(0).shape.back(), 1};
  if (c.in(1).dtype != DType::kFloat32 || c.in(1).shape != rows) {
    return InvalidArgument(InputField(c, 1) + ": the row scales, float32 " + ShapeToString(rows) +
                           ", got " + std::string(DTypeName(c.in(1).dtype)) + " " +
                           ShapeToString(c.in(1).shape));
  }
  return std::vector<OutputSpec>{Output(c.in(0), c.in(0).shape.back())};
}

void ScaleMemory(const OpCall& c, OpMemory* m) {
  m->grad_flow.assign(c.inputs.size(), GradFlow::kNone);
  if (c.in(0).dtype != DType::kFloat32) {
    m->forward_temps.push_back(
        Alloc{Numel(c.in(1).shape) * DTypeSize(c.in(0).dtype), "scale.to(m.dtype)"});
  }
}

}  // namespace

void RegisterQuantizedTorchaoRules(std::vector<OpRule>* r) {
  r->push_back({"torchao_int4_mm", 4, 4, InferInt4, NoGradient});
  r->push_back({"torchao_int8_mm", 2, 2, InferInt8, Int8Memory});
  r->push_back({"torchao_int8_scale", 2, 2, InferScale, ScaleMemory});
}

}  // namespace memest::rules
