// bitsandbytes' 4-bit weights (engine/passes/quantize.h) and LoRA over them: the storage to the
// byte, the dequantized weight around each use, PEFT's float32 upcast of what is not 4-bit, and
// the requests refused. The facts are read from bitsandbytes, transformers and PEFT (docs/qlora.md).
#include "engine/passes/quantize.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "engine/estimator.h"
#include "engine/rules/op_rules.h"

namespace memest {
namespace {

ModelSpec Llama(int64_t layers, int64_t seq = 256) {
  return ModelSpec{PresetSpec{"llama-7b", {{"seq", seq}, {"layers", layers}}}};
}

RunConfig Qlora(Precision precision = Precision::kBf16Pure) {
  RunConfig c;
  c.batch_size = 1;
  c.precision = precision;
  c.quantization.format = WeightFormat::kBnbNf4;
  c.quantization.double_quant = true;
  c.quantization.compute_dtype = DType::kBFloat16;
  c.lora.rank = 16;
  c.lora.target_modules = {"all-linear"};
  return c;
}

const Tensor* Named(const Graph& g, const std::string& name) {
  for (const Tensor& t : g.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

int64_t BytesNamedWithin(const Graph& g, const std::string& prefix) {
  int64_t bytes = 0;
  for (const Tensor& t : g.tensors) {
    if (t.producer < 0 && t.name.rfind(prefix, 0) == 0) bytes += Bytes(t.shape, t.dtype);
  }
  return bytes;
}

// quantize_4bit with blocksize 64: n/2 packed bytes and a float32 absmax per block, or with
// double quantization a uint8 absmax per block, a float32 absmax per 256 blocks, a float32
// offset and the 256-value float32 map; and the 16-value float32 code.
TEST(QloraTest, StorageIsBitsandbytesToTheByte) {
  const int64_t n = 4096 * 4096;
  EXPECT_EQ(Bnb4bitWeightBytes(n, false), n / 2 + 4 * (n / 64) + 64);
  EXPECT_EQ(Bnb4bitWeightBytes(n, true), n / 2 + n / 64 + 4 * (n / 64 / 256) + 4 + 1024 + 64);
  EXPECT_EQ(Bnb4bitWeightBytes(n, true), 8'655'940);

  StatusOr<Graph> g = BuildStepGraph(Llama(1), Qlora());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(BytesNamedWithin(*g, "model.layers.0.self_attn.q_proj.weight"), 8'655'940);
  const Tensor* packed = Named(*g, "model.layers.0.self_attn.q_proj.weight");
  ASSERT_NE(packed, nullptr);
  EXPECT_EQ(packed->dtype, DType::kUInt8);
  EXPECT_FALSE(packed->requires_grad);
  // The count is the model's: two values per packed byte. The output layer stays dense.
  StatusOr<Graph> dense = BuildStepGraph(Llama(1), RunConfig{});
  ASSERT_TRUE(dense.ok());
  RunConfig no_lora = Qlora();
  no_lora.lora = {};
  no_lora.mode = Mode::kInference;
  StatusOr<Graph> quantized = BuildStepGraph(Llama(1), no_lora);
  ASSERT_TRUE(quantized.ok());
  EXPECT_EQ(quantized->ParameterCount(), dense->ParameterCount());
  EXPECT_EQ(Named(*quantized, "lm_head.weight")->shape, (Shape{32000, 4096}));
}

// The report's note counts the values of each weight exactly: a [5, 3] weight has 15, stored in
// 8 packed bytes, 4 of absmax (one block) and the 64-byte code, 76 bytes: 5.067 per value (its
// storage alone would say 16 values, 4.750).
TEST(QloraTest, NoteCountsAnOddWeightsValuesExactly) {
  LayerModelSpec spec;
  spec.input_shape = {3};
  spec.layers = {{"linear", "odd", {{"out_features", int64_t{5}}}},
                 {"linear", "head", {{"out_features", int64_t{2}}}}};
  RunConfig c;
  c.batch_size = 1;
  c.mode = Mode::kInference;
  c.quantization.format = WeightFormat::kBnbNf4;
  c.quantization.compute_dtype = DType::kFloat32;
  EXPECT_EQ(Bnb4bitWeightBytes(15, false), 8 + 4 + 64);
  StatusOr<Report> r = Estimate(ModelSpec{spec}, c, {.advice = false});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  bool found = false;
  for (const std::string& n : r->notes) {
    if (n.find("4-bit weights") == std::string::npos) continue;
    found = true;
    EXPECT_NE(n.find("1 Linear modules, 76 B (5.067 bytes per value)"), std::string::npos) << n;
  }
  EXPECT_TRUE(found);
}

// The dequantized weight exists while the op runs, in forward and again in backward; nothing
// of the input is saved for the frozen weight.
TEST(QloraTest, EachLinearDequantizesItsWeightAroundTheOp) {
  StatusOr<Report> r = Estimate(Llama(2), Qlora(), {.advice = false});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  bool found = false;
  for (const LayerRow& row : r->layers) {
    if (row.scope != "model.layers.1.mlp.down_proj") continue;
    found = true;
    // [4096, 11008] in bf16, and the float32 absmax rebuilt from its 8-bit form.
    EXPECT_GE(row.temporary_bytes, 4096 * 11008 * 2 + 4 * (4096 * 11008 / 64));
    EXPECT_EQ(row.saved_bytes, 0);
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(r->trainable_parameter_count, 2 * 16 * (4 * (4096 + 4096) + 3 * (4096 + 11008)));
}

// bitsandbytes' MatMul4Bit has no custom_fwd: under torch.autocast its F.linear casts. With a
// float32 compute dtype (--bnb-compute-dtype float32) in a bf16 autocast run, the input and the
// dequantized weight get bfloat16 copies while linear runs, its result is bfloat16 and
// Linear4bit casts it back; backward dequantizes to bfloat16 for the bfloat16 grad_output and
// makes grad_input in bfloat16 before autograd casts it to float32. For down_proj, n = 4096 x
// 11008 weight values and M = 64 tokens of 11008 inputs, on top of the float32 absmax and the
// float32 dequantized weight (the weights load in float32 under bf16 autocast, as in fp32):
//   forward  + 2n (weight, bf16) + 2 * 64 * 11008 (x, bf16)
//   backward + 2n (weight cast to bf16) + 2 * 64 * 11008 (grad_input, bf16)
// = 90,177,536 + 1,409,024 = 91,586,560 bytes more in either.
TEST(QloraTest, AutocastCastsInsideMatMul4BitWhenTheComputeDtypeIsFloat32) {
  auto down_proj_temps = [](Precision precision) -> int64_t {
    RunConfig c = Qlora(precision);
    c.quantization.compute_dtype = DType::kFloat32;
    StatusOr<Report> r = Estimate(Llama(1, 64), c, {.advice = false});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return -1;
    for (const LayerRow& row : r->layers) {
      if (row.scope == "model.layers.0.mlp.down_proj") return row.temporary_bytes;
    }
    return -1;
  };
  const int64_t plain = down_proj_temps(Precision::kFp32);
  const int64_t autocast = down_proj_temps(Precision::kBf16Amp);
  // float32 absmax [4096 * 11008 / 64] and the float32 dequantized weight.
  EXPECT_EQ(plain, 2'818'048 + 180'355'072);
  EXPECT_EQ(autocast - plain, 91'586'560);

  RunConfig c = Qlora(Precision::kBf16Amp);
  c.quantization.compute_dtype = DType::kFloat32;
  StatusOr<Graph> g = BuildStepGraph(Llama(1, 64), c);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  int calls = 0;
  for (const Op& op : g->ops) {
    if (op.kind != "linear_4bit" || op.scope != "model.layers.0.mlp.down_proj") continue;
    ++calls;
    EXPECT_EQ(g->tensors[op.inputs[0]].dtype, DType::kFloat32);
    const Tensor& y = g->tensors[op.outputs[0]];
    EXPECT_EQ(y.dtype, DType::kBFloat16);
    // Linear4bit.forward's .to(inp_dtype) reads it.
    bool cast_back = false;
    for (const Op& next : g->ops) {
      cast_back |= next.kind == "to" && next.inputs[0] == op.outputs[0] &&
                   g->tensors[next.outputs[0]].dtype == DType::kFloat32;
    }
    EXPECT_TRUE(cast_back);
  }
  EXPECT_EQ(calls, 1);
  // The op alone, [4, 6] -> 5 with a bias, weight float32 (n = 30), under bf16 autocast and
  // without: forward the float32 dequantized weight (120 B), then autocast's bfloat16 x (48),
  // weight (60) and bias (10); backward the float32 dequantized weight (120), its bfloat16 cast
  // (60) and the bfloat16 grad_input (48).
  auto memory = [](bool autocast) {
    GraphBuilder b;
    if (autocast) b.EnableAutocast(DType::kBFloat16);
    const int x = b.Add1("mul", {b.Parameter("x", {4, 6}, DType::kFloat32)}, {{"scalar", 1.0}});
    const int w = b.Buffer("w", {15, 1}, DType::kUInt8);
    const int bias = b.Buffer("b", {5}, DType::kFloat32);
    const int y = b.Add1("linear_4bit", {x, w, bias},
                         {{"out_features", int64_t{5}}, {"weight_dtype", std::string("float32")}});
    b.BeginLoss();
    b.SetLoss(b.Add1("sum", {y}));
    StatusOr<Graph> built = b.Finish();
    EXPECT_TRUE(built.ok()) << built.status().ToString();
    const Graph& g = *built;
    const Op& op = g.ops[1];
    EXPECT_EQ(g.tensors[op.outputs[0]].dtype, autocast ? DType::kBFloat16 : DType::kFloat32);
    OpCall call{op, {}, {&g.tensors[op.outputs[0]]}, "", true};
    for (int t : op.inputs) call.inputs.push_back(&g.tensors[t]);
    const OpMemory m = OpMemoryOf(call);
    int64_t forward = 0, backward = 0;
    for (const Alloc& a : m.forward_temps) forward += a.bytes;
    for (const Alloc& a : m.backward_temps) backward += a.bytes;
    return std::pair<int64_t, int64_t>{forward, backward};
  };
  EXPECT_EQ(memory(false), (std::pair<int64_t, int64_t>{120, 120}));
  EXPECT_EQ(memory(true), (std::pair<int64_t, int64_t>{120 + 48 + 60 + 10, 120 + 60 + 48}));
  // A bfloat16 compute dtype under bf16 autocast: nothing for autocast to cast.
  StatusOr<Report> bf16 = Estimate(Llama(1, 64), Qlora(Precision::kBf16Amp), {.advice = false});
  ASSERT_TRUE(bf16.ok());
  for (const LayerRow& row : bf16->layers) {
    if (row.scope != "model.layers.0.mlp.down_proj") continue;
    // absmax, the float32 dequantized weight and its bfloat16 copy (the compute dtype's).
    EXPECT_EQ(row.temporary_bytes, 2'818'048 + 180'355'072 + 90'177'536);
  }
}

// prepare_model_for_kbit_training casts what is not 4-bit to float32 (the embeddings, norms and
// the lm_head), and the activations follow: attention then runs in float32, which flash cannot.
TEST(QloraTest, KbitPreparationUpcastsWhatIsNot4bit) {
  StatusOr<Graph> prepared = BuildStepGraph(Llama(1), Qlora());
  ASSERT_TRUE(prepared.ok());
  EXPECT_EQ(Named(*prepared, "model.embed_tokens.weight")->dtype, DType::kFloat32);
  EXPECT_EQ(Named(*prepared, "lm_head.weight")->dtype, DType::kFloat32);
  StatusOr<Report> r = Estimate(Llama(1), Qlora(), {.advice = false});
  ASSERT_TRUE(r.ok());
  bool efficient = false;
  for (const std::string& n : r->notes) efficient |= n.find("1 efficient") != std::string::npos;
  EXPECT_TRUE(efficient);

  RunConfig kept = Qlora();
  kept.quantization.prepare_for_kbit_training = false;
  StatusOr<Graph> as_loaded = BuildStepGraph(Llama(1), kept);
  ASSERT_TRUE(as_loaded.ok());
  EXPECT_EQ(Named(*as_loaded, "model.embed_tokens.weight")->dtype, DType::kBFloat16);
}

// After the upcast the hidden states are float32, so what the model makes in their dtype is
// float32 too: the attention probabilities' `.to(query.dtype)`, a MoE block's zeros and its
// routing weights (which index_add_ needs in one dtype with the experts' outputs). The 4-bit
// weights keep the dtype they were loaded in (QuantState.dtype).
TEST(QloraTest, KbitPreparationLeavesTheActivationsInFloat32) {
  StatusOr<Graph> g = BuildStepGraph(Llama(1), Qlora());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  for (const Op& op : g->ops) {
    if (op.kind == "softmax") {
      EXPECT_EQ(g->tensors[op.outputs[0]].dtype, DType::kFloat32) << op.scope;
    }
    if (op.kind == "linear_4bit") {
      EXPECT_EQ(StringAttr(op.attrs, "weight_dtype", "", "").value(), "bfloat16");
      EXPECT_EQ(g->tensors[op.inputs[0]].dtype, DType::kBFloat16);  // x.to(compute_dtype)
    }
  }
  JsonValue mixtral;
  mixtral.kind = JsonValue::Kind::kObject;
  auto set = [&](const char* key, double v) {
    JsonValue n;
    n.kind = JsonValue::Kind::kNumber;
    n.number = v;
    mixtral.keys.push_back(key);
    mixtral.items.push_back(n);
  };
  JsonValue type;
  type.kind = JsonValue::Kind::kString;
  type.text = "mixtral";
  mixtral.keys.push_back("model_type");
  mixtral.items.push_back(type);
  set("hidden_size", 64);
  set("num_hidden_layers", 2);
  set("num_attention_heads", 4);
  set("num_key_value_heads", 2);
  set("intermediate_size", 96);
  set("vocab_size", 512);
  set("num_local_experts", 4);
  StatusOr<Report> r = Estimate(ModelSpec{HfConfigSpec{mixtral, 64}}, Qlora(), {.advice = false});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(r->trainable_parameter_count, 0);
}

// PEFT's LoRA over a Linear4bit clones the base's result (peft/tuners/lora/bnb.py).
TEST(QloraTest, LoraOverA4bitBaseClonesItsResult) {
  StatusOr<Graph> g = BuildStepGraph(Llama(1), Qlora());
  ASSERT_TRUE(g.ok());
  int clones = 0;
  for (const Op& op : g->ops) {
    clones += op.kind == "clone" && op.scope == "model.layers.0.self_attn.q_proj";
  }
  EXPECT_EQ(clones, 1);
  EXPECT_EQ(Named(*g, "model.layers.0.self_attn.q_proj.lora_A.default.weight")->dtype,
            DType::kFloat32);
  // DoRA over the 4-bit base (its weight dequantized in every call) is refused, naming it.
  RunConfig dora = Qlora();
  dora.lora.use_dora = true;
  StatusOr<Graph> refused = BuildStepGraph(Llama(1), dora);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message().rfind("config.lora.use_dora: DoRA is modelled on", 0),
            0u)
      << refused.status().message();
}

// bitsandbytes' optimizers on a small float32 model, 256 -> 16 -> 250 -> 400 Linears, every
// parameter trainable. Optimizer8bit.init_state (bitsandbytes/optim/optimizer.py, 0.44+): a
// parameter of n >= min_8bit_size = 4096 elements gets uint8 state1 and state2 [n] and float32
// absmax1 and absmax2 [ceil(n / 256)]; a smaller one float32 state1 and state2 [n]; the 32-bit
// kind float32 for all. Each tensor is rounded up to 512 bytes by the caching allocator, r().
//   parameter       n   8-bit kinds                                  32-bit kind
//   a.weight     4096   2 r(4096) + 2 r(4 * 16)   =   8192 + 1024 =   9216   2 r(16384)  =  32768
//   a.bias         16   2 r(64)     (float32, < 4096)             =   1024   2 r(64)     =   1024
//   b.weight     4000   2 r(16000)  (float32, < 4096)             =  32768   2 r(16000)  =  32768
//   b.bias        250   2 r(1000)                                 =   2048   2 r(1000)   =   2048
//   c.weight   100000   2 r(100000) + 2 r(4 * 391) = 200704 + 4096 = 204800   2 r(400000) = 800768
//   c.bias        400   2 r(1600)                                 =   4096   2 r(1600)   =   4096
//   total                                                           253952                 873472
ModelSpec ThreeLinears() {
  LayerModelSpec spec;
  spec.input_shape = {256};
  spec.layers = {{"linear", "a", {{"out_features", int64_t{16}}}},
                 {"linear", "b", {{"out_features", int64_t{250}}}},
                 {"linear", "c", {{"out_features", int64_t{400}}}}};
  return ModelSpec{spec};
}

int64_t OptimizerStateOf(OptimizerKind kind, std::vector<std::string>* notes = nullptr) {
  RunConfig c;
  c.batch_size = 1;
  c.optimizer.kind = kind;
  StatusOr<Report> r = Estimate(ThreeLinears(), c, {.advice = false});
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return -1;
  if (notes != nullptr) *notes = r->notes;
  return r->end_of_step[static_cast<int>(Category::kOptimizerState)];
}

TEST(QloraTest, Bitsandbytes8bitAdamWKeepsByteStates) {
  EXPECT_EQ(OptimizerStateOf(OptimizerKind::kBnbAdamW8bit), 253'952);
  EXPECT_EQ(OptimizerStateOf(OptimizerKind::kBnbPagedAdamW32bit), 873'472);
  RunConfig cpu;
  cpu.runtime = Runtime::kCpuTorch113;
  cpu.optimizer.kind = OptimizerKind::kBnbAdamW8bit;
  EXPECT_NE(ValidateRunConfig(cpu).message().find("config.optimizer.kind: bitsandbytes AdamW8bit "
                                                  "runs on CUDA"),
            std::string::npos);
}

// PagedAdamW8bit keeps AdamW8bit's tensors; those of parameters of 100,000 elements or more
// (c.weight's uint8 states, 2 r(100000) = 200,704 B) come from cudaMallocManaged, counted as
// resident and said so in a note: the same 253,952 bytes.
TEST(QloraTest, PagedAdamW8bitKeepsTheSameBytesAsResident) {
  std::vector<std::string> notes;
  EXPECT_EQ(OptimizerStateOf(OptimizerKind::kBnbPagedAdamW8bit, &notes), 253'952);
  bool paged = false;
  for (const std::string& n : notes) paged |= n.rfind("paged optimizer: ", 0) == 0;
  EXPECT_TRUE(paged);
}

TEST(QloraTest, RefusesWhatIsNotModelled) {
  struct Case {
    RunConfig config;
    std::string message;
  };
  std::vector<Case> cases;
  RunConfig c = Qlora();
  c.runtime = Runtime::kCpuTorch113;
  c.precision = Precision::kFp32;
  c.lora = {};
  cases.push_back({c, "config.quantization: bitsandbytes' layers are modelled as they run on CUDA"});
  c = Qlora();
  c.parallelism.data = 2;
  c.parallelism.sharding = DataSharding::kFsdp2;
  cases.push_back({c, "config.quantization: bitsandbytes' weights are modelled on one GPU"});
  c = Qlora();
  c.quantization.compute_dtype = DType::kInt8;
  cases.push_back({c, "config.quantization.compute_dtype: float32, float16 or bfloat16"});
  c = RunConfig{};
  c.quantization.double_quant = true;
  cases.push_back({c, "config.quantization: a bitsandbytes setting, and no bitsandbytes format is set"});
  for (const Case& k : cases) {
    Status s = ValidateRunConfig(k.config);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << k.message;
    EXPECT_NE(s.message().find(k.message), std::string::npos) << s.message();
  }
  c = Qlora();
  c.lora = {};
  StatusOr<Graph> untrained = BuildStepGraph(Llama(1), c);
  ASSERT_FALSE(untrained.ok());
  EXPECT_NE(untrained.status().message().find("has no parameter left to train"), std::string::npos);
  c.mode = Mode::kInference;
  EXPECT_TRUE(BuildStepGraph(Llama(1), c).ok());
  // A tied lm_head shares the embedding's weight: it cannot be packed.
  c = Qlora();
  c.quantization.skip_modules = {"c_fc"};
  StatusOr<Graph> tied = BuildStepGraph(ModelSpec{PresetSpec{"gpt2-small", {{"seq", 64}, {"layers", 1}}}}, c);
  ASSERT_FALSE(tied.ok());
  EXPECT_NE(tied.status().message().find("'transformer.wte.weight' is also read"), std::string::npos)
      << tied.status().message();
  c = Qlora();
  c.quantization.skip_modules = {"score"};
  StatusOr<Graph> g = BuildStepGraph(Llama(1), c);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("config.quantization.skip_modules[0]: 'score' matches no"),
            std::string::npos)
      << g.status().message();
}

}  // namespace
}  // namespace memest
