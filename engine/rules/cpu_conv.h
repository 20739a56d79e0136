// What a convolution allocates inside itself on PyTorch 1.13's CPU path: the scratch within
// aten::convolution and aten::convolution_backward that no graph tensor accounts for.
//
// Float32 convolutions go to oneDNN (2.6.3 in Debian's build) unless ATen's
// ConvParams::use_mkldnn sends them to the native im2col kernels (THNN). oneDNN reorders the
// plain NCHW operands into channel-blocked layouts (16 channels per block with AVX-512, 8 with
// AVX2), books a scratchpad, writes a blocked result and ATen copies it out to a plain tensor.
// Which kernel runs, and so what is allocated, depends on the CPU's vector ISA; the rule was
// measured allocation by allocation with torch.profiler on a 9,722-point grid per ISA
// (tests/conformance/conv_scratch/RULE.md) with one thread: the thread count changes both the
// dispatch (use_mkldnn takes 1x1 kernels when multi-threaded) and per-thread buffers.
#ifndef MEMEST_ENGINE_RULES_CPU_CONV_H_
#define MEMEST_ENGINE_RULES_CPU_CONV_H_

#include <cstdint>
#include <vector>

#include "engine/ir/config.h"

namespace memest {

// One convolution, 1-D given as 2-D with h = kh = oh = 1 (as aten's view1d_as_2d runs it).
// Transposed: ci and h, w are the input's, co and oh, ow the output's (the weight is
// [ci, co / groups, kh, kw]).
struct CpuConvProblem {
  int64_t n = 1, ci = 1, co = 1, groups = 1;
  int64_t h = 1, w = 1;    // input spatial extent
  int64_t kh = 1, kw = 1;  // kernel
  int64_t oh = 1, ow = 1;  // output
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
  int64_t element_bytes = 4;  // float32; float64 never reaches oneDNN
  bool bias = false;
  bool input_grad = false;   // backward computes the input's gradient
  bool weight_grad = false;  // backward computes the weight's (and bias') gradient
  bool transposed = false;   // conv_transpose (the weight is [ci, co / groups, kh, kw])
  // The input is channels-last (mkldnn_conv_use_channels_last): ATen runs the convolution in
  // that memory format (cpu_conv_nhwc.cc).
  bool channels_last = false;
  // The per-core caches oneDNN blocks by: Xbyak's figures, or its defaults where Xbyak reports
  // none (src/cpu/platform.cpp, get_per_core_cache_size).
  int64_t l1_bytes = 32 * 1024;
  int64_t l2_bytes = 512 * 1024;
};

// Allocation events in program order: +bytes allocates, -bytes frees the allocation of that
// size made most recently. The forward's net is the output; the backward's net is the
// gradients it returns (input, weight, bias).
struct CpuConvTrace {
  std::vector<int64_t> forward;
  std::vector<int64_t> backward;
  const char* forward_kernel = "";  // "oneDNN jit blocked", "native im2col", ...
  const char* scratch = "";         // what the scratch is: "oneDNN reorders and scratchpad", ...
  // The weight's gradient comes back channels-last while the weight is not: AccumulateGrad
  // then copies it into the weight's layout (the engine does, from the gradient's strides;
  // not part of `backward`).
  bool weight_grad_channels_last = false;
};

// Whether a [co, ci/g, kh, kw] weight is contiguous in channels-last as well as row-major (a
// 1x1 kernel, or one input channel per group): weight.contiguous(channels_last) copies nothing.
inline bool WeightIsChannelsLastToo(const CpuConvProblem& p) {
  const int64_t per_group = p.transposed ? p.co / p.groups : p.ci / p.groups;
  return (p.kh == 1 && p.kw == 1) || per_group == 1;
}

// The sequence PyTorch 1.13 runs for `p` on a CPU whose oneDNN dispatches with `isa`.
CpuConvTrace CpuConvAllocations(const CpuConvProblem& p, CpuIsa isa);

// The highest running total of `events` (from 0 before the first), and where it ends.
struct EventPeak {
  int64_t peak = 0;
  int64_t net = 0;
};
EventPeak PeakOfEvents(const std::vector<int64_t>& events);

}  // namespace memest

#endif  // MEMEST_ENGINE_RULES_CPU_CONV_H_
