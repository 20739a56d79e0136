// Validate on a FakeDevice: the replay, the comparison and the safety rules, without a GPU.
// The fake checks every address the replay uses against the memory it handed out, so a wrong
// segment map fails here.
#include "validate/validation.h"

#include <gtest/gtest.h>

#include "engine/estimator.h"
#include "validate/fake_device.h"
#include "validate/op_work.h"

namespace memest::validate {
namespace {

ModelSpec Preset(std::string name, std::map<std::string, int64_t> params = {}) {
  return ModelSpec{PresetSpec{std::move(name), std::move(params)}};
}

RunConfig Training(int64_t batch) {
  RunConfig c;
  c.batch_size = batch;
  return c;
}

const Comparison& Category(const Validation& v, const char* name) {
  for (const Comparison& c : v.categories) {
    if (c.name == name) return c;
  }
  static Comparison none;
  ADD_FAILURE() << "no category " << name;
  return none;
}

TEST(Validate, MlpReplaysThePredictedScheduleExactlyAndGivesEveryByteBack) {
  FakeDevice device;
  StatusOr<Validation> v = Validate(Preset("mlp"), Training(64), device, {});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  // No convolution asks for a workspace: the replay is the prediction, byte for byte.
  EXPECT_EQ(v->peak_allocated.measured_bytes, v->peak_allocated.predicted_bytes);
  EXPECT_EQ(v->peak_reserved.measured_bytes, v->peak_reserved.predicted_bytes);
  EXPECT_GT(v->peak_allocated.measured_bytes, 0);
  for (const PhaseComparison& p : v->phases) {
    EXPECT_EQ(p.allocated.measured_bytes, p.allocated.predicted_bytes) << PhaseName(p.phase);
    EXPECT_EQ(p.reserved.measured_bytes, p.reserved.predicted_bytes) << PhaseName(p.phase);
  }
  EXPECT_EQ(Category(*v, "parameters").measured_bytes, Category(*v, "parameters").predicted_bytes);
  EXPECT_EQ(Category(*v, "cuda_context").measured_bytes, (512 + 8 + 2) << 20);
  // The device total: context and handles plus the segments, each rounded to 2 MiB pages.
  EXPECT_GE(v->device_total.measured_bytes, v->peak_reserved.measured_bytes + ((512 + 8 + 2) << 20));
  EXPECT_TRUE(v->device_total.measured);
  // Linear layers ran as GEMMs, forward and backward, each with the cuBLAS workspace the
  // schedule allocated; every op is accounted for.
  EXPECT_GT(device.runs(WorkKind::kGemm), 4);
  EXPECT_EQ(device.runs_with_workspace(WorkKind::kGemm), device.runs(WorkKind::kGemm));
  EXPECT_GT(Category(*v, "workspace").measured_bytes, 0);
  EXPECT_EQ(v->ops_run + v->ops_memory_only, static_cast<int64_t>(v->ops.size()));
  EXPECT_GT(v->step_milliseconds, 0);
  EXPECT_GT(device.touched_bytes(), v->peak_allocated.measured_bytes / 2);
  EXPECT_EQ(device.held_bytes(), 0);
}

TEST(Validate, ConvolutionWorkspaceIsMeasuredThroughTheAllocator) {
  FakeDeviceOptions o;
  o.conv_workspace_bytes = 64 << 20;  // large enough to show at the peak
  FakeDevice device(o);
  StatusOr<Validation> v = Validate(Preset("resnet18", {{"image", 64}}), Training(8), device, {});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_GT(device.runs(WorkKind::kConvForward), 10);
  EXPECT_GT(device.runs(WorkKind::kConvBackwardFilter), 10);
  EXPECT_GT(v->peak_allocated.measured_bytes, v->peak_allocated.predicted_bytes);
  int64_t ws = 0;
  for (const OpRun& r : v->ops) ws = std::max(ws, r.workspace_bytes);
  EXPECT_EQ(ws, 64 << 20);
  EXPECT_EQ(device.held_bytes(), 0);
}

TEST(Validate, RefusesAStepThatDoesNotFitSayingByHowMuch) {
  FakeDeviceOptions o;
  o.total_bytes = int64_t{2} << 30;
  o.used_by_others = int64_t{1} << 30;
  FakeDevice device(o);
  StatusOr<Validation> v = Validate(Preset("gpt2-small", {{"seq", 256}}), Training(8), device, {});
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(v.status().message().find("short by"), std::string::npos) << v.status().message();
  EXPECT_NE(v.status().message().find("free on memest fake device"), std::string::npos);
  EXPECT_EQ(device.held_bytes(), 0);
}

TEST(Validate, ScalesTheBatchDownWhenAskedAndSaysSo) {
  FakeDeviceOptions o;
  o.total_bytes = int64_t{6} << 30;
  FakeDevice device(o);
  ValidateOptions opts;
  opts.scale_batch_to_fit = true;
  StatusOr<Validation> v = Validate(Preset("gpt2-small", {{"seq", 256}}), Training(64), device, opts);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_TRUE(v->scaled_down);
  EXPECT_LT(v->config.batch_size, 64);
  EXPECT_GE(v->config.batch_size, 1);
  EXPECT_NE(v->scaled_down_note.find("validated micro-batch"), std::string::npos);
  EXPECT_LE(v->peak_reserved.measured_bytes, device.peak_held_bytes());
  EXPECT_EQ(device.held_bytes(), 0);
}

TEST(Validate, CancellationStopsBetweenOpsAndReturnsTheMemory) {
  FakeDevice device;
  ValidateOptions opts;
  int polls = 0;
  opts.cancelled = [&] { return ++polls > 1; };
  StatusOr<Validation> v = Validate(Preset("gpt2-small", {{"seq", 128}, {"layers", 4}}),
                                    Training(2), device, opts);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kCancelled);
  EXPECT_EQ(device.held_bytes(), 0);
}

TEST(Validate, ADeviceFaultIsAnErrorAndTheMemoryIsReturned) {
  FakeDeviceOptions o;
  o.fail_run_after = 5;
  FakeDevice device(o);
  StatusOr<Validation> v = Validate(Preset("mlp"), Training(16), device, {});
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("fake device fault"), std::string::npos) << v.status().message();
  EXPECT_NE(v.status().message().find(" op "), std::string::npos) << "names the op";
  EXPECT_EQ(device.held_bytes(), 0);
}

TEST(Validate, ReportsProgressThroughEveryStage) {
  FakeDevice device;
  ValidateOptions opts;
  std::vector<Progress::Stage> stages;
  int64_t last_done = 0, total = 0;
  opts.progress = [&](const Progress& p) {
    if (stages.empty() || stages.back() != p.stage) stages.push_back(p.stage);
    if (p.ops_total > 0) last_done = p.ops_done, total = p.ops_total;
  };
  ASSERT_TRUE(Validate(Preset("gpt2-small", {{"seq", 64}, {"layers", 2}}), Training(2), device, opts).ok());
  ASSERT_EQ(stages.size(), 4u);
  EXPECT_EQ(stages.front(), Progress::Stage::kProbing);
  EXPECT_EQ(stages.back(), Progress::Stage::kFinishing);
  EXPECT_GT(total, 0);
  EXPECT_EQ(last_done, total);
}

TEST(Validate, WithoutNvmlTheContextIsNotMeasuredAndSaysSo) {
  FakeDeviceOptions o;
  o.measures_context = false;
  FakeDevice device(o);
  StatusOr<Validation> v = Validate(Preset("mlp"), Training(8), device, {});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_FALSE(Category(*v, "cuda_context").measured);
  EXPECT_FALSE(v->device_total.measured);
  bool noted = false;
  for (const std::string& n : v->notes) noted |= n.find("NVML") != std::string::npos;
  EXPECT_TRUE(noted);
}

TEST(Validate, RefusesWhatItCannotReplayNamingTheField) {
  FakeDevice device;
  RunConfig cpu = Training(4);
  cpu.runtime = Runtime::kCpuTorch113;
  StatusOr<Validation> v = Validate(Preset("mlp"), cpu, device, {});
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(v.status().message().rfind("config.runtime:", 0), 0u) << v.status().message();

  RunConfig expandable = Training(4);
  expandable.expandable_segments = true;
  v = Validate(Preset("mlp"), expandable, device, {});
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().message().rfind("config.expandable_segments:", 0), 0u);

  v = Validate(Preset("mlp"), Training(0), device, {});
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);

  ValidateOptions none;
  none.repeats = 0;
  v = Validate(Preset("mlp"), Training(4), device, none);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().message().rfind("repeats:", 0), 0u);
}

TEST(Validate, InferenceReplaysToo) {
  FakeDevice device;
  RunConfig c = Training(4);
  c.mode = Mode::kInference;
  StatusOr<Validation> v = Validate(Preset("gpt2-small", {{"seq", 128}, {"layers", 2}}), c, device, {});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->peak_allocated.measured_bytes, v->peak_allocated.predicted_bytes);
  for (const PhaseComparison& p : v->phases) EXPECT_NE(p.phase, Phase::kBackward);
}

// ---- op work ----

TEST(OpWork, LinearRunsOneGemmForwardAndTwoBackward) {
  StatusOr<Graph> g = BuildStepGraph(Preset("mlp", {{"layers", 1}}), Training(32));
  ASSERT_TRUE(g.ok());
  int linear = -1;
  for (size_t i = 0; i < g->ops.size(); ++i) {
    if (g->ops[i].kind == "linear") { linear = static_cast<int>(i); break; }
  }
  ASSERT_GE(linear, 0);
  const Op& op = g->ops[linear];
  ResolvedOperands r;
  for (size_t k = 0; k < op.inputs.size(); ++k) r.inputs.push_back({0x1000u + 0x1000000u * r.inputs.size(), int64_t{1} << 30});
  r.outputs = {{0x9000000, int64_t{1} << 30}};
  OpWork fwd = WorkOfResolved(*g, linear, false, r);
  ASSERT_EQ(fwd.work.size(), 1u) << fwd.reason;
  EXPECT_EQ(fwd.work[0].kind, WorkKind::kGemm);
  EXPECT_EQ(fwd.work[0].gemm.m, 32);
  EXPECT_EQ(fwd.work[0].gemm.k, 784);
  EXPECT_EQ(fwd.work[0].gemm.n, 1024);

  r.output_grad = {0xA000000, int64_t{1} << 30};
  r.input_grads = {{0, 0}, {0xB000000, int64_t{1} << 30}, {0xC000000, int64_t{1} << 30}};
  OpWork bwd = WorkOfResolved(*g, linear, true, r);
  ASSERT_EQ(bwd.work.size(), 2u) << bwd.reason;  // dW and the bias's reduction (no dX: input)
  EXPECT_EQ(bwd.work[0].kind, WorkKind::kGemm);
  EXPECT_EQ(bwd.work[0].gemm.m, 784);  // dW (as its transpose [k, n]) = X^T @ dY
  EXPECT_EQ(bwd.work[0].gemm.n, 1024);
  EXPECT_EQ(bwd.work[0].gemm.k, 32);
  EXPECT_EQ(bwd.work[1].kind, WorkKind::kReduce);
  EXPECT_EQ(bwd.work[1].rows, 1024);
}

TEST(OpWork, AnOperandTooSmallForItsShapeRunsAsMemoryOnly) {
  StatusOr<Graph> g = BuildStepGraph(Preset("mlp", {{"layers", 1}}), Training(32));
  ASSERT_TRUE(g.ok());
  int linear = 0;
  while (g->ops[linear].kind != "linear") ++linear;
  ResolvedOperands r;
  r.inputs = {{0x1000, 16}, {0x2000000, int64_t{1} << 30}, {0x4000000, int64_t{1} << 30}};
  r.outputs = {{0x9000000, int64_t{1} << 30}};
  OpWork w = WorkOfResolved(*g, linear, false, r);
  EXPECT_TRUE(w.work.empty());
  EXPECT_NE(w.reason.find("broadcast"), std::string::npos) << w.reason;
}

}  // namespace
}  // namespace memest::validate
