// Rules for vLLM's quantized linears (engine/passes/served_quantize.h adds them). Inference only:
// vLLM's kernels have no backward, and a served model has no gradient.
//
//   w8a8_linear(x, weight, bias?; out_features, input_type, inputs, asymmetric=0, block_k=0)
//     vLLM's W8A8 linear (CutlassFP8ScaledMMLinearKernel, CutlassInt8ScaledMMLinearKernel,
//     model_executor/kernels/linear/scaled_mm): `weight` is the rank's [out, in] values of one
//     byte (input_type "fp8": float8_e4m3, held as uint8 here; "int8"). The input is quantized
//     to one byte per value (ops.scaled_fp8_quant / scaled_int8_quant) before
//     cutlass_scaled_mm: `inputs` "token" makes a float32 scale per token, "tensor" one float32
//     scale, "static" none (the checkpoint's); `asymmetric` (int8) an int32 zero point per
//     token; `block_k` (fp8 with block-wise weight scales, W8A8BlockFp8LinearOp) a float32 scale
//     per token and group of block_k input features. The result is x's dtype.
//   wna16_linear(x, weight, bias?; out_features, bits, kernel, act_order=0, multiprocessors)
//     vLLM's weight-only linear (MPLinearKernel: MacheteLinearKernel on Hopper,
//     AllSparkLinearKernel for 8-bit per-channel weights on Ampere and Ada, MarlinLinearKernel
//     elsewhere): `weight` holds the rank's [out, in] values packed 32 / bits to an int32,
//     [in * bits / 32, out] (AllSpark's dequantization workspace is the pass's). Marlin (csrc/quantization/gptq_marlin/gptq_marlin.cu)
//     allocates its float32 reduction scratch, multiprocessors * min(16 * ceil(tokens / 16), 64)
//     * 256 values, and with act_order the input permuted, [tokens, in]; Machete permutes the
//     input with act_order (ops.permute_cols). The result is x's dtype.
#include "engine/ir/text.h"
#include "engine/rules/internal.h"

namespace memest::rules {
namespace {

constexpr int64_t kMarlinThreadN = 256;  // MARLIN_NAMESPACE_NAME::max_thread_n

StatusOr<int64_t> OutFeatures(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(int64_t out, IntAttr(c.op.attrs, "out_features", 0, c.field));
  const int64_t in = c.in(0).shape.back();
  if (out <= 0 || in <= 0 || in > kMaxTensorBytes / out) {
    return InvalidArgument(AttrField(c, "out_features") + ": must be positive, and a weight of " +
                           "it by " + std::to_string(in) + " countable, got " + std::to_string(out));
  }
  return out;
}

Status CheckWeight(const OpCall& c, const Shape& want, DType dtype, const std::string& what) {
  if (c.in(1).dtype != dtype || c.in(1).shape != want) {
    return InvalidArgument(InputField(c, 1) + ": " + what + " is " +
                           std::string(DTypeName(dtype)) + " " + ShapeToString(want) + ", got " +
                           std::string(DTypeName(c.in(1).dtype)) + " " +
                           ShapeToString(c.in(1).shape));
  }
  return Status::Ok();
}

StatusOr<std::vector<OutputSpec>> Output(const OpCall& c, int64_t out) {
  if (c.inputs.size() == 3 && c.in(2).shape != Shape{out}) {
    return InvalidArgument(InputField(c, 2) + ": bias must have shape [" + std::to_string(out) +
                           "], got " + ShapeToString(c.in(2).shape));
  }
  Shape y = c.in(0).shape;
  y.back() = out;
  return std::vector<OutputSpec>{{y, c.in(0).dtype}};
}

StatusOr<std::vector<OutputSpec>> InferW8A8(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 1, 8));
  MEMEST_ASSIGN_OR_RETURN(int64_t out, OutFeatures(c));
  MEMEST_ASSIGN_OR_RETURN(std::string type, StringAttr(c.op.attrs, "input_type", "", c.field));
  MEMEST_ASSIGN_OR_RETURN(std::string inputs, StringAttr(c.op.attrs, "inputs", "", c.field));
  MEMEST_ASSIGN_OR_RETURN(int64_t block_k, IntAttr(c.op.attrs, "block_k", 0, c.field));
  MEMEST_RETURN_IF_ERROR(IntAttr(c.op.attrs, "asymmetric", 0, c.field).status());
  if (type != "fp8" && type != "int8") {
    return InvalidArgument(AttrField(c, "input_type") + ": fp8 or int8, got " + Quote(type));
  }
  if (inputs != "token" && inputs != "tensor" && inputs != "static") {
    return InvalidArgument(AttrField(c, "inputs") + ": token, tensor or static, got " +
                           Quote(inputs));
  }
  if (block_k < 0) {  // a block past the features is one group (vLLM ceil-divides)
    return InvalidArgument(AttrField(c, "block_k") + ": 0 or a block's size, got " +
                           std::to_string(block_k));
  }
  MEMEST_RETURN_IF_ERROR(CheckWeight(c, Shape{out, c.in(0).shape.back()},
                                     type == "fp8" ? DType::kUInt8 : DType::kInt8,
                                     "the quantized weight"));
  return Output(c, out);
}

// The scratch below is at most a few times the input's bytes (one byte a value, four a token
// or a token group): within kMaxTensorBytes (2^56) by the input's own bound, no overflow.
void W8A8Memory(const OpCall& c, OpMemory* m) {
  const Tensor& x = c.in(0);
  const int64_t in = x.shape.back();
  const int64_t tokens = Numel(x.shape) / in;  // within the input's bytes
  StatusOr<std::string> inputs = StringAttr(c.op.attrs, "inputs", "", c.field);
  StatusOr<int64_t> block_k = IntAttr(c.op.attrs, "block_k", 0, c.field);
  StatusOr<int64_t> asymmetric = IntAttr(c.op.attrs, "asymmetric", 0, c.field);
  m->forward_temps.push_back(Alloc{tokens * in, "the input quantized to one byte a value"});
  if (block_k.ok() && *block_k > 0) {
    m->forward_temps.push_back(
        Alloc{4 * tokens * ((in + *block_k - 1) / *block_k), "its float32 scales per token group"});
  } else if (inputs.ok() && *inputs == "token") {
    m->forward_temps.push_back(Alloc{4 * tokens, "its float32 scale per token"});
  } else if (inputs.ok() && *inputs == "tensor") {
    m->forward_temps.push_back(Alloc{4, "its float32 scale"});
  }
  if (asymmetric.ok() && *asymmetric != 0) {
    m->forward_temps.push_back(Alloc{4 * tokens, "its int32 zero point per token"});
  }
  m->grad_flow.assign(c.inputs.size(), GradFlow::kNone);
}

StatusOr<std::vector<OutputSpec>> InferWna16(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 1, 8));
  MEMEST_ASSIGN_OR_RETURN(int64_t out, OutFeatures(c));
  MEMEST_ASSIGN_OR_RETURN(int64_t bits, IntAttr(c.op.attrs, "bits", 0, c.field));
  MEMEST_ASSIGN_OR_RETURN(std::string kernel, StringAttr(c.op.attrs, "kernel", "", c.field));
  MEMEST_RETURN_IF_ERROR(IntAttr(c.op.attrs, "act_order", 0, c.field).status());
  MEMEST_ASSIGN_OR_RETURN(int64_t sms, IntAttr(c.op.attrs, "multiprocessors", 0, c.field));
  if (bits != 4 && bits != 8) {
    return InvalidArgument(AttrField(c, "bits") + ": 4 or 8, got " + std::to_string(bits));
  }
  if (kernel != "machete" && kernel != "marlin" && kernel != "allspark") {
    return InvalidArgument(AttrField(c, "kernel") + ": machete, allspark or marlin, got " +
                           Quote(kernel));
  }
  if (sms < 1 || sms > 1024) {
    return InvalidArgument(AttrField(c, "multiprocessors") + ": in [1, 1024], got " +
                           std::to_string(sms));
  }
  const int64_t in = c.in(0).shape.back();
  const int64_t pack = 32 / bits;
  if (in % pack != 0) {
    return InvalidArgument(InputField(c, 0) + ": " + std::to_string(in) +
                           " input features do not pack " + std::to_string(pack) +
                           " to an int32");
  }
  MEMEST_RETURN_IF_ERROR(
      CheckWeight(c, Shape{in / pack, out}, DType::kInt32, "the packed weight"));
  return Output(c, out);
}

void Wna16Memory(const OpCall& c, OpMemory* m) {
  const Tensor& x = c.in(0);
  const int64_t in = x.shape.back();
  const int64_t tokens = Numel(x.shape) / in;
  StatusOr<std::string> kernel = StringAttr(c.op.attrs, "kernel", "", c.field);
  StatusOr<int64_t> act_order = IntAttr(c.op.attrs, "act_order", 0, c.field);
  StatusOr<int64_t> sms = IntAttr(c.op.attrs, "multiprocessors", 0, c.field);
  if (act_order.ok() && *act_order != 0) {
    m->forward_temps.push_back(Alloc{BytesOf(x), "the input permuted to the act-order"});
  }
  if (kernel.ok() && *kernel == "marlin" && sms.ok() && tokens > 0) {
    const int64_t rows = std::min<int64_t>((tokens + 15) / 16 * 16, 64);
    m->forward_temps.push_back(
        Alloc{4 * *sms * rows * kMarlinThreadN, "Marlin's float32 reduction scratch"});
  }
  m->grad_flow.assign(c.inputs.size(), GradFlow::kNone);
}

}  // namespace

void RegisterServedQuantizedRules(std::vector<OpRule>* r) {
  r->push_back({"w8a8_linear", 2, 3, InferW8A8, W8A8Memory});
  r->push_back({"wna16_linear", 2, 3, InferWna16, Wna16Memory});
}

}  // namespace memest::rules
