// Which of oneDNN 2.6.3's x64 float32 convolution kernels accept a problem, and how large the
// gemm kernel's im2col buffer is: the parts of each kernel's init_conf (src/cpu/x64/
// jit_avx512_common_conv_kernel.cpp, jit_avx2_conv_kernel_f32.cpp, jit_sse41_conv_kernel_f32.cpp,
// jit_uni_dw_conv_kernel_utils.cpp, src/cpu/gemm_convolution_utils.cpp) that decide whether the
// kernel returns `unimplemented`, for the plain NCHW tensors PyTorch 1.13 hands over with one
// thread. oneDNN tries its kernels in the order of src/cpu/cpu_convolution_list.cpp and takes
// the first that accepts: on an AVX-512 machine the AVX-512 kernel, then the AVX2 one (8-channel
// blocks), then SSE4.1's, then gemm. cpu_conv.cc turns the choice into allocations.
//
// The kernels refuse a problem by boundary conditions of their own: a padding larger than the
// output columns one register block computes (ur_w), a kernel that reaches entirely into the
// padding, a dilated kernel taller than the input (DeepLab's ASPP: 3x3 kernels dilated by 12 to
// 36 on a 4x4 map), kernels wider than 3 in the depthwise backward-weights kernel (MobileNetV3's
// and EfficientNet's 5x5), any dilation in the depthwise backward-data kernel.
//
// Cache sizes: oneDNN sizes some register blocks and gemm's im2col block from the per-core L1
// and L2 caches as Xbyak reports them, or, where Xbyak reports none (as on the AMD EPYC machine
// CI measures on), from its defaults, 32 KiB and 512 KiB (src/cpu/platform.cpp,
// get_per_core_cache_size). memest takes CpuConvProblem's l1_bytes and l2_bytes (the run's
// cpu_l1_bytes / cpu_l2_bytes; the defaults when unset): on an Intel Sapphire Rapids (48 KiB,
// 2 MiB) DeepLab's ASPP convolution blocks all 512 channels of its im2col buffer, not 256.
#ifndef MEMEST_ENGINE_RULES_CPU_CONV_KERNELS_H_
#define MEMEST_ENGINE_RULES_CPU_CONV_KERNELS_H_

#include <cstdint>

#include "engine/ir/config.h"
#include "engine/rules/cpu_conv.h"

namespace memest {

// Ungrouped convolutions, not 1x1 (jit_1x1 has its own rules in cpu_conv.cc).
// jit_avx512_common_conv_fwd_kernel::init_conf (also the first convolution, Ci < 16).
bool Avx512DirectForwardTakes(const CpuConvProblem& p);
// jit_avx2_conv_fwd_kernel_f32::init_conf; jit_sse41_conv_fwd_kernel_f32 checks the same.
bool Avx2DirectForwardTakes(const CpuConvProblem& p);
// jit_avx512_common_conv_bwd_data_kernel_f32::init_conf.
bool Avx512DirectBackwardDataTakes(const CpuConvProblem& p);
// jit_avx2_conv_bwd_data_kernel_f32::init_conf: it searches a register blocking of the input
// width and refuses blockings whose tails it cannot handle (most strided 1-D convolutions, given
// as 2-D with unequal strides; 3x3 stride-2 ones whose output does not reach the last column).
bool Avx2DirectBackwardDataTakes(const CpuConvProblem& p);
// jit_avx512_common_conv_bwd_weights_kernel_f32::init_conf (Ci >= 16, or the first convolution
// with Ci <= 3).
bool Avx512DirectBackwardWeightsTakes(const CpuConvProblem& p);
// jit_avx2_conv_bwd_weights_kernel_f32::init_conf (what AVX-512 hands 4..15 input channels to):
// no dilation, kernels narrower than 14 and no taller than the input, paddings smaller than the
// kernel.
bool Avx2DirectBackwardWeightsTakes(const CpuConvProblem& p);

// Depthwise (groups == Ci == Co): jit_uni_dw_conv_{fwd,bwd_data,bwd_weights}_kernel::init_conf.
// A problem the AVX-512 kernel refuses, its AVX2 and SSE4.1 instances refuse too (their
// register blocks are narrower), and oneDNN takes gemm.
bool DepthwiseForwardTakes(const CpuConvProblem& p, CpuIsa isa);
bool DepthwiseBackwardDataTakes(const CpuConvProblem& p);
bool DepthwiseBackwardWeightsTakes(const CpuConvProblem& p);

// gemm_convolution_fwd_t's im2col buffer, in elements, for one group: init_conf blocks the input
// channels and output pixels of the column matrix to fit the L2 cache (the `try_cfg` search,
// one thread), so a wide convolution gets ic_block * k * os_block elements, not Ci/g * k * oh *
// ow. 0 when no im2col is needed (a 1x1, unit-stride, unpadded problem).
int64_t GemmForwardColumns(const CpuConvProblem& p, CpuIsa isa);

// gemm_convolution_bwd_{data,weights}_t's im2col buffer, in elements: the whole Ci/g * k * oh *
// ow, unless that overflows the scratchpad limit init_conf sets (the smaller of 1 GiB and 15x the
// source, weights and destination together), less what is already booked (backward weights:
// the weight-reduction buffer); then os_block output pixels, a tenth (data) or a twentieth
// (weights) of what would fit, at least one vector.
int64_t GemmBackwardColumns(const CpuConvProblem& p, CpuIsa isa, bool weights);

}  // namespace memest

#endif  // MEMEST_ENGINE_RULES_CPU_CONV_KERNELS_H_
