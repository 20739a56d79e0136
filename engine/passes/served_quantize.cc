#include "engine/passes/served_quantize.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "engine/ir/text.h"
#include "engine/passes/passes.h"
#include "engine/report/report.h"

namespace memest {
namespace {

// One pattern element: a literal character, any character ('.'), or any run ('.*').
struct Atom {
  enum Kind { kChar, kAny, kRun } kind;
  char c;
};

// compressed-tensors' "re:" entries in the subset memest reads (see the header); false: not in it.
bool ParsePattern(std::string_view p, std::vector<Atom>* atoms, bool* anchored_end) {
  if (!p.empty() && p.front() == '^') p.remove_prefix(1);
  *anchored_end = !p.empty() && p.back() == '$' && (p.size() < 2 || p[p.size() - 2] != '\\');
  if (*anchored_end) p.remove_suffix(1);
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 >= p.size() || p[i + 1] != '.') return false;
      atoms->push_back({Atom::kChar, '.'});
      ++i;
    } else if (c == '.') {
      const bool run = i + 1 < p.size() && p[i + 1] == '*';
      atoms->push_back({run ? Atom::kRun : Atom::kAny, 0});
      if (run) ++i;
    } else if (std::string_view("()[]{}+?|*^$").find(c) != std::string_view::npos) {
      return false;
    } else {
      atoms->push_back({Atom::kChar, c});
    }
  }
  if (!*anchored_end) atoms->push_back({Atom::kRun, 0});  // re.match: from the start only
  return true;
}

// Whether `atoms` match all of `s` (a table over positions: linear in their product).
bool Matches(const std::vector<Atom>& atoms, std::string_view s) {
  std::vector<char> can(s.size() + 1, 0), next(s.size() + 1, 0);
  can[0] = 1;
  for (const Atom& a : atoms) {
    std::fill(next.begin(), next.end(), 0);
    for (size_t j = 0; j <= s.size(); ++j) {
      if (a.kind == Atom::kRun) {
        next[j] = can[j] || (j > 0 && next[j - 1]);
      } else if (j > 0 && can[j - 1]) {
        next[j] = a.kind == Atom::kAny || s[j - 1] == a.c;
      }
    }
    can.swap(next);
  }
  return can[s.size()] != 0;
}

// transformers' and vLLM's name matching: the module's attribute name, its path, or a run of
// its path's components; or a "re:" pattern (validated by the caller).
bool SkipMatches(std::string_view module, const std::string& entry) {
  if (entry.rfind("re:", 0) == 0) {
    std::vector<Atom> atoms;
    bool end = false;
    return ParsePattern(std::string_view(entry).substr(3), &atoms, &end) && Matches(atoms, module);
  }
  const std::string_view last = module.substr(module.rfind('.') + 1);
  return entry == last || entry == module || module.find(entry + ".") != std::string_view::npos ||
         (module.size() > entry.size() &&
          module.compare(module.size() - entry.size(), entry.size(), entry) == 0 &&
          module[module.size() - entry.size() - 1] == '.');
}

bool IsLinear(const Op& op) { return op.kind == "linear" || op.kind == "megatron_linear"; }

constexpr int64_t kAllSparkCublasTokens = 1024;  // ALLSPARK_AMPERE_M_CUBLAS_THRESHOLD

// vLLM 0.19's kernels for a quantized linear.
enum class Kernel { kCutlass, kMachete, kAllSpark, kMarlin };

const char* KernelName(Kernel k) {
  switch (k) {
    case Kernel::kCutlass: return "cutlass";
    case Kernel::kMachete: return "machete";
    case Kernel::kAllSpark: return "allspark";
    case Kernel::kMarlin: return "marlin";
  }
  return "?";
}

// What one quantized linear of the rank becomes.
struct Plan {
  bool quantize = false;
  int64_t in = 0, out = 0;
  int64_t full_in = 0;  // the whole layer's input features (a row-parallel shard's t times)
  bool row_parallel = false;
  Kernel kernel = Kernel::kCutlass;
  // Latent attention's kv_b_proj: MLAAttention.process_weights_after_loading keeps it dequantized
  // to the model's dtype besides (W_UK_T and W_UV, views of one [out, in] copy).
  bool dequantized_copy = false;
};

std::string Shard(const std::string& module, int64_t out, int64_t in) {
  return Quote(module) + " ([" + std::to_string(out) + ", " + std::to_string(in) + "] on this rank)";
}

// Marlin's limits (marlin_utils.py: check_marlin_supports_shape, MARLIN_SUPPORTED_GROUP_SIZES,
// query_marlin_supported_quant_types: zero points with 4 bits only).
bool MarlinTakes(const Plan& p, int64_t group, int bits, bool zero_point, int capability) {
  return capability >= 75 && (group == -1 || group == 32 || group == 64 || group == 128) &&
         p.out % 64 == 0 && p.in % 128 == 0 && (!zero_point || bits == 4);
}

// vLLM 0.19's weight-only kernel for the shard (choose_mp_linear_kernel's order: Machete,
// AllSpark, Marlin), or why none takes it.
StatusOr<Kernel> WeightOnlyKernel(const QuantizationConfig& q, const DeviceInfo& d, int bits,
                                  const std::string& module, const Plan& p) {
  const int64_t g = q.group_size;
  const int cap = d.compute_capability;
  if (g != -1 && p.in % g != 0) {
    return InvalidArgument("config.quantization.group_size: " + std::to_string(g) +
                           " does not divide the input features of " + Shard(module, p.out, p.in) +
                           ", which vLLM refuses");
  }
  if (cap == 90 && (g == -1 || g == 64 || g == 128) && p.in % 64 == 0 && p.out % 128 == 0 &&
      !(q.act_order && p.row_parallel)) {
    return Kernel::kMachete;
  }
  if (cap >= 80 && cap < 90 && bits == 8 && g == -1 && !q.zero_point && !q.act_order &&
      p.in % 16 == 0 && p.out % 8 == 0) {
    return Kernel::kAllSpark;  // allspark_utils.py: Ampere, per channel, uint8b128
  }
  if (MarlinTakes(p, g, bits, q.zero_point, cap)) return Kernel::kMarlin;
  return InvalidArgument("config.quantization: no vLLM kernel takes " + Shard(module, p.out, p.in) +
                         " (" + std::to_string(bits) + "-bit" +
                         (q.zero_point ? ", zero points" : "") + ", group_size " +
                         std::to_string(g) + ") on sm_" + std::to_string(cap) +
                         " (Marlin: sm_75 or later, group size -1, 32, 64 or 128, output features "
                         "a multiple of 64, input features of 128, zero points with 4 bits only)");
}

// The rank's buffers beside a quantized weight (see the header), added to `b` in the op's scope.
void AddState(const QuantizationConfig& q, const Plan& p, DType dtype, int bits,
              int multiprocessors, GraphBuilder& b) {
  auto add = [&](const char* name, Shape shape, DType t) { b.Buffer(name, std::move(shape), t); };
  if (p.kernel == Kernel::kCutlass) {
    // CutlassInt8ScaledMMLinearKernel makes a fused module's per-tensor scales one per channel
    // (convert_to_channelwise); fp8 keeps one (requantize_with_max_scale).
    const bool channel = q.weight_scales == ScaleGranularity::kChannel ||
                         (q.weight_scales == ScaleGranularity::kTensor &&
                          q.format == WeightFormat::kW8A8Int8);
    if (channel) add("weight_scale", {p.out, 1}, DType::kFloat32);
    if (!channel && q.weight_scales == ScaleGranularity::kTensor) add("weight_scale", {1}, DType::kFloat32);
    if (q.weight_scales == ScaleGranularity::kBlock) {
      add("weight_scale_inv", {CeilDiv(p.out, q.block_n), CeilDiv(p.in, q.block_k)},
          DType::kFloat32);
    }
    if (q.inputs == InputQuantization::kStatic) {
      add("input_scale", {1}, DType::kFloat32);
      if (q.asymmetric_inputs) add("input_zero_point", {1}, DType::kInt32);
    }
    if (q.asymmetric_inputs) add("azp_adj", {p.out}, DType::kInt32);
    return;
  }
  if (p.kernel == Kernel::kAllSpark) {  // uint8 [ceil32(out), in]: the rows past out
    if (p.out % 32 != 0) add("weight_pad", {(32 - p.out % 32) * p.in}, DType::kUInt8);
    add("scales", {1, p.out}, dtype);
    return;
  }
  // marlin_repeat_scales_on_all_ranks: with act-order a row-parallel shard keeps the whole
  // layer's groups.
  const int64_t width = q.act_order && p.row_parallel ? p.full_in : p.in;
  const int64_t groups = q.group_size == -1 ? 1 : width / q.group_size;
  const int64_t pack = 32 / bits;
  if (q.format == WeightFormat::kW8A8Fp8) {  // fp8 through Marlin: scales per channel
    const int64_t rows =
        q.weight_scales == ScaleGranularity::kBlock ? CeilDiv(p.in, q.block_k) : 1;
    add("weight_scale", {rows, p.out}, dtype);
  } else {
    add("scales", {groups, p.out}, dtype);
  }
  const bool machete = p.kernel == Kernel::kMachete;
  if (q.zero_point) {
    if (machete) {
      add("qzeros", {groups, p.out}, dtype);
    } else {
      add("qzeros", {groups, p.out / pack}, DType::kInt32);
    }
  } else if (q.gptq_layout && machete) {
    add("qzeros", {groups, p.out / pack}, DType::kInt32);  // loaded, left as it was
  }
  if (q.act_order) {
    add("g_idx", {p.in}, DType::kInt32);
    add("g_idx_sort_indices", {p.in}, DType::kInt32);
  } else if (q.gptq_layout && machete) {
    add("g_idx", {p.in}, DType::kInt32);
  }
  if (p.kernel == Kernel::kMarlin) add("workspace", {multiprocessors}, DType::kInt32);
}

}  // namespace

bool ReadableSkipEntry(const std::string& entry) {
  std::vector<Atom> atoms;
  bool end = false;
  return entry.rfind("re:", 0) != 0 || ParsePattern(std::string_view(entry).substr(3), &atoms, &end);
}

StatusOr<Graph> ApplyServedQuantization(const Graph& rank, const QuantizationConfig& q,
                                        const DeviceInfo& device, Budget* budget) {
  const bool w8a8 = q.format == WeightFormat::kW8A8Fp8 || q.format == WeightFormat::kW8A8Int8;
  const int cap = device.compute_capability;
  if (cap < 75) {  // every method's get_min_capability (Fp8Config's too: Marlin on sm_75)
    return InvalidArgument(std::string("config.quantization.format: vLLM runs ") +
                           WeightFormatName(q.format) + " on sm_75 and later; " + device.name +
                           " is sm_" + std::to_string(cap));
  }
  for (size_t k = 0; k < q.skip_modules.size(); ++k) {
    if (!ReadableSkipEntry(q.skip_modules[k])) {
      return InvalidArgument("config.quantization.skip_modules[" + std::to_string(k) + "]: " +
                             Quote(q.skip_modules[k]) + " is a pattern memest does not read "
                             "(literal text, '.', '.*', '\\.' and a final '$')");
    }
  }
  // The linears with a weight of their own; the output layer is the last.
  std::vector<int> readers(rank.tensors.size(), 0);
  for (const Op& op : rank.ops) {
    for (int t : op.inputs) ++readers[t];
  }
  std::string output_layer;
  for (const Op& op : rank.ops) {
    if (IsLinear(op)) output_layer = op.scope;
  }
  std::vector<Plan> plans(rank.ops.size());
  std::vector<bool> matched(q.skip_modules.size(), false);
  const bool latent = std::any_of(rank.ops.begin(), rank.ops.end(), [](const Op& op) {
    return op.kind == "mla_profile_attention";
  });
  Graph packed = rank;
  const int bits = q.format == WeightFormat::kW4A16 ? 4 : 8;
  bool any = false;
  for (size_t i = 0; i < rank.ops.size(); ++i) {
    const Op& op = rank.ops[i];
    if (!IsLinear(op) || op.inputs.size() < 2) continue;
    bool skip = op.scope == output_layer;
    const std::string_view last = std::string_view(op.scope).substr(op.scope.rfind('.') + 1);
    skip = skip || last == "gate" || last == "shared_expert_gate";
    for (size_t k = 0; k < q.skip_modules.size(); ++k) {
      if (SkipMatches(op.scope, q.skip_modules[k])) matched[k] = true, skip = true;
    }
    const int w = op.inputs[1];
    const Tensor& weight = rank.tensors[w];
    if (skip || weight.role != TensorRole::kParameter || weight.shape.size() != 2 ||
        readers[w] != 1) {
      continue;
    }
    Plan& p = plans[i];
    p.quantize = true;
    p.dequantized_copy = latent && last == "kv_b_proj";
    p.out = weight.shape[0];
    p.in = weight.shape[1];
    p.row_parallel = op.kind == "megatron_linear" && op.attrs.count("input_grad") == 0;
    StatusOr<int64_t> ranks = IntAttr(op.attrs, "tp", 1, "");
    p.full_in = p.row_parallel && ranks.ok() ? p.in * *ranks : p.in;
    if (w8a8 && (q.format == WeightFormat::kW8A8Int8 || cap >= 89)) {
      p.kernel = Kernel::kCutlass;
    } else if (w8a8) {
      // fp8 weight-only through Marlin (prepare_fp8_layer_for_marlin): its shapes, and the
      // weight block as its group.
      const int64_t group = q.weight_scales == ScaleGranularity::kBlock ? q.block_k : -1;
      if (!MarlinTakes(p, group, 8, false, cap)) {
        return InvalidArgument("config.quantization: no vLLM kernel takes " +
                               Shard(op.scope, p.out, p.in) + " in fp8 on sm_" +
                               std::to_string(cap) + " (weight-only through Marlin: output "
                               "features a multiple of 64, input features of 128, a weight "
                               "block of 32, 64 or 128 inputs)");
      }
      p.kernel = Kernel::kMarlin;
    } else {
      MEMEST_ASSIGN_OR_RETURN(p.kernel, WeightOnlyKernel(q, device, bits, op.scope, p));
    }
    if (p.kernel != Kernel::kCutlass && p.in % (32 / bits) != 0) {
      return InvalidArgument("config.quantization.format: " + Shard(op.scope, p.out, p.in) +
                             " has input features that do not pack " +
                             std::to_string(32 / bits) + " to an int32");
    }
    Tensor& leaf = packed.tensors[w];
    leaf.requires_grad = false;
    if (p.kernel == Kernel::kCutlass) {
      leaf.dtype = q.format == WeightFormat::kW8A8Int8 ? DType::kInt8 : DType::kUInt8;
    } else {
      leaf.shape = {p.in / (32 / bits), p.out};
      leaf.dtype = DType::kInt32;
      leaf.strides = {p.out, 1};
    }
    any = true;
  }
  for (size_t k = 0; k < matched.size(); ++k) {
    // A pattern may match nothing (compressed-tensors' ignore lists are written for families).
    if (!matched[k] && q.skip_modules[k].rfind("re:", 0) != 0) {
      return InvalidArgument("config.quantization.skip_modules[" + std::to_string(k) + "]: " +
                             Quote(q.skip_modules[k]) + " matches no linear of the model");
    }
  }
  if (!any) {
    return InvalidArgument("config.quantization: the model has no linear to quantize beside the "
                           "output layer, the routers and the skipped modules");
  }
  // AllSpark's global workspace (csrc/quantization/gptq_allspark/allspark_qgemm_w8a16.cu,
  // as_g_workspace): past ALLSPARK_AMPERE_M_CUBLAS_THRESHOLD tokens it dequantizes the weight
  // into k x n halves for cuBLAS, vLLM's merged layer (the linears reading one input: q/k/v,
  // gate/up) at once; the buffer only grows and is kept.
  int64_t allspark_workspace = 0;
  int first_allspark = -1;
  {
    std::vector<int64_t> merged_out(rank.tensors.size(), 0);
    for (size_t i = 0; i < rank.ops.size(); ++i) {
      const Plan& p = plans[i];
      if (!p.quantize || p.kernel != Kernel::kAllSpark) continue;
      if (first_allspark < 0) first_allspark = static_cast<int>(i);
      const Tensor& x = rank.tensors[rank.ops[i].inputs[0]];
      if (Numel(x.shape) / std::max<int64_t>(p.in, 1) <= kAllSparkCublasTokens) continue;
      int64_t& n = merged_out[rank.ops[i].inputs[0]];
      n += p.out;  // within the rank's weights' values: no overflow
      allspark_workspace = std::max(allspark_workspace, 2 * p.in * n);
    }
  }
  const char* input_type = q.format == WeightFormat::kW8A8Int8 ? "int8" : "fp8";
  const char* inputs = q.inputs == InputQuantization::kDynamicToken    ? "token"
                       : q.inputs == InputQuantization::kDynamicTensor ? "tensor"
                                                                       : "static";
  int workspace = -1;
  auto replace = [&](int i, GraphBuilder& b, std::vector<int>& map) {
    const Plan& p = plans[i];
    if (!p.quantize) return false;
    const Op& op = packed.ops[i];
    const int x = map[op.inputs[0]];
    if (i == first_allspark && allspark_workspace > 0) {
      workspace = b.Add1("full", {}, {{"shape", std::vector<int64_t>{allspark_workspace}},
                                      {"dtype", std::string("uint8")}});
    }
    AddState(q, p, b.tensor(x).dtype, bits, device.multiprocessors, b);
    if (p.dequantized_copy) b.Buffer("W_UK_T_W_UV", {p.out, p.in}, b.tensor(x).dtype);
    std::vector<int> in{x, map[op.inputs[1]]};
    if (op.inputs.size() > 2) in.push_back(map[op.inputs[2]]);
    Attrs attrs{{"out_features", p.out}};
    std::string kind = "wna16_linear";
    if (p.kernel == Kernel::kCutlass) {
      kind = "w8a8_linear";
      attrs["input_type"] = std::string(input_type);
      attrs["inputs"] = std::string(inputs);
      attrs["asymmetric"] = int64_t{q.asymmetric_inputs ? 1 : 0};
      if (q.weight_scales == ScaleGranularity::kBlock) attrs["block_k"] = q.block_k;
    } else {
      attrs["bits"] = int64_t{bits};
      attrs["kernel"] = std::string(KernelName(p.kernel));
      attrs["act_order"] = int64_t{q.act_order ? 1 : 0};
      attrs["multiprocessors"] = int64_t{std::max(device.multiprocessors, 1)};
    }
    map[op.outputs[0]] = b.Add1(kind, std::move(in), std::move(attrs));
    return true;
  };
  StatusOr<Graph> out = ReplayGraph(packed, replace, std::nullopt, nullptr, budget);
  if (!out.ok()) return out.status().Prefixed("config.quantization: ");
  if (workspace >= 0 && !out->ops.empty()) {
    out->held.push_back({workspace, static_cast<int>(out->ops.size()) - 1});
  }
  return out;
}

std::string ServedQuantizationNote(const Graph& graph, const QuantizationConfig& q) {
  int64_t linears = 0, bytes = 0;
  std::vector<std::string> kernels;
  for (const Op& op : graph.ops) {
    if (op.kind != "w8a8_linear" && op.kind != "wna16_linear") continue;
    ++linears;
    if (!AddBytes(&bytes, Bytes(graph.tensors[op.inputs[1]].shape, graph.tensors[op.inputs[1]].dtype))) {
      bytes = kMaxBytes;
    }
    StatusOr<std::string> k = StringAttr(op.attrs, "kernel", "cutlass", "");
    const std::string name = k.ok() ? *k : "cutlass";
    if (std::find(kernels.begin(), kernels.end(), name) == kernels.end()) kernels.push_back(name);
  }
  std::string used;
  for (const std::string& k : kernels) used += (used.empty() ? "" : ", ") + k;
  return std::string("quantized weights as vLLM serves them (") + WeightFormatName(q.format) +
         "): " + std::to_string(linears) + " linears on this rank, " + FormatBytes(bytes) +
         " of packed weights beside their scales, through vLLM's " + used +
         " kernels; the output layer and the routers stay in the model's dtype";
}

}  // namespace memest
