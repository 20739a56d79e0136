// Rules for quantized weights: bitsandbytes' 4-bit linear.
//
//   linear_4bit(x, weight, bias?; out_features, weight_dtype, double_quant, autocast?)
//     bitsandbytes' MatMul4Bit (bitsandbytes/autograd/_functions.py, 0.43.2 and later), which
//     Linear4bit.forward calls with x already in its compute dtype: `weight` is the packed NF4/FP4
//     storage, uint8 [(n+1)/2, 1] for n = out_features * in_features. Forward dequantizes the
//     whole weight to [out, in] in `weight_dtype` (the dtype it was quantized from, QuantState
//     .dtype), first rebuilding the float32 absmax [n/64] where `double_quant`; casts it to x's
//     dtype where they differ; runs F.linear; frees the dequantized weight when linear returns.
//     ctx keeps the packed weight (resident) and nothing else: no activation is saved (0.43.1
//     and earlier kept x; fixed by #1270). Backward dequantizes again, casts it to grad_output's
//     dtype where they differ, for grad_input = grad_output @ W; the weight never gets a gradient.
//     `autocast` (float16 or bfloat16; set by the autocast pass, engine/passes/passes.h): the op
//     runs under torch.autocast. MatMul4Bit has no custom_fwd, so its F.linear autocasts: where
//     x is in another dtype (a float32 compute dtype), a half copy of x, of the dequantized
//     weight and of the bias exist while linear runs, and the result is half. Backward then gets
//     a half grad_output: the weight is dequantized and cast to half, grad_input is computed in
//     half and autograd casts it to x's dtype (a half grad_input while the cast is made).
#include "engine/ir/text.h"
#include "engine/rules/internal.h"

namespace memest::rules {
namespace {

// The dtype autocast runs F.linear in, when attrs.autocast is set and x is one it casts
// (float32, float16, bfloat16: autocast leaves float64 alone); x's dtype otherwise.
StatusOr<DType> LinearDType(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(std::string name, StringAttr(c.op.attrs, "autocast", "", c.field));
  if (name.empty()) return c.in(0).dtype;
  StatusOr<DType> half = ParseDType(name);
  if (!half.ok() || (*half != DType::kFloat16 && *half != DType::kBFloat16)) {
    return InvalidArgument(AttrField(c, "autocast") + ": float16 or bfloat16, got " + Quote(name));
  }
  return c.in(0).dtype == DType::kFloat64 ? c.in(0).dtype : *half;
}

StatusOr<std::vector<OutputSpec>> InferLinear4bit(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 1, 8));
  MEMEST_ASSIGN_OR_RETURN(int64_t out, IntAttr(c.op.attrs, "out_features", 0, c.field));
  MEMEST_ASSIGN_OR_RETURN(std::string dtype, StringAttr(c.op.attrs, "weight_dtype", "", c.field));
  MEMEST_RETURN_IF_ERROR(IntAttr(c.op.attrs, "double_quant", 0, c.field).status());
  MEMEST_ASSIGN_OR_RETURN(DType linear, LinearDType(c));
  StatusOr<DType> weight_dtype = ParseDType(dtype);
  if (!weight_dtype.ok() || !IsFloating(*weight_dtype)) {
    return InvalidArgument(AttrField(c, "weight_dtype") + ": the floating dtype the weight was "
                           "quantized from, got " + Quote(dtype));
  }
  const int64_t in = c.in(0).shape.back();
  if (out <= 0 || in > kMaxTensorBytes / out) {
    return InvalidArgument(AttrField(c, "out_features") + ": must be positive, and a weight of " +
                           "it by " + std::to_string(in) + " countable, got " + std::to_string(out));
  }
  const Shape packed{(out * in + 1) / 2, 1};
  if (c.in(1).dtype != DType::kUInt8 || c.in(1).shape != packed) {
    return InvalidArgument(InputField(c, 1) + ": the packed 4-bit weight of a [" +
                           std::to_string(out) + ", " + std::to_string(in) + "] linear is uint8 " +
                           ShapeToString(packed) + ", got " + std::string(DTypeName(c.in(1).dtype)) +
                           " " + ShapeToString(c.in(1).shape));
  }
  if (c.inputs.size() == 3 && c.in(2).shape != Shape{out}) {
    return InvalidArgument(InputField(c, 2) + ": bias must have shape [" + std::to_string(out) +
                           "], got " + ShapeToString(c.in(2).shape));
  }
  Shape y = c.in(0).shape;
  y.back() = out;
  return std::vector<OutputSpec>{{y, linear}};
}

// The dequantization: the float32 absmax rebuilt from its 8-bit form (double quantization), the
// weight in its own dtype, and its copy in `to` where they differ.
std::vector<Alloc> Dequantized(const OpCall& c, DType to) {
  const int64_t in = c.in(0).shape.back();
  const int64_t out = c.out(0).shape.back();
  const int64_t n = in * out;  // bounded by InferLinear4bit
  StatusOr<std::string> name = StringAttr(c.op.attrs, "weight_dtype", "", c.field);
  StatusOr<DType> dtype = ParseDType(name.ok() ? *name : "");
  const DType weight = dtype.ok() ? *dtype : c.in(0).dtype;
  std::vector<Alloc> temps;
  StatusOr<int64_t> double_quant = IntAttr(c.op.attrs, "double_quant", 0, c.field);
  if (double_quant.ok() && *double_quant != 0) {
    temps.push_back(Alloc{4 * ((n + 63) / 64), "float32 absmax rebuilt for the dequantization"});
  }
  temps.push_back(Alloc{n * DTypeSize(weight), "the dequantized weight"});
  if (weight != to) temps.push_back(Alloc{n * DTypeSize(to), "the dequantized weight, cast"});
  return temps;
}

void Linear4bitMemory(const OpCall& c, OpMemory* m) {
  const Tensor& x = c.in(0);
  const DType linear = c.out(0).dtype;  // F.linear's: x's, or autocast's
  const int64_t n = x.shape.back() * c.out(0).shape.back();  // bounded by InferLinear4bit
  const int64_t linear_size = DTypeSize(linear);
  m->forward_temps = Dequantized(c, x.dtype);
  if (linear != x.dtype) {  // autocast's casts inside F.linear (sizes within 2x x's and W's)
    m->forward_temps.push_back(Alloc{Numel(x.shape) * linear_size, "x cast by autocast"});
    m->forward_temps.push_back(Alloc{n * linear_size, "the dequantized weight cast by autocast"});
    if (c.inputs.size() == 3 && c.in(2).dtype != linear) {
      m->forward_temps.push_back(
          Alloc{c.out(0).shape.back() * linear_size, "bias cast by autocast"});
    }
  }
  m->grad_flow = {GradFlow::kFresh, GradFlow::kNone, GradFlow::kNone};
  m->grad_flow.resize(c.inputs.size());
  if (!c.needs_grad(0)) return;
  m->backward_temps = Dequantized(c, linear);  // cast to grad_output's dtype
  if (linear != x.dtype) {
    m->backward_temps.push_back(
        Alloc{Numel(x.shape) * linear_size, "grad_input in autocast's dtype, cast by autograd"});
  }
}

}  // namespace

void RegisterQuantizedRules(std::vector<OpRule>* r) {
  r->push_back({"linear_4bit", 2, 3, InferLinear4bit, Linear4bitMemory});
}

}  // namespace memest::rules
