#include "engine/passes/quantize.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "engine/ir/text.h"
#include "engine/passes/linear_modules.h"
#include "engine/passes/passes.h"
#include "engine/passes/quantize_torchao.h"
#include "engine/report/report.h"

namespace memest {
namespace {

constexpr int64_t kBlock = 64;         // bitsandbytes' 4-bit blocksize
constexpr int64_t kNestedBlock = 256;  // the double quantization's blocksize

int64_t Blocks(int64_t n, int64_t block) { return (n + block - 1) / block; }

// The QuantState's tensors of a weight of `n` values, as (name, shape, dtype).
struct StateTensor {
  const char* name;
  int64_t elements;
  DType dtype;
};
std::vector<StateTensor> QuantStateTensors(int64_t n, bool double_quant) {
  std::vector<StateTensor> state;
  if (double_quant) {
    state.push_back({"absmax", Blocks(n, kBlock), DType::kUInt8});
    state.push_back({"nested_absmax", Blocks(Blocks(n, kBlock), kNestedBlock), DType::kFloat32});
    state.push_back({"offset", 1, DType::kFloat32});
    state.push_back({"nested_code", 256, DType::kFloat32});
  } else {
    state.push_back({"absmax", Blocks(n, kBlock), DType::kFloat32});
  }
  state.push_back({"code", 16, DType::kFloat32});
  return state;
}

// transformers' _replace_with_bnb_linear leaves a module alone when its attribute name is an
// entry, when its path is one, or when an entry followed by '.' occurs in its path.
bool Skipped(std::string_view module, const std::vector<std::string>& skip) {
  const std::string_view last = module.substr(module.rfind('.') + 1);
  for (const std::string& key : skip) {
    if (key == last || key == module || module.find(key + ".") != std::string_view::npos) {
      return true;
    }
  }
  return false;
}

// The kernel PyTorch picks for attention whose inputs the float32 upcast reached: flash and
// cuDNN take float16 and bfloat16 only, the memory-efficient kernel takes float32 (sdp_utils'
// check_tensor_dtype). The builders chose the kernel for the dtype they built in.
bool ReselectForFloat32(const Op& op, GraphBuilder& b, std::vector<int>& map, const Graph& g) {
  StatusOr<std::string> backend = StringAttr(op.attrs, "backend", "", "");
  if (!backend.ok() || (*backend != "flash" && *backend != "cudnn") ||
      b.tensor(map[op.inputs[0]]).dtype != DType::kFloat32) {
    return false;
  }
  Attrs attrs = op.attrs;
  attrs["backend"] = std::string("efficient");
  ReplayOp(g, op, MappedInputs(op, map), std::move(attrs), b, map);
  return true;
}

// Linear8bitLt.forward: bnb.matmul(x, weight, bias, state), MatMul8bitLt on x as it comes,
// written as the ops engine/rules/quantized_int8.cc describes. `scb` is the module's row scales;
// `n` the outlier columns of x (0: none, or no threshold).
int EmitLinear8bit(GraphBuilder& b, int x, int weight, int scb, int bias, int64_t n,
                   double threshold) {
  const std::vector<int> quantized =
      b.Add("int8_quantize_rows", {x}, {{"threshold", threshold}, {"outlier_columns", n}});
  if (quantized.size() < 2) return -1;
  int sub_a = -1, sub_b = -1;
  if (n > 0 && quantized.size() == 3) {  // int8_mixed_scaled_mm's outlier part
    sub_a = b.Add1("int8_outlier_inputs", {x, quantized[2]});
    sub_b = b.Add1("int8_outlier_weight", {weight, scb, quantized[2]});
    const DType dtype = b.ok() ? b.tensor(x).dtype : DType::kFloat32;
    if (dtype != DType::kFloat32) {
      sub_b = b.Add1("to", {sub_b}, {{"dtype", std::string(DTypeName(dtype))}});
    }
  }
  std::vector<int> inputs = {x, weight, scb, quantized[0], quantized[1]};
  if (bias >= 0) inputs.push_back(bias);
  Attrs attrs;
  // Under autocast the outliers' addmm is half: MatMul8bitLt's backward starts from that half
  // gradient and holds it to its end.
  const DType half = b.autocast();
  if (sub_a >= 0 && half != DType::kFloat32 && b.ok() && b.tensor(x).dtype != half) {
    attrs["held_grad"] = std::string(DTypeName(half));
  }
  const int y = b.Add1("linear_8bit", std::move(inputs), std::move(attrs));
  return sub_a < 0 ? y
                   : b.Add1("int8_add_outliers",
                            {y, sub_a, sub_b, quantized[0], quantized[1], x});
}

}  // namespace

int64_t Bnb4bitWeightBytes(int64_t n, bool double_quant) {
  int64_t bytes = (n + 1) / 2;
  for (const StateTensor& s : QuantStateTensors(n, double_quant)) {
    bytes += s.elements * DTypeSize(s.dtype);
  }
  return bytes;
}

StatusOr<Graph> ApplyQuantization(const Graph& graph, const QuantizationConfig& q,
                                  Budget* budget, std::optional<DType> loaded) {
  const std::vector<std::string> linear = LinearModules(graph);
  const std::vector<std::string> skip =
      q.skip_modules.empty() ? std::vector<std::string>{OutputLayer(graph)} : q.skip_modules;
  for (size_t k = 0; k < q.skip_modules.size(); ++k) {
    bool found = false;
    for (const std::string& m : linear) found = found || Skipped(m, {q.skip_modules[k]});
    if (!found) {
      return InvalidArgument("config.quantization.skip_modules[" + std::to_string(k) + "]: " +
                             Quote(q.skip_modules[k]) + " matches no Linear module of the model");
    }
  }
  std::set<std::string, std::less<>> quantized;
  for (const std::string& m : linear) {
    if (!Skipped(m, skip)) quantized.insert(m);
  }
  if (quantized.empty()) {
    return InvalidArgument("config.quantization: the model has no Linear module to quantize "
                           "beside the skipped ones");
  }

  const bool torchao = IsTorchaoFormat(q.format);
  if (torchao) {  // transformers' TorchAoHfQuantizer: nn.Linear only; int4 skips what
                  // group_size does not divide
    for (const LinearCall& call :
         LinearCalls(graph, [&](const std::string& s) { return quantized.count(s) > 0; })) {
      const int64_t in = graph.tensors[call.input].shape.back();
      if (graph.ops[call.op].kind != "linear" ||
          (q.format == WeightFormat::kTorchaoInt4 && in % q.group_size != 0)) {
        quantized.erase(graph.ops[call.op].scope);
      }
    }
    if (quantized.empty()) {
      return InvalidArgument("config.quantization: the model has no nn.Linear that torchao " +
                             std::string(WeightFormatName(q.format)) + " quantizes");
    }
  }

  // Each quantized module's calls, by the last op of the call; the dense weights to pack, and
  // their [out, in] (a Conv1D's weight is [in, out]; bitsandbytes' 8-bit layer transposes it).
  Graph dense = graph;
  std::vector<LinearCall> calls(graph.ops.size());  // by the call's last op
  std::vector<bool> packed(graph.tensors.size(), false);
  std::vector<Shape> out_in(graph.tensors.size());
  for (const LinearCall& call :
       LinearCalls(graph, [&](const std::string& s) { return quantized.count(s) > 0; })) {
    calls[call.last] = call;
    packed[call.weight] = true;
    const Shape& y = graph.tensors[graph.ops[call.op].outputs[0]].shape;
    out_in[call.weight] = {y.back(), graph.tensors[call.input].shape.back()};
  }
  // A weight another module reads too (a tied lm_head's, the embedding's) cannot be packed.
  if (const std::optional<TiedRead> tied = ReadOutside(graph, packed, quantized)) {
    return InvalidArgument("config.quantization.skip_modules: the weight " +
                           Quote(graph.tensors[tied->weight].name) + " is also read in " +
                           Quote(graph.ops[tied->op].scope) + " (tied); leave its Linear dense "
                           "(skip it)");
  }
  const bool int8 = q.format == WeightFormat::kBnbInt8;
  for (size_t t = 0; t < dense.tensors.size(); ++t) {
    Tensor& leaf = dense.tensors[t];
    if (leaf.role != TensorRole::kParameter) continue;
    if (packed[t] && int8) {  // Int8Params: frozen, CB int8 [out, in] in place of the weight
      leaf.shape = out_in[t];
      leaf.strides = ContiguousStrides(leaf.shape);
      leaf.dtype = DType::kInt8;
      leaf.requires_grad = false;
    } else if (packed[t] && torchao) {  // the tensor subclass's qdata
      PackTorchaoWeight(q, out_in[t], &leaf);
    } else if (packed[t]) {  // Params4bit: frozen, the packed storage in place of the weight
      const int64_t n = Numel(leaf.shape);
      leaf.shape = {(n + 1) / 2, 1};
      leaf.dtype = DType::kUInt8;
      leaf.strides = {1, 1};
      leaf.values_per_element = 2;
      leaf.requires_grad = false;
    } else if (!torchao && q.prepare_for_kbit_training.value_or(true)) {
      leaf.requires_grad = false;
      if (leaf.dtype == DType::kFloat16 || leaf.dtype == DType::kBFloat16) leaf.dtype = DType::kFloat32;
    }
  }
  std::map<std::string, int, std::less<>> row_scales;  // an 8-bit module's SCB
  std::map<std::string, std::vector<int>, std::less<>> torchao_state;  // its scale, zero point
  auto emit = [&](int i, GraphBuilder& b, std::vector<int>& map) {
    const Op& op = dense.ops[i];
    if (op.kind == "scaled_dot_product_attention" && graph.autocast == DType::kFloat32) {
      return ReselectForFloat32(op, b, map, dense);
    }
    if (quantized.count(op.scope) == 0) return false;
    const LinearCall& call = calls[i];
    if (call.first < 0) return true;  // inside a call: its last op stands for it
    if (torchao) {
      map[op.outputs[0]] = EmitTorchaoLinear(b, q, map[call.input], map[call.weight],
                                             call.bias >= 0 ? map[call.bias] : -1,
                                             &torchao_state[op.scope]);
      return true;
    }
    if (int8) {
      const Shape& w = out_in[call.weight];
      auto [it, fresh] = row_scales.try_emplace(op.scope, -1);
      const int64_t n =
          q.int8_threshold > 0 ? std::min(q.int8_outlier_columns, w.back()) : int64_t{0};
      if (fresh) {  // the module's state: SCB, and the last call's outlier columns (state.idx)
        it->second = b.Buffer("SCB", {w.front()}, DType::kFloat32);
        if (n > 0) b.Buffer("state.idx", {n}, DType::kInt64);
      }
      const int y = EmitLinear8bit(b, map[call.input], map[call.weight], it->second,
                                   call.bias >= 0 ? map[call.bias] : -1, n, q.int8_threshold);
      map[op.outputs[0]] = y;
      return true;
    }
    // Linear4bit.forward: x.to(compute_dtype), matmul_4bit, .to(the input's dtype).
    const int64_t n = Numel(graph.tensors[call.weight].shape);
    for (const StateTensor& s : QuantStateTensors(n, q.double_quant)) {
      b.Buffer(std::string("weight.quant_state.") + s.name, {s.elements}, s.dtype);
    }
    int x = map[call.input];
    const DType input = b.tensor(x).dtype;
    if (input != q.compute_dtype) {
      x = b.Add1("to", {x}, {{"dtype", std::string(DTypeName(q.compute_dtype))}});
    }
    std::vector<int> inputs = {x, map[call.weight]};
    if (call.bias >= 0) inputs.push_back(map[call.bias]);
    const Shape& module_out = graph.tensors[op.outputs[0]].shape;
    const int64_t out = module_out.empty() ? 0 : module_out.back();
    int y = b.Add1("linear_4bit", std::move(inputs),
                   {{"out_features", out},
                    // QuantState.dtype: the dense weight's, before the packing
                    {"weight_dtype",
                     std::string(DTypeName(loaded.value_or(graph.tensors[call.weight].dtype)))},
                    {"double_quant", int64_t{q.double_quant ? 1 : 0}}});
    // The result is in the compute dtype, or autocast's (its F.linear autocasts inside
    // MatMul4Bit: the autocast pass tells the op, engine/passes/passes.h).
    if (b.ok() && b.tensor(y).dtype != input) {
      y = b.Add1("to", {y}, {{"dtype", std::string(DTypeName(input))}});
    }
    map[op.outputs[0]] = y;
    return true;
  };
  StatusOr<Graph> out = ReplayGraph(dense, emit, std::nullopt, nullptr, budget);
  if (!out.ok()) return out.status().Prefixed("config.quantization: ");
  return out;
}

namespace {

std::string Int8Note(const Graph& graph, const QuantizationConfig& q) {
  // Each module's CB (int8, a byte a value) and SCB (a float32 per row): leaves, within the
  // graph's leaf bytes; summed checked all the same.
  int64_t modules = 0, bytes = 0;
  std::set<int> seen;  // a module called twice reads the same weight
  for (const Op& op : graph.ops) {
    if (op.kind != "linear_8bit" || op.inputs.size() < 3 || !seen.insert(op.inputs[1]).second) {
      continue;
    }
    ++modules;
    const int64_t weight = Bytes(graph.tensors[op.inputs[1]].shape, DType::kInt8);
    const int64_t scales = Bytes(graph.tensors[op.inputs[2]].shape, DType::kFloat32);
    if (!AddBytes(&bytes, weight) || !AddBytes(&bytes, scales)) bytes = kMaxBytes;
  }
  char threshold[32];
  std::snprintf(threshold, sizeof threshold, "%g", q.int8_threshold);
  return "8-bit weights as bitsandbytes stores them (LLM.int8): " + std::to_string(modules) +
         " Linear modules, " + FormatBytes(bytes) +
         " (int8 [out, in] and a float32 scale per row); each call quantizes its input to int8 "
         "by row" +
         (q.int8_threshold > 0
              ? std::string(" and multiplies the columns holding a value of magnitude ") +
                    threshold + " or more in the input's dtype: " +
                    std::to_string(q.int8_outlier_columns) +
                    " such columns a layer taken (int8_outlier_columns; the LLM.int8 paper's "
                    "|O| <= 7 up to 13B parameters; they are data)"
              : std::string(" (threshold 0: no outlier columns)")) +
         "; in training MatMul8bitLt's node keeps its input (and those columns) until the graph "
         "is freed, which non-reentrant checkpointing does not change" +
         (q.prepare_for_kbit_training.value_or(true)
              ? "; prepare_model_for_kbit_training: every parameter frozen, the float16/bfloat16 "
                "ones that are not 8-bit in float32"
              : "");
}

}  // namespace

std::string QuantizationNote(const Graph& graph, const QuantizationConfig& q) {
  if (q.format == WeightFormat::kBnbInt8) return Int8Note(graph, q);
  if (IsTorchaoFormat(q.format)) return TorchaoNote(graph, q);
  // Each packed weight's value count, out * in of the linear_4bit ops that read it (bounded by
  // the rule's infer): its storage, [(n+1)/2, 1], cannot tell an odd n from n + 1.
  std::vector<int64_t> values_of(graph.tensors.size(), -1);
  for (const Op& op : graph.ops) {
    if (op.kind != "linear_4bit" || op.inputs.size() < 2 || op.outputs.empty()) continue;
    const Shape& x = graph.tensors[op.inputs[0]].shape;
    const Shape& y = graph.tensors[op.outputs[0]].shape;
    if (!x.empty() && !y.empty()) values_of[op.inputs[1]] = x.back() * y.back();
  }
  // The bytes are within the graph's leaf bytes (they are leaves), which stay within kMaxBytes;
  // summed checked all the same, saturating as the report's other sums do. The value count (two
  // per packed byte) may pass 2^62: it only divides, in floating point.
  int64_t modules = 0, bytes = 0;
  double values = 0;
  for (size_t i = 0; i < graph.tensors.size(); ++i) {
    const Tensor& t = graph.tensors[i];
    if (t.role != TensorRole::kParameter || t.values_per_element != 2) continue;
    ++modules;
    // A packed weight no op reads: two values per byte of its storage.
    const int64_t n = values_of[i] >= 0 ? values_of[i] : 2 * Numel(t.shape);
    if (!AddBytes(&bytes, Bnb4bitWeightBytes(n, q.double_quant))) bytes = kMaxBytes;
    values += static_cast<double>(n);
  }
  const double per_value = values > 0 ? static_cast<double>(bytes) / values : 0;
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.3f", per_value);
  return std::string("4-bit weights as bitsandbytes stores them (") +
         (q.format == WeightFormat::kBnbNf4 ? "NF4" : "FP4") +
         (q.double_quant ? ", double quantization" : "") + "): " + std::to_string(modules) +
         " Linear modules, " + FormatBytes(bytes) + " (" + ratio + " bytes per value), each "
         "dequantized to [out, in] around its matmul in forward and again in backward, compute "
         "in " + std::string(DTypeName(q.compute_dtype)) +
         (q.prepare_for_kbit_training.value_or(true)
              ? "; prepare_model_for_kbit_training: every parameter frozen, the float16/bfloat16 "
                "ones that are not 4-bit in float32"
              : "");
}

}  // namespace memest
