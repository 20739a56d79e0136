#include "engine/passes/quantize_torchao.h"

#include <set>

#include "engine/report/report.h"

namespace memest {

void PackTorchaoWeight(const QuantizationConfig& q, const Shape& out_in, Tensor* leaf) {
  const bool int4 = q.format == WeightFormat::kTorchaoInt4;
  leaf->shape = {out_in[0], int4 ? (out_in[1] + 1) / 2 : out_in[1]};
  leaf->strides = ContiguousStrides(leaf->shape);
  leaf->dtype = DType::kInt8;
  leaf->values_per_element = int4 ? 2 : 1;
  leaf->requires_grad = false;
}

int EmitTorchaoLinear(GraphBuilder& b, const QuantizationConfig& q, int x, int weight, int bias,
                      std::vector<int>* state) {
  if (!b.ok()) return -1;
  const int64_t out = b.shape(weight).front();
  const int64_t in = b.shape(x).back();
  if (q.format == WeightFormat::kTorchaoInt4) {
    if (state->empty()) {
      const DType dtype = b.tensor(x).dtype;  // the weight's, which the builders share
      *state = {b.Buffer("weight.scale", {in / q.group_size, out}, dtype),
                b.Buffer("weight.zero_point", {in / q.group_size, out}, dtype)};
    }
    const int y = b.Add1("torchao_int4_mm", {x, weight, (*state)[0], (*state)[1]},
                         {{"group_size", q.group_size}});
    return bias < 0 ? y : b.Add1("add", {y, bias});  // `res + bias`
  }
  if (state->empty()) {
    *state = {b.Buffer("weight.scale", {out, 1}, DType::kFloat32),
              b.Buffer("weight.zero_point", {out, 1}, DType::kInt8)};
  }
  const int m = b.Add1("torchao_int8_mm", {x, weight});
  return b.Add1("torchao_int8_scale", {m, (*state)[0]});  // the bias is added in place
}

std::string TorchaoNote(const Graph& graph, const QuantizationConfig& q) {
  const bool int4 = q.format == WeightFormat::kTorchaoInt4;
  int64_t modules = 0, bytes = 0;
  std::set<int> seen;
  for (const Op& op : graph.ops) {
    if ((op.kind != "torchao_int4_mm" && op.kind != "torchao_int8_mm") ||
        !seen.insert(op.inputs[1]).second) {
      continue;
    }
    ++modules;
    for (size_t k = 1; k < op.inputs.size(); ++k) {  // qdata, and int4's scale and zero point
      const Tensor& t = graph.tensors[op.inputs[k]];
      if (!AddBytes(&bytes, Bytes(t.shape, t.dtype))) bytes = kMaxBytes;
    }
  }
  if (!int4) {  // int8's scale and zero point, read by the scaling op
    for (const Op& op : graph.ops) {
      if (op.kind != "torchao_int8_scale" || !seen.insert(op.inputs[1]).second) continue;
      const Tensor& scale = graph.tensors[op.inputs[1]];
      if (!AddBytes(&bytes, 5 * Numel(scale.shape))) bytes = kMaxBytes;
    }
  }
  return std::string("weights as torchao quantizes them for transformers (") +
         (int4 ? "Int4WeightOnlyConfig, group_size " + std::to_string(q.group_size) +
                     ", plain packing: two values a byte, a scale and a zero point per group"
               : std::string("Int8WeightOnlyConfig, per row: a byte a value, a float32 scale "
                             "per row")) +
         "): " + std::to_string(modules) + " nn.Linear modules, " + FormatBytes(bytes) +
         (int4 ? "; each call runs mslk's bf16i4bf16_rowwise, no dequantized weight"
               : "; each call casts the whole weight to the input's dtype for torch.mm (eager; "
                 "torch.compile fuses it)");
}

}  // namespace memest
