// Attention as PyTorch 2.x runs it: the SDPA kernel choice (engine/rules/sdpa_select.h, after
// sdp_utils.cpp), what each kernel keeps (engine/rules/attention.cc, after flash_api.cpp and
// the memory-efficient kernels' sources), and the presets and layer models under
// config.attention.
#include <gtest/gtest.h>

#include <string>

#include "engine/estimator.h"
#include "engine/models/layers.h"
#include "engine/rules/op_rules.h"
#include "engine/rules/sdpa_select.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

SdpaParams Call(DType dtype, int cc = 90) {
  SdpaParams p;
  p.dtype = dtype;
  p.batch = 2;
  p.heads = 8;
  p.kv_heads = 8;
  p.q_len = p.kv_len = 100;
  p.head_dim_qk = p.head_dim_v = 64;
  p.is_causal = true;
  p.compute_capability = cc;
  return p;
}

SdpaBackend Pick(const SdpaParams& p, AttentionImpl impl = AttentionImpl::kSdpa) {
  StatusOr<SdpaBackend> b = SelectSdpaBackend(p, impl);
  EXPECT_TRUE(b.ok()) << b.status().message();
  return b.ok() ? *b : SdpaBackend::kMath;
}

// PyTorch's default order is flash, memory-efficient, math (Context.h): flash takes half inputs
// without a mask on sm_80+; memory-efficient float32, masks and older GPUs; math the rest.
TEST(SdpaSelectTest, FollowsSdpUtilsConstraints) {
  EXPECT_EQ(Pick(Call(DType::kBFloat16)), SdpaBackend::kFlash);
  EXPECT_EQ(Pick(Call(DType::kFloat16)), SdpaBackend::kFlash);
  EXPECT_EQ(Pick(Call(DType::kFloat32)), SdpaBackend::kEfficient);
  SdpaParams masked = Call(DType::kBFloat16);
  masked.has_mask = true;
  EXPECT_EQ(Pick(masked), SdpaBackend::kEfficient);
  // head dim 6: float32 rows must be 4-aligned (minimum_gemm_alignment on sm_80+): math.
  SdpaParams odd = Call(DType::kFloat32);
  odd.head_dim_qk = odd.head_dim_v = 6;
  EXPECT_EQ(Pick(odd), SdpaBackend::kMath);
  EXPECT_EQ(Pick(Call(DType::kFloat64)), SdpaBackend::kMath);
  // T4 (sm_75): no flash; bfloat16 is not a memory-efficient dtype before sm_80: math.
  EXPECT_EQ(Pick(Call(DType::kFloat16, 75)), SdpaBackend::kEfficient);
  EXPECT_EQ(Pick(Call(DType::kBFloat16, 75)), SdpaBackend::kMath);
  // sm_86 (A6000): flash's backward refuses head dims in (192, 224].
  SdpaParams wide = Call(DType::kBFloat16, 86);
  wide.head_dim_qk = wide.head_dim_v = 200;
  EXPECT_EQ(Pick(wide), SdpaBackend::kEfficient);
  wide.requires_grad = false;
  EXPECT_EQ(Pick(wide), SdpaBackend::kFlash);
  // is_causal with a query shorter than the keys: not flash.
  SdpaParams decode = Call(DType::kBFloat16);
  decode.q_len = 1;
  EXPECT_EQ(Pick(decode), SdpaBackend::kEfficient);
}

// cuDNN first where asked; it takes head dims up to 128 (multiples of 8) in half precision.
TEST(SdpaSelectTest, CudnnFirstThenTheDefaultOrder) {
  EXPECT_EQ(Pick(Call(DType::kBFloat16), AttentionImpl::kCudnn), SdpaBackend::kCudnn);
  SdpaParams wide = Call(DType::kBFloat16);
  wide.head_dim_qk = wide.head_dim_v = 256;
  EXPECT_EQ(Pick(wide, AttentionImpl::kCudnn), SdpaBackend::kFlash);
  EXPECT_EQ(Pick(Call(DType::kFloat32), AttentionImpl::kCudnn), SdpaBackend::kEfficient);
  SdpaParams drop = Call(DType::kBFloat16);
  drop.dropout = 0.1;  // not a multiple of 1/16
  EXPECT_EQ(Pick(drop, AttentionImpl::kCudnn), SdpaBackend::kFlash);
}

TEST(SdpaSelectTest, AForcedKernelThatCannotRunIsRefusedNamingTheField) {
  StatusOr<SdpaBackend> b = SelectSdpaBackend(Call(DType::kFloat32), AttentionImpl::kFlash);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b.status().message(),
            "config.attention: flash cannot run this attention: flash attention takes float16 "
            "or bfloat16, the inputs are float32; choose sdpa to let PyTorch fall back to "
            "another kernel");
  b = SelectSdpaBackend(Call(DType::kBFloat16, 70), AttentionImpl::kMemEfficient);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("sm_70"), std::string::npos);
  EXPECT_EQ(Pick(Call(DType::kBFloat16), AttentionImpl::kMemEfficient), SdpaBackend::kEfficient);
}

// One fused call q [2, 8, 100, 64], k and v [2, kv_heads, 100, 64] with its backend.
OpMemory FusedMemory(DType dtype, const std::string& backend, int64_t kv_heads, int64_t hd = 64) {
  GraphBuilder b;
  std::vector<int> in;
  for (int i = 0; i < 3; ++i) {
    const int p = b.Parameter("p" + std::to_string(i), {2, i == 0 ? 8 : kv_heads, 100, hd}, dtype);
    in.push_back(b.Add1("mul", {p}, {{"scalar", 1.0}}));
  }
  const int y = b.Add1("scaled_dot_product_attention", in,
                       {{"fused", int64_t{1}}, {"is_causal", int64_t{1}}, {"backend", backend}});
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {y}));
  static Graph g;
  g = b.Finish().value();
  const Op& op = g.ops[3];
  OpCall call{op, {}, {&g.tensors[op.outputs[0]]}, "", true, Runtime::kCuda};
  for (int t : op.inputs) call.inputs.push_back(&g.tensors[t]);
  return OpMemoryOf(call);
}

// nn.MultiheadAttention(batch_first=True)'s path to out_proj, as a 2.x trace records it: q, k
// and v are [B, H, L, D] views of an [L, B, E] projection, the fused output is permuted to
// [L, B, H, D] and made contiguous. Returns whether that contiguous() copies.
bool MhaMergeCopies(DType dtype, Runtime runtime, const std::string& backend = "") {
  GraphBuilder b;
  b.SetRuntime(runtime);
  const int64_t B = 4, H = 8, L = 64, D = 32;
  std::vector<int> qkv;
  for (int i = 0; i < 3; ++i) {
    const int x = b.Parameter("x" + std::to_string(i), {L, B * H, D}, dtype);
    const int t = b.Add1("transpose", {x}, {{"dim0", int64_t{0}}, {"dim1", int64_t{1}}});
    qkv.push_back(b.Add1("view", {t}, {{"shape", std::vector<int64_t>{B, H, L, D}}}));
  }
  Attrs attrs{{"fused", int64_t{1}}};
  if (!backend.empty()) attrs["backend"] = backend;
  const int y = b.Add1("scaled_dot_product_attention", qkv, attrs);
  const int p = b.Add1("permute", {y}, {{"dims", std::vector<int64_t>{2, 0, 1, 3}}});
  const int c = b.Add1("contiguous", {p});
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {c}));
  const Graph g = b.Finish().value();
  return g.tensors[c].alias_of < 0;
}

// CUDA's memory-efficient kernel writes [B, L, H, D] whatever the query's layout
// (_efficient_attention_forward), so the merge copies: measured on an H200 under PyTorch 2.11,
// one [L, B, E] float32 copy per layer that out_proj keeps (docs/validation.md). Flash and
// cuDNN follow the query's layout, and so does the CPU runtime's fused kernel: no copy.
TEST(FusedAttentionTest, TheOutputLayoutIsTheKernels) {
  EXPECT_TRUE(MhaMergeCopies(DType::kFloat32, Runtime::kCuda));  // efficient: float32
  EXPECT_TRUE(MhaMergeCopies(DType::kBFloat16, Runtime::kCuda, "efficient"));
  EXPECT_FALSE(MhaMergeCopies(DType::kBFloat16, Runtime::kCuda));  // flash
  EXPECT_FALSE(MhaMergeCopies(DType::kBFloat16, Runtime::kCuda, "cudnn"));
  EXPECT_FALSE(MhaMergeCopies(DType::kFloat32, Runtime::kCpuTorch113));
  // Where no fused kernel runs (float64 here), the math form's matmul(attn, v) is contiguous.
  EXPECT_TRUE(MhaMergeCopies(DType::kFloat64, Runtime::kCuda));
}

// A graph built for CUDA is not the CPU runtime's where a fused attention's layout differs:
// refused, naming config.runtime, rather than estimated with CUDA's layouts.
TEST(FusedAttentionTest, AGraphOfTheOtherRuntimeIsRefused) {
  GraphBuilder b;
  std::vector<int> qkv;
  for (int i = 0; i < 3; ++i) qkv.push_back(b.Input("x" + std::to_string(i), {2, 4, 16, 8}, DType::kFloat32));
  b.Add1("scaled_dot_product_attention", qkv, {{"fused", int64_t{1}}});
  const Graph g = b.Finish().value();
  RunConfig c;
  c.mode = Mode::kInference;
  c.runtime = Runtime::kCpuTorch113;
  StatusOr<Report> r = EstimateGraph(g, c, {1'000'000, false});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("config.runtime"), std::string::npos) << r.status().message();
  c.runtime = Runtime::kCuda;
  EXPECT_TRUE(EstimateGraph(g, c, {1'000'000, false}).ok());
}

int64_t Sum(const std::vector<Alloc>& allocs) {
  int64_t s = 0;
  for (const Alloc& a : allocs) s += a.bytes;
  return s;
}

// flash (mha_fwd / mha_bwd): softmax_lse [2, 8, 100] float32 = 6,400; rng_state 16 and an
// unused 8-byte offset, on the device with or without dropout. Backward: dq_accum
// [2, 128, 8, 64] float32 = 524,288 and softmax_d [2, 8, 128] float32 = 8,192; with 2 kv heads
// for 8, dk and dv expanded to [2, 100, 8, 64] bfloat16 = 204,800 each.
TEST(FusedAttentionTest, FlashKeepsItsLogsumexpAndRngState) {
  const OpMemory m = FusedMemory(DType::kBFloat16, "flash", 2);
  EXPECT_EQ(m.saved_inputs, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(m.saved_outputs, std::vector<int>{0});
  EXPECT_EQ(Sum(m.saved_extras), 6400 + 16 + 8);
  EXPECT_TRUE(m.forward_temps.empty());
  EXPECT_EQ(Sum(m.backward_temps), 524288 + 8192 + 2 * 204800);
  EXPECT_EQ(Sum(FusedMemory(DType::kBFloat16, "flash", 8).backward_temps), 524288 + 8192);
}

// memory-efficient (_efficient_attention_forward / _backward): logsumexp [2, 8, 128] (100 rows
// padded to 32) = 8,192; seed and offset are host scalars. Backward: delta [2, 8, 100] float32
// = 6,400, and for half inputs a float32 grad_q accumulator [2, 100, 8, 64] = 409,600. Grouped
// kv heads are repeated to 8 first ([2, 8, 100, 64] each), and those repeats are kept. A head
// dim of 160 (> 128) in half precision needs a float32 output accumulator while it runs.
TEST(FusedAttentionTest, MemoryEfficientPadsItsLogsumexpTo32Rows) {
  const OpMemory f32 = FusedMemory(DType::kFloat32, "efficient", 8);
  EXPECT_EQ(f32.saved_inputs, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(Sum(f32.saved_extras), 8192);
  EXPECT_EQ(Sum(f32.backward_temps), 6400);
  const OpMemory gqa = FusedMemory(DType::kBFloat16, "efficient", 2);
  EXPECT_EQ(gqa.saved_inputs, std::vector<int>{0});
  EXPECT_EQ(Sum(gqa.saved_extras), 2 * 204800 + 8192);
  EXPECT_EQ(Sum(gqa.backward_temps), 6400 + 409600);
  const OpMemory wide = FusedMemory(DType::kBFloat16, "efficient", 8, 160);
  EXPECT_EQ(Sum(wide.forward_temps), 2 * 100 * 8 * 160 * 4);
}

// cuDNN: softmax statistics [2, 8, 100, 1] float32 = 6,400; backward a float32 dq accumulator
// [2, 8, 100, 64] = 409,600 and the softmax sum [2, 8, 100] = 6,400.
TEST(FusedAttentionTest, CudnnKeepsItsSoftmaxStatistics) {
  const OpMemory m = FusedMemory(DType::kBFloat16, "cudnn", 8);
  EXPECT_EQ(Sum(m.saved_extras), 6400);
  EXPECT_EQ(Sum(m.backward_temps), 409600 + 6400);
}

// --- presets and layer models under config.attention ---

ModelSpec SmallLlama() {
  PresetSpec p;
  p.name = "llama-7b";
  p.params = {{"seq", 256}, {"layers", 2},  {"d_model", 512}, {"heads", 8},
              {"kv_heads", 2}, {"ffn", 1024}, {"vocab", 1000}};
  return ModelSpec{p};
}

RunConfig Bf16(AttentionImpl attention) {
  RunConfig c;
  c.batch_size = 4;
  c.precision = Precision::kBf16Amp;
  c.attention = attention;
  return c;
}

int CountOps(const Graph& g, const std::string& kind, const std::string& backend = "") {
  int n = 0;
  for (const Op& op : g.ops) {
    if (op.kind != kind) continue;
    if (!backend.empty() && StringAttr(op.attrs, "backend", "", "").value() != backend) continue;
    ++n;
  }
  return n;
}

// The default on CUDA is sdpa: under bf16 autocast, flash with is_causal, k and v kept at their
// 2 kv heads (enable_gqa: no repeat_kv), no additive causal mask, no [T, T] softmax.
TEST(AttentionPresetTest, DefaultIsSdpaAndRunsFlashUnderBf16) {
  const Graph g = BuildStepGraph(SmallLlama(), Bf16(AttentionImpl::kDefault), 1'000'000).value();
  EXPECT_EQ(CountOps(g, "scaled_dot_product_attention", "flash"), 2);
  EXPECT_EQ(CountOps(g, "softmax"), 0);
  EXPECT_EQ(CountOps(g, "expand"), 0);
  for (const Tensor& t : g.tensors) EXPECT_EQ(t.name.find("causal_mask"), std::string::npos);
  const Graph eager = BuildStepGraph(SmallLlama(), Bf16(AttentionImpl::kEager), 1'000'000).value();
  EXPECT_EQ(CountOps(eager, "scaled_dot_product_attention"), 0);
  EXPECT_EQ(CountOps(eager, "softmax"), 2);
  // float32: memory-efficient, which repeats the kv heads itself.
  RunConfig f32 = Bf16(AttentionImpl::kSdpa);
  f32.precision = Precision::kFp32;
  const Graph fp = BuildStepGraph(SmallLlama(), f32, 1'000'000).value();
  EXPECT_EQ(CountOps(fp, "scaled_dot_product_attention", "efficient"), 2);
}

// The fused kernels keep a logsumexp per query, not the [T, T] probabilities: the step saves far
// less, and the peak follows.
TEST(AttentionPresetTest, FlashSavesLessThanEager) {
  const Report eager = Estimate(SmallLlama(), Bf16(AttentionImpl::kEager)).value();
  const Report flash = Estimate(SmallLlama(), Bf16(AttentionImpl::kFlash)).value();
  const Report sdpa = Estimate(SmallLlama(), Bf16(AttentionImpl::kSdpa)).value();
  EXPECT_LT(flash.saved_for_backward_bytes, eager.saved_for_backward_bytes);
  EXPECT_LT(flash.peak.allocated_bytes, eager.peak.allocated_bytes);
  EXPECT_EQ(flash.saved_for_backward_bytes, sdpa.saved_for_backward_bytes);
  // One layer's [4, 8, 256, 256] float32 softmax result (what eager's softmax(dtype=float32)
  // keeps) alone is 8 MiB; flash keeps 4 x 8 x 256 x 4 = 32 KiB of logsumexp per layer.
  EXPECT_GT(eager.saved_for_backward_bytes - flash.saved_for_backward_bytes, 2 * (8 << 20));
  bool noted = false;
  for (const std::string& n : flash.notes) {
    noted |= n.find("config.attention flash") != std::string::npos &&
             n.find("2 flash") != std::string::npos;
  }
  EXPECT_TRUE(noted);
  // Only the eager form is said to keep its scores (autocast's casts of the fused kernel's
  // inputs, in its core scope, are not the math form).
  auto says_math = [](const Report& r) {
    for (const std::string& n : r.notes) {
      if (n.find("attention in its math form") != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_TRUE(says_math(eager));
  EXPECT_FALSE(says_math(flash));
  EXPECT_FALSE(says_math(sdpa));
}

TEST(AttentionPresetTest, ForcedFlashUnderFloat32IsRefused) {
  RunConfig c = Bf16(AttentionImpl::kFlash);
  c.precision = Precision::kFp32;
  StatusOr<Report> r = Estimate(SmallLlama(), c);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message().rfind("config.attention: flash cannot run this attention", 0),
            0u)
      << r.status().message();
}

// The device picks the kernel: a T4 (sm_75) has no flash, so fp16 autocast runs the
// memory-efficient kernel.
TEST(AttentionPresetTest, TheDevicePicksTheKernel) {
  RunConfig c = Bf16(AttentionImpl::kSdpa);
  c.precision = Precision::kFp16Amp;
  c.device = "t4";
  const Graph g = BuildStepGraph(SmallLlama(), c, 1'000'000).value();
  EXPECT_EQ(CountOps(g, "scaled_dot_product_attention", "efficient"), 2);
}

// The cpu-1.13 runtime has no SDPA: eager by default, anything else refused.
TEST(AttentionPresetTest, Cpu113RunsEagerAndRefusesSdpa) {
  RunConfig c = enginetest::PlainTraining();
  c.runtime = Runtime::kCpuTorch113;
  EXPECT_EQ(ResolveAttention(c), AttentionImpl::kEager);
  c.attention = AttentionImpl::kSdpa;
  Status s = ValidateRunConfig(c);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().rfind("config.attention: sdpa needs torch.nn.functional."
                              "scaled_dot_product_attention",
                              0),
            0u)
      << s.message();
}

// A layer model's attention and transformer_block honour it too; the merge's contiguous() of
// the fused output copies nothing.
TEST(AttentionPresetTest, LayerModelsHonourTheOption) {
  LayerModelSpec spec;
  spec.input_shape = {128, 256};
  LayerSpec attn{"attention", "attn", {{"heads", AttrInt(4)}, {"causal", AttrInt(1)}}};
  LayerSpec block{"transformer_block", "block", {{"heads", AttrInt(4)}}};
  spec.layers = {attn, block};
  const Graph g =
      BuildStepGraph(ModelSpec{spec}, Bf16(AttentionImpl::kSdpa), 1'000'000).value();
  EXPECT_EQ(CountOps(g, "scaled_dot_product_attention", "flash"), 2);
  for (const Op& op : g.ops) {
    if (op.kind != "contiguous") continue;
    EXPECT_GE(g.tensors[op.outputs[0]].alias_of, 0) << op.scope;
  }
}

}  // namespace
}  // namespace memest
