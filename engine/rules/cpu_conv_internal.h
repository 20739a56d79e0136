// The pieces of the CPU convolution rule (cpu_conv.h) its files share: cpu_conv.cc (the
// row-major NCHW traces) and cpu_conv_nhwc.cc (channels-last inputs). Internal to engine/rules.
#ifndef MEMEST_ENGINE_RULES_CPU_CONV_INTERNAL_H_
#define MEMEST_ENGINE_RULES_CPU_CONV_INTERNAL_H_

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "engine/ir/config.h"
#include "engine/rules/cpu_conv.h"

namespace memest {
namespace cpu_conv_internal {

int64_t RoundUp(int64_t x, int64_t m);

// oneDNN books a user scratchpad as one allocation; each entry in it costs its size plus 128
// bytes of alignment slack.
int64_t Scratchpad(std::initializer_list<int64_t> entries);

// Appends the allocations (in order), then the frees (in order), skipping empty ones.
void AllocThenFree(std::vector<int64_t>* seq, std::initializer_list<int64_t> allocs,
                   std::initializer_list<int64_t> frees);

// ConvParams::use_mkldnn (aten/src/ATen/native/Convolution.cpp) for a CPU input, one thread.
bool UsesOneDnn(const CpuConvProblem& p);

// The native kernels' sequence (slow_conv2d, slow_conv_dilated2d, the loop over groups).
void NativeTrace(const CpuConvProblem& p, CpuConvTrace* t);

// A channels-last input (cpu_conv_nhwc.cc): the native kernels in channels-last, or oneDNN's
// nhwc kernels.
void ChannelsLastTrace(const CpuConvProblem& p, CpuIsa isa, CpuConvTrace* t);

}  // namespace cpu_conv_internal
}  // namespace memest

#endif  // MEMEST_ENGINE_RULES_CPU_CONV_INTERNAL_H_
