// A convolution whose input is channels-last on PyTorch 1.13's CPU path: what ConvNeXt's
// LayerNorm2d (permute, layer_norm, permute back) hands its convolutions, and what a model
// converted with .to(memory_format=torch.channels_last) runs.
//
// ATen (Convolution.cpp, mkldnn/Conv.cpp): determine_backend_memory_format picks
// channels-last when mkldnn_conv_use_channels_last(input, weight), and _convolution calls the
// backend on input.contiguous(channels_last) (no copy) and weight.contiguous(channels_last):
// a copy of the weight, live while the convolution runs, unless the weight is channels-last
// already (1x1, or one input channel per group). The output is allocated channels-last and
// written in place: no blocked result, no copy out. mkldnn_convolution_backward makes the
// weight channels-last again, the input's gradient is channels-last, and the weight's gradient
// is oneDNN's (blocked) result turned dense (mkldnn_to_dense) and then .to(channels_last) (a
// second copy); AccumulateGrad copies that into the weight's own layout.
//
// oneDNN 2.6.3 runs nhwc problems with other kernels than nChw16c ones (ONEDNN_VERBOSE):
// forward brgconv (ungrouped; its scratchpad is the brgemm batch, one 4 KiB page plus 4 KiB of
// alignment) and brdgmm_dw (depthwise, a 4,224-byte scratchpad), backward data and weights the
// jit kernels with nxc layouts. The weights are reordered into blocked layouts: forward
// Ohwi{16,32,48,64}o (output channels padded to the block brgconv picks: 16 up to 16 channels,
// else most often 32; its choice is a cost model not reproduced, so 48 channels may be padded
// to 64 where oneDNN took 48: an over-count), backward data OIhw16o16i, backward weights
// OIhw16i16o per group: a depthwise kernel wider than 3 (which jit_uni_dw refuses) is computed
// by the grouped jit kernel into 16 x 16 blocks per group, 256 times the weight. AVX2 runs the
// same with 8-channel blocks and no brgemm kernels (no forward scratchpad).
//
// The native kernels (ConvParams::use_mkldnn declines: small single images, 1x1 stride-1 below
// a batch of 16) run channels-last too (slow_conv2d's channels-last path): the same sequence as
// row-major, inside the weight's copy.
//
// Measured allocation by allocation (tests/conformance/conv_scratch/probe.py, `cl` points):
// AVX-512 536 oneDNN problems, backward exact for all, forward for 499 (the misses over-count
// brgconv's padding or a scratchpad the library managed itself); native 276 of 276.
#include <algorithm>

#include "engine/rules/cpu_conv_internal.h"
#include "engine/rules/cpu_conv_kernels.h"

namespace memest {
namespace cpu_conv_internal {
namespace {

void OneDnnChannelsLast(const CpuConvProblem& p, CpuIsa isa, int64_t clone, CpuConvTrace* t) {
  const bool avx512 = isa == CpuIsa::kAvx512;
  const int64_t blk = avx512 ? 16 : 8;
  const int64_t e = p.element_bytes;
  const int64_t k = p.kh * p.kw, ohw = p.oh * p.ow;
  const int64_t cig = p.ci / p.groups, cog = p.co / p.groups;
  const int64_t x = p.n * p.ci * p.h * p.w * e, y = p.n * p.co * ohw * e;
  const int64_t wt = p.co * cig * k * e, b = p.co * e;
  const bool depthwise = p.groups > 1 && cig == 1 && cog == 1;
  // jit_1x1 reduces a strided 1x1 to unit stride by copying the input's pixels it reads.
  const bool jit_1x1 = p.kh == 1 && p.kw == 1 && p.pad_h == 0 && p.pad_w == 0 &&
                       p.h % p.oh == 0 && p.w % p.ow == 0;
  const bool strided = p.stride_h > 1 || p.stride_w > 1;
  const int64_t rtus = jit_1x1 && strided ? p.ci * ohw * e : 0;
  // Input channels stay unpadded for the first convolution (fewer than a block), except in
  // the 1x1 kernels.
  const int64_t ic_pad = cig < blk && !jit_1x1 ? cig : RoundUp(cig, blk);
  std::vector<int64_t>& f = t->forward;
  std::vector<int64_t>& bw = t->backward;

  // ---- forward: the weight's copy, the output, the kernel's scratchpad and weights
  if (depthwise) {
    const int64_t w_dw = RoundUp(p.co, blk) * k * e;
    t->forward_kernel = avx512 ? "oneDNN brdgmm depthwise (nhwc)" : "oneDNN jit depthwise (nhwc)";
    AllocThenFree(&f, {y, avx512 ? int64_t{4224} : 0, w_dw}, {w_dw, avx512 ? int64_t{4224} : 0});
  } else {
    const int64_t oc_block = avx512 ? (cog <= 16 ? 16 : 32) : 8;
    const int64_t w_fwd = p.groups * RoundUp(cog, oc_block) * (avx512 ? cig : ic_pad) * k * e;
    // brgemm's batch elements (4 KiB and 4 KiB of alignment); AVX2's jit_1x1 its unit-stride
    // copy of the input.
    const int64_t scratch = avx512 ? 8192 : (rtus > 0 ? rtus + 128 : 0);
    t->forward_kernel = avx512 ? "oneDNN brgconv (nhwc)" : "oneDNN jit (nhwc)";
    AllocThenFree(&f, {clone, y, scratch, w_fwd}, {w_fwd, scratch, clone});
  }

  // ---- backward: the weight's copy again, the input's gradient, the weights' gradient
  if (clone > 0) bw.push_back(clone);
  if (p.input_grad) {
    const int64_t w_data = depthwise ? RoundUp(p.co, blk) * k * e
                                     : p.groups * RoundUp(cog, blk) * RoundUp(cig, blk) * k * e;
    bw.push_back(x);
    AllocThenFree(&bw, {w_data, rtus > 0 ? rtus + 128 : 0}, {rtus > 0 ? rtus + 128 : 0, w_data});
  }
  if (p.weight_grad) {
    const bool dw_jit = depthwise && DepthwiseBackwardWeightsTakes(p);
    const int64_t gw_blocked = depthwise ? (dw_jit ? RoundUp(p.co, blk) * k * e
                                                   : p.groups * blk * blk * k * e)
                                         : p.groups * RoundUp(cog, blk) * ic_pad * k * e;
    // The bias' gradient is reduced into a padded buffer when the output channels do not fill
    // the blocks (per group for the grouped jit kernel: every group is padded to a block).
    int64_t padded_bias = 0;
    if (p.bias && depthwise && !dw_jit) padded_bias = p.groups * blk * e;
    if (p.bias && !depthwise && p.co % blk != 0) padded_bias = RoundUp(p.co, blk) * e;
    const int64_t scratch = Scratchpad({rtus, padded_bias});
    bw.push_back(gw_blocked);
    if (scratch > 0) bw.push_back(scratch);
    if (p.bias) bw.push_back(b);  // diff_bias
    if (scratch > 0) bw.push_back(-scratch);
    if (p.bias) bw.push_back(b);  // the bias gradient ATen returns
    // mkldnn_to_dense, then .to(channels_last); the dense one and the blocked one go.
    bw.insert(bw.end(), {wt, wt, -wt, -gw_blocked});
    if (p.bias) bw.push_back(-b);
  }
  if (clone > 0) bw.push_back(-clone);
  t->scratch = "channels-last weight copy, oneDNN reorders and scratchpad";
}

}  // namespace

void ChannelsLastTrace(const CpuConvProblem& p, CpuIsa isa, CpuConvTrace* t) {
  const int64_t e = p.element_bytes;
  const int64_t clone = WeightIsChannelsLastToo(p) ? 0 : p.co * (p.ci / p.groups) * p.kh * p.kw * e;
  t->weight_grad_channels_last = clone > 0 && p.weight_grad;
  if (UsesOneDnn(p)) {
    OneDnnChannelsLast(p, isa, clone, t);
    return;
  }
  // Native: the row-major sequence inside the weight's copy (forward and backward each).
  CpuConvTrace inner;
  NativeTrace(p, &inner);
  t->forward_kernel = inner.forward_kernel;
  t->scratch = clone > 0 ? "channels-last weight copy, im2col columns" : inner.scratch;
  for (std::vector<int64_t>* seq : {&t->forward, &t->backward}) {
    const std::vector<int64_t>& body = seq == &t->forward ? inner.forward : inner.backward;
    if (clone > 0) seq->push_back(clone);
    seq->insert(seq->end(), body.begin(), body.end());
    if (clone > 0) seq->push_back(-clone);
  }
}

}  // namespace cpu_conv_internal
}  // namespace memest
