// One entry per benchmark, one file each; CudaDevice::Run dispatches on WorkKind to these.
//
// Each takes a Work that work_check.h has accepted (positive shapes, a dtype the kind runs,
// the operands it needs, inside live allocations, not overlapping except as allowed), builds a
// Bench (harness.h) and hands it to RunBench: inputs filled with their patterns (pattern.h),
// warm-up, the median of `repeats` timed runs on ctx.stream, then a check of a sample of the
// output against a host reference computed from the same patterns. The inputs' contents are
// overwritten; the output holds the checked result afterwards.
#ifndef MEMEST_KERNELS_BENCHMARKS_H_
#define MEMEST_KERNELS_BENCHMARKS_H_

#include "kernels/harness.h"

namespace memest::kernels {

// gemm.cu: C[batch, m, n] = A[batch, m, k] @ B[batch, k, n], row-major, with
// cublasGemmStridedBatchedEx at float32 compute (no TF32, PyTorch's default for matmul). With
// workspace_bytes > 0 cuBLAS gets work.workspace (cublasSetWorkspace, as PyTorch gives it one
// from its allocator); with 0 it uses the handle's default workspace.
StatusOr<Timing> RunGemm(const KernelContext& ctx, const Work& work, int repeats);

// conv.cu: the three convolution kinds through cuDNN's legacy API, NCHW, with groups and
// dilation, float compute; math type as PyTorch sets it (default for float32, which allows
// TF32 on sm_80+, as torch.backends.cudnn.allow_tf32 does by default; tensor-op math for
// float16). The algorithm is PyTorch's with cudnn.benchmark=False: the first one the
// cudnnGet*Algorithm_v7 heuristics list with status success.
//
// ConvWorkspaceBytes: that algorithm's workspace (its perf.memory, what PyTorch allocates).
StatusOr<int64_t> ConvWorkspaceBytes(const KernelContext& ctx, const Work& work);
// RunConv: runs the first listed algorithm whose workspace fits work.workspace_bytes (PyTorch
// moves on the same way when a workspace allocation fails, or when cuDNN refuses to run one).
StatusOr<Timing> RunConv(const KernelContext& ctx, const Work& work, int repeats);

// elementwise.cu: out[i] = in0[i] * in1[i] + in2[i] over work.elements, computed in float for
// the float dtypes; a missing in1 is 0.5 and a missing in2 is 0.25 (so one input gives
// in0 * 0.5 + 0.25). Other dtypes run as raw bytes (elements * size of them) with the same
// formula in 8-bit integers (missing in1 = 3, in2 = 1), so the memory traffic is the op's.
// 16-byte vector loads and stores when every operand is 16-byte aligned. out may be in0.
StatusOr<Timing> RunElementwise(const KernelContext& ctx, const Work& work, int repeats);

// softmax.cu: out[r, :] = softmax(in[r, :]) over [rows, cols]; one block per row, float
// accumulation (max, sum of exp, scale). out may be in.
StatusOr<Timing> RunSoftmax(const KernelContext& ctx, const Work& work, int repeats);

// layernorm.cu: out[r, :] = (in[r, :] - mean) / sqrt(var + 1e-5), biased variance, no affine
// parameters (Work carries none); one block per row, float accumulation, two passes for the
// statistics. out may be in.
StatusOr<Timing> RunLayerNorm(const KernelContext& ctx, const Work& work, int repeats);

// reduce.cu: out[r] = sum of in[r, :] over [rows, cols]; one block per row, float
// accumulation, output in the input dtype.
StatusOr<Timing> RunReduce(const KernelContext& ctx, const Work& work, int repeats);

// For the probe: one tiny call each (an 8x8x8 float32 GEMM; a 1x1x8x8 by 3x3 float32
// convolution with an algorithm that needs no workspace) so that a library's first-call
// allocations land inside the measurement of its handle. `scratch` holds at least 4 KiB.
// Synchronous.
Status TinyGemm(const KernelContext& ctx, DevicePtr scratch);
Status TinyConv(const KernelContext& ctx, DevicePtr scratch);

}  // namespace memest::kernels

#endif  // MEMEST_KERNELS_BENCHMARKS_H_
