// CudaDevice on a real GPU. Every test opens device 0 and skips (GTEST_SKIP) when that fails,
// so on a machine without a GPU the binary runs and skips everything.
#include "kernels/cuda_device.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace memest::kernels {
namespace {

using validate::ConvShape;
using validate::DevicePtr;
using validate::Work;
using validate::WorkBytes;
using validate::WorkKind;

constexpr int64_t kMiB = 1024 * 1024;

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StatusOr<std::unique_ptr<CudaDevice>> device = CudaDevice::Open(0);
    if (!device.ok()) GTEST_SKIP() << "no GPU to test on: " << device.status().ToString();
    device_ = std::move(device).value();
  }

  DevicePtr Alloc(int64_t bytes) {
    StatusOr<DevicePtr> p = device_->Malloc(bytes);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? *p : 0;
  }

  // Allocates every operand `work` needs (BytesNeeded; for elementwise `inputs` operands) and
  // the workspace, each in its own allocation.
  void AllocateOperands(Work* work, int inputs = 0, int64_t workspace_bytes = 0) {
    if (inputs > 0) work->inputs.assign(inputs, 0);
    const WorkBytes need = BytesNeeded(*work);
    work->inputs.clear();
    for (int64_t b : need.inputs) work->inputs.push_back(Alloc(b));
    work->output = Alloc(need.output);
    work->workspace_bytes = workspace_bytes;
    work->workspace = workspace_bytes > 0 ? Alloc(workspace_bytes) : 0;
  }

  void ExpectRuns(const Work& work, int repeats = 5) {
    StatusOr<validate::Timing> t = device_->Run(work, repeats);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_GT(t->median_ms, 0.0);
    EXPECT_EQ(t->repeats, repeats);
    Status sync = device_->Synchronize();
    EXPECT_TRUE(sync.ok()) << sync.ToString();
  }

  void ExpectInvalid(const Work& work, const std::string& field) {
    StatusOr<validate::Timing> t = device_->Run(work, 3);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << t.status().ToString();
    EXPECT_NE(t.status().message().find(field), std::string::npos) << t.status().ToString();
  }

  std::unique_ptr<CudaDevice> device_;
};

// ---- Probe and memory ----------------------------------------------------------------------

TEST_F(CudaDeviceTest, ProbeIsSane) {
  StatusOr<validate::DeviceProbe> probe = device_->Probe();
  ASSERT_TRUE(probe.ok()) << probe.status().ToString();
  EXPECT_FALSE(probe->name.empty());
  EXPECT_EQ(probe->ordinal, 0);
  EXPECT_GE(probe->compute_capability, 50);
  EXPECT_FALSE(probe->driver_version.empty());
  EXPECT_FALSE(probe->runtime_version.empty());
  EXPECT_GT(probe->total_bytes, 0);
  EXPECT_GT(probe->free_bytes, 0);
  EXPECT_LE(probe->free_bytes, probe->total_bytes);
  if (probe->context_bytes == -1) {
    EXPECT_FALSE(probe->notes.empty()) << "an unmeasured context needs a note saying why";
  } else {
    EXPECT_GT(probe->context_bytes, 0);
    EXPECT_LT(probe->context_bytes, probe->total_bytes);
  }
  EXPECT_GE(probe->cublas_handle_bytes, 0);
  EXPECT_GE(probe->cudnn_handle_bytes, 0);
  for (const std::string& note : probe->notes) std::printf("probe note: %s\n", note.c_str());
  std::printf("%s (sm_%d), driver %s, runtime %s: context %lld B, cuBLAS %lld B, cuDNN %lld B\n",
              probe->name.c_str(), probe->compute_capability, probe->driver_version.c_str(),
              probe->runtime_version.c_str(), static_cast<long long>(probe->context_bytes),
              static_cast<long long>(probe->cublas_handle_bytes),
              static_cast<long long>(probe->cudnn_handle_bytes));
}

TEST_F(CudaDeviceTest, MallocTouchFreeGivesTheMemoryBack) {
  StatusOr<validate::DeviceMemInfo> before = device_->MemInfo();
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  const int64_t bytes = 256 * kMiB + 13;
  const DevicePtr p = Alloc(bytes);
  ASSERT_NE(p, 0u);
  ASSERT_TRUE(device_->Touch(p, bytes).ok());
  ASSERT_TRUE(device_->Synchronize().ok());
  StatusOr<validate::DeviceMemInfo> during = device_->MemInfo();
  ASSERT_TRUE(during.ok());
  EXPECT_LE(during->free_bytes, before->free_bytes - 256 * kMiB);
  ASSERT_TRUE(device_->Free(p).ok());
  StatusOr<validate::DeviceMemInfo> after = device_->MemInfo();
  ASSERT_TRUE(after.ok());
  // Another process may allocate meanwhile; 64 MiB of slack for it.
  EXPECT_GE(after->free_bytes, before->free_bytes - 64 * kMiB);
}

// Touch writes exactly [ptr, ptr + bytes): every byte inside, none outside, for unaligned
// starts and sizes that are not a multiple of 16.
TEST_F(CudaDeviceTest, TouchWritesEveryByteOfTheRangeAndNoOther) {
  const int64_t size = 1 * kMiB;
  const DevicePtr base = Alloc(size);
  ASSERT_NE(base, 0u);
  for (const auto& [offset, bytes] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 1}, {3, 1}, {5, 17}, {0, 16}, {16, 48}, {7, 100003}, {1, size - 2}}) {
    // The device's stream does not wait for the legacy default stream cudaMemset runs on.
    ASSERT_EQ(cudaMemset(reinterpret_cast<void*>(base), 0, size), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_TRUE(device_->Touch(base + offset, bytes).ok());
    ASSERT_TRUE(device_->Synchronize().ok());
    std::vector<unsigned char> host(size);
    ASSERT_EQ(cudaMemcpy(host.data(), reinterpret_cast<void*>(base), size, cudaMemcpyDeviceToHost),
              cudaSuccess);
    int64_t wrong = 0;
    for (int64_t i = 0; i < size; ++i) {
      const bool inside = i >= offset && i < offset + bytes;
      if ((host[i] != 0) != inside) ++wrong;
    }
    EXPECT_EQ(wrong, 0) << "offset " << offset << ", bytes " << bytes;
  }
  EXPECT_TRUE(device_->Touch(base, 0).ok());
}

TEST_F(CudaDeviceTest, MallocOfMoreThanTheDeviceHasIsResourceExhausted) {
  StatusOr<validate::DeviceMemInfo> info = device_->MemInfo();
  ASSERT_TRUE(info.ok());
  StatusOr<DevicePtr> p = device_->Malloc(info->total_bytes + 1024 * kMiB);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kResourceExhausted) << p.status().ToString();
  EXPECT_NE(p.status().message().find("cudaMalloc("), std::string::npos);
  // The failure left nothing behind: the device still allocates and runs.
  Work work;
  work.kind = WorkKind::kReduce;
  work.rows = 4;
  work.cols = 100;
  AllocateOperands(&work);
  ExpectRuns(work);
}

TEST_F(CudaDeviceTest, BadAddressesAndSizesAreInvalidArguments) {
  EXPECT_EQ(device_->Malloc(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(device_->Malloc(-5).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(device_->Free(12345).code(), StatusCode::kInvalidArgument);
  const DevicePtr p = Alloc(4096);
  EXPECT_EQ(device_->Touch(p + 4000, 200).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(device_->Touch(p, -1).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(device_->Free(p).ok());
  EXPECT_EQ(device_->Free(p).code(), StatusCode::kInvalidArgument);  // twice
}

TEST_F(CudaDeviceTest, TheDestructorFreesWhatWasNotFreed) {
  StatusOr<validate::DeviceMemInfo> before = device_->MemInfo();
  ASSERT_TRUE(before.ok());
  {
    StatusOr<std::unique_ptr<CudaDevice>> other = CudaDevice::Open(0);
    ASSERT_TRUE(other.ok()) << other.status().ToString();
    ASSERT_TRUE((*other)->Malloc(512 * kMiB).ok());
  }
  StatusOr<validate::DeviceMemInfo> after = device_->MemInfo();
  ASSERT_TRUE(after.ok());
  EXPECT_GE(after->free_bytes, before->free_bytes - 128 * kMiB);
}

// ---- Each kind at a small shape, per dtype -------------------------------------------------

class CudaDeviceDTypeTest : public CudaDeviceTest, public ::testing::WithParamInterface<DType> {};

TEST_P(CudaDeviceDTypeTest, Gemm) {
  Work work;
  work.kind = WorkKind::kGemm;
  work.dtype = GetParam();
  work.gemm = {3, 33, 65, 47};  // batch, m, n, k: odd sizes on purpose
  AllocateOperands(&work);
  ExpectRuns(work);
}

TEST_P(CudaDeviceDTypeTest, GemmWithAWorkspaceAndALongK) {
  Work work;
  work.kind = WorkKind::kGemm;
  work.dtype = GetParam();
  work.gemm = {1, 64, 128, 8192};
  AllocateOperands(&work, 0, 8 * kMiB);
  ExpectRuns(work);
}

TEST_P(CudaDeviceDTypeTest, GemmOfAMatrixWithItself) {
  Work work;
  work.kind = WorkKind::kGemm;
  work.dtype = GetParam();
  work.gemm = {1, 40, 40, 40};
  AllocateOperands(&work);
  work.inputs[1] = work.inputs[0];  // A @ A: one buffer, one pattern
  ExpectRuns(work);
}

ConvShape SmallConv() {
  ConvShape c;
  c.n = 2;
  c.c = 4;
  c.h = 9;
  c.w = 10;
  c.k = 6;
  c.r = 3;
  c.s = 3;
  c.stride_h = 2;
  c.pad_h = 1;
  c.pad_w = 2;
  c.dilation_w = 2;
  c.groups = 2;
  return c;
}

ConvShape ResNetConv() {  // a 3x3, stride 1, pad 1 layer: Winograd territory
  ConvShape c;
  c.n = 4;
  c.c = 32;
  c.h = 14;
  c.w = 14;
  c.k = 32;
  c.r = 3;
  c.s = 3;
  c.pad_h = 1;
  c.pad_w = 1;
  return c;
}

TEST_P(CudaDeviceDTypeTest, Convolutions) {
  for (const ConvShape& shape : {SmallConv(), ResNetConv()}) {
    for (WorkKind kind : {WorkKind::kConvForward, WorkKind::kConvBackwardData,
                          WorkKind::kConvBackwardFilter}) {
      SCOPED_TRACE(validate::WorkKindName(kind));
      Work work;
      work.kind = kind;
      work.dtype = GetParam();
      work.conv = shape;
      StatusOr<int64_t> ws = device_->WorkspaceBytes(work);
      ASSERT_TRUE(ws.ok()) << ws.status().ToString();
      EXPECT_GE(*ws, 0);
      AllocateOperands(&work, 0, *ws);
      ExpectRuns(work);
    }
  }
}

TEST_P(CudaDeviceDTypeTest, ElementwiseWithOneTwoAndThreeInputs) {
  for (int inputs = 1; inputs <= 3; ++inputs) {
    SCOPED_TRACE(inputs);
    Work work;
    work.kind = WorkKind::kElementwise;
    work.dtype = GetParam();
    work.elements = 1000003;  // 16-byte packs and a tail
    AllocateOperands(&work, inputs);
    ExpectRuns(work);
  }
}

TEST_P(CudaDeviceDTypeTest, ElementwiseUnalignedInPlaceAndAliased) {
  const int64_t elements = 4099;
  const int64_t size = DTypeSize(GetParam());
  Work work;
  work.kind = WorkKind::kElementwise;
  work.dtype = GetParam();
  work.elements = elements;
  // One element past a 16-byte boundary: the scalar path.
  const DevicePtr a = Alloc((elements + 1) * size), b = Alloc((elements + 1) * size),
                  out = Alloc((elements + 1) * size);
  work.inputs = {a + size, b + size};
  work.output = out + size;
  ExpectRuns(work);
  work.output = work.inputs[0];  // in place
  ExpectRuns(work);
  work.inputs = {a, a, b};  // x * x + y
  work.output = out;
  ExpectRuns(work);
}

TEST_P(CudaDeviceDTypeTest, RowKinds) {
  for (WorkKind kind : {WorkKind::kSoftmax, WorkKind::kLayerNorm, WorkKind::kReduce}) {
    for (int64_t cols : {1, 5, 1000, 20000}) {
      SCOPED_TRACE(std::string(validate::WorkKindName(kind)) + " cols " + std::to_string(cols));
      Work work;
      work.kind = kind;
      work.dtype = GetParam();
      work.rows = 7;
      work.cols = cols;
      AllocateOperands(&work);
      ExpectRuns(work);
      if (kind != WorkKind::kReduce) {
        work.output = work.inputs[0];  // in place
        ExpectRuns(work);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(FloatTypes, CudaDeviceDTypeTest,
                         ::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

TEST_F(CudaDeviceTest, ElementwiseOfNonFloatDTypesRunsAsBytes) {
  for (DType dtype : {DType::kInt64, DType::kBool, DType::kFloat64}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    Work work;
    work.kind = WorkKind::kElementwise;
    work.dtype = dtype;
    work.elements = 12345;
    AllocateOperands(&work, 2);
    ExpectRuns(work);
  }
}

TEST_F(CudaDeviceTest, WorkspaceBytesIsZeroForKindsThatNeedNone) {
  Work work;
  work.kind = WorkKind::kGemm;
  work.gemm = {1, 16, 16, 16};
  StatusOr<int64_t> ws = device_->WorkspaceBytes(work);
  ASSERT_TRUE(ws.ok()) << ws.status().ToString();
  EXPECT_EQ(*ws, 0);
}

// ---- Refusals ------------------------------------------------------------------------------

TEST_F(CudaDeviceTest, NonPositiveShapesAreInvalidArguments) {
  Work gemm;
  gemm.kind = WorkKind::kGemm;
  gemm.gemm = {1, 8, 8, 8};
  AllocateOperands(&gemm);
  gemm.gemm.m = 0;
  ExpectInvalid(gemm, "work.gemm.m");
  gemm.gemm.m = 8;
  gemm.gemm.batch = -1;
  ExpectInvalid(gemm, "work.gemm.batch");

  Work conv;
  conv.kind = WorkKind::kConvForward;
  conv.conv = SmallConv();
  conv.conv.k = 0;
  ExpectInvalid(conv, "work.conv.k");
  EXPECT_EQ(device_->WorkspaceBytes(conv).status().code(), StatusCode::kInvalidArgument);
  conv.conv = SmallConv();
  conv.conv.groups = 3;
  ExpectInvalid(conv, "work.conv.c");

  Work rows;
  rows.kind = WorkKind::kSoftmax;
  rows.rows = 4;
  rows.cols = 0;
  ExpectInvalid(rows, "work.cols");

  Work ew;
  ew.kind = WorkKind::kElementwise;
  ew.elements = -3;
  ExpectInvalid(ew, "work.elements");
  EXPECT_EQ(device_->Run(gemm, 0).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(CudaDeviceTest, BadOperandsAreInvalidArguments) {
  Work work;
  work.kind = WorkKind::kGemm;
  work.gemm = {1, 32, 32, 32};
  AllocateOperands(&work);
  Work missing = work;
  missing.inputs.pop_back();
  ExpectInvalid(missing, "work.inputs");
  Work too_small = work;
  too_small.gemm.k = 64;  // the operands were allocated for k = 32
  ExpectInvalid(too_small, "work.inputs[0]");
  Work in_place = work;
  in_place.output = in_place.inputs[0];  // cuBLAS cannot
  ExpectInvalid(in_place, "work.output");
  Work dtype = work;
  dtype.dtype = DType::kInt32;
  ExpectInvalid(dtype, "work.dtype");
  Work four;
  four.kind = WorkKind::kElementwise;
  four.elements = 16;
  AllocateOperands(&four, 3);
  four.inputs.push_back(four.inputs[0]);
  ExpectInvalid(four, "work.inputs");
}

}  // namespace
}  // namespace memest::kernels
