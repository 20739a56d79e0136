// The checks CudaDevice runs on a Work before anything reaches the GPU. Pure host code, so
// these run everywhere, GPU or not.
#include "kernels/work_check.h"

#include <gtest/gtest.h>

#include <string>

namespace memest::kernels {
namespace {

using validate::DevicePtr;
using validate::Work;
using validate::WorkKind;

// Two live allocations: 4 KiB at 0x10000 and 1 MiB at 0x100000.
const AllocationMap kAllocations = {{0x10000, 4096}, {0x100000, 1 << 20}};

void ExpectError(const Status& st, StatusCode code, const std::string& field) {
  EXPECT_EQ(st.code(), code) << st.ToString();
  EXPECT_NE(st.message().find(field), std::string::npos) << st.ToString();
}

Work Gemm(int64_t m, int64_t n, int64_t k) {
  Work w;
  w.kind = WorkKind::kGemm;
  w.gemm = {1, m, n, k};
  return w;
}

Work Conv() {
  Work w;
  w.kind = WorkKind::kConvForward;
  w.conv.n = 1;
  w.conv.c = 4;
  w.conv.h = 8;
  w.conv.w = 8;
  w.conv.k = 4;
  w.conv.r = 3;
  w.conv.s = 3;
  return w;
}

TEST(WorkCheckTest, ShapesMustBePositiveAndNamed) {
  EXPECT_TRUE(CheckShape(Gemm(8, 8, 8)).ok());
  ExpectError(CheckShape(Gemm(0, 8, 8)), StatusCode::kInvalidArgument, "work.gemm.m");
  ExpectError(CheckShape(Gemm(8, 8, -2)), StatusCode::kInvalidArgument, "work.gemm.k");
  ExpectError(CheckShape(Gemm(int64_t{1} << 32, 8, 8)), StatusCode::kFailedPrecondition,
              "work.gemm.m");

  EXPECT_TRUE(CheckShape(Conv()).ok());
  Work c = Conv();
  c.conv.stride_w = 0;
  ExpectError(CheckShape(c), StatusCode::kInvalidArgument, "work.conv.stride_w");
  c = Conv();
  c.conv.pad_h = -1;
  ExpectError(CheckShape(c), StatusCode::kInvalidArgument, "work.conv.pad_h");
  c = Conv();
  c.conv.groups = 3;
  ExpectError(CheckShape(c), StatusCode::kInvalidArgument, "work.conv.c");
  c = Conv();
  c.conv.r = 9;  // larger than the 8-row input, no padding
  ExpectError(CheckShape(c), StatusCode::kInvalidArgument, "work.conv");
  c.conv.stride_h = 2;  // (8 - 8 - 1) / 2 + 1 truncates to 1 output row: still refused
  ExpectError(CheckShape(c), StatusCode::kInvalidArgument, "work.conv");

  Work rows;
  rows.kind = WorkKind::kLayerNorm;
  rows.rows = 3;
  rows.cols = 0;
  ExpectError(CheckShape(rows), StatusCode::kInvalidArgument, "work.cols");
}

TEST(WorkCheckTest, OnlyElementwiseRunsNonFloatDTypes) {
  Work ew;
  ew.kind = WorkKind::kElementwise;
  ew.elements = 10;
  ew.dtype = DType::kInt64;
  EXPECT_TRUE(CheckShape(ew).ok());
  ew.elements = int64_t{1} << 60;  // 2^63 bytes would overflow BytesNeeded
  ExpectError(CheckShape(ew), StatusCode::kInvalidArgument, "work.elements");
  Work sm;
  sm.kind = WorkKind::kSoftmax;
  sm.rows = sm.cols = 4;
  sm.dtype = DType::kInt32;
  ExpectError(CheckShape(sm), StatusCode::kInvalidArgument, "work.dtype");
}

TEST(WorkCheckTest, OperandsMustLieInsideOneAllocation) {
  EXPECT_TRUE(CheckInsideAllocation(0x10000, 4096, kAllocations, "p").ok());
  EXPECT_TRUE(CheckInsideAllocation(0x10ff0, 16, kAllocations, "p").ok());
  ExpectError(CheckInsideAllocation(0x10ff0, 17, kAllocations, "p"),
              StatusCode::kInvalidArgument, "p: 17 B at 0x10ff0");
  ExpectError(CheckInsideAllocation(0x8000, 16, kAllocations, "p"), StatusCode::kInvalidArgument,
              "p");
  ExpectError(CheckInsideAllocation(0, 16, kAllocations, "p"), StatusCode::kInvalidArgument,
              "null");

  Work g = Gemm(16, 16, 16);  // A, B, C of 1 KiB each in float32
  g.inputs = {0x100000, 0x100400};
  g.output = 0x100800;
  EXPECT_TRUE(CheckOperands(g, kAllocations).ok());
  g.inputs[1] = 0x10c00;  // B's last 1 KiB of the 4 KiB allocation: inside
  EXPECT_TRUE(CheckOperands(g, kAllocations).ok());
  g.inputs[1] = 0x10e00;  // runs 512 B past it
  ExpectError(CheckOperands(g, kAllocations), StatusCode::kInvalidArgument, "work.inputs[1]");
  g.inputs.pop_back();
  ExpectError(CheckOperands(g, kAllocations), StatusCode::kInvalidArgument, "work.inputs");
}

TEST(WorkCheckTest, FloatOperandsMustBeAlignedToTheirElements) {
  Work g = Gemm(16, 16, 16);
  g.inputs = {0x100002, 0x100400};  // float32 A two bytes off
  g.output = 0x100800;
  ExpectError(CheckOperands(g, kAllocations), StatusCode::kInvalidArgument, "work.inputs[0]");
  g.dtype = DType::kFloat16;  // two bytes is a whole float16 element
  EXPECT_TRUE(CheckOperands(g, kAllocations).ok());
  g.output = 0x100801;
  ExpectError(CheckOperands(g, kAllocations), StatusCode::kInvalidArgument, "work.output");

  Work ew;  // non-float elementwise runs as bytes: any address
  ew.kind = WorkKind::kElementwise;
  ew.dtype = DType::kInt32;
  ew.elements = 10;
  ew.inputs = {0x100001};
  ew.output = 0x100103;
  EXPECT_TRUE(CheckOperands(ew, kAllocations).ok());
}

TEST(WorkCheckTest, OverlapsAreRefusedExceptSharedInputsAndInPlace) {
  Work g = Gemm(16, 16, 16);
  g.inputs = {0x100000, 0x100000};  // A @ A
  g.output = 0x100800;
  EXPECT_TRUE(CheckOperands(g, kAllocations).ok());
  g.inputs = {0x100000, 0x100200};  // B starts inside A
  ExpectError(CheckOperands(g, kAllocations), StatusCode::kInvalidArgument, "work.inputs[1]");
  g.inputs = {0x100000, 0x100400};
  g.output = 0x100000;  // cuBLAS cannot run in place
  ExpectError(CheckOperands(g, kAllocations), StatusCode::kInvalidArgument, "work.output");

  Work sm;
  sm.kind = WorkKind::kSoftmax;
  sm.rows = 4;
  sm.cols = 64;
  sm.inputs = {0x100000};
  sm.output = 0x100000;  // in place
  EXPECT_TRUE(CheckOperands(sm, kAllocations).ok());
  sm.output = 0x100004;  // shifted by one element: not in place, an overlap
  ExpectError(CheckOperands(sm, kAllocations), StatusCode::kInvalidArgument, "work.output");

  Work red;
  red.kind = WorkKind::kReduce;
  red.rows = 4;
  red.cols = 64;
  red.inputs = {0x100000};
  red.output = 0x100000;  // rows would write into a row another block is still reading
  ExpectError(CheckOperands(red, kAllocations), StatusCode::kInvalidArgument, "work.output");
}

TEST(WorkCheckTest, WorkspaceInsideAlignedForCublasAndApart) {
  Work g = Gemm(16, 16, 16);
  g.inputs = {0x100000, 0x100400};
  g.output = 0x100800;
  g.workspace = 0x101000;
  g.workspace_bytes = 4096;
  EXPECT_TRUE(CheckOperands(g, kAllocations).ok());
  g.workspace = 0x101010;  // not 256-byte aligned
  ExpectError(CheckOperands(g, kAllocations), StatusCode::kInvalidArgument, "work.workspace");
  g.workspace = 0x100400;  // on top of B
  ExpectError(CheckOperands(g, kAllocations), StatusCode::kInvalidArgument, "work.workspace");
  g.workspace_bytes = -1;
  ExpectError(CheckOperands(g, kAllocations), StatusCode::kInvalidArgument,
              "work.workspace_bytes");
}

}  // namespace
}  // namespace memest::kernels
