#include "engine/rules/cpu_conv.h"

#include <algorithm>
#include <initializer_list>

#include "engine/rules/cpu_conv_internal.h"
#include "engine/rules/cpu_conv_kernels.h"

namespace memest {
namespace cpu_conv_internal {

int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// oneDNN books a user scratchpad as one allocation; each entry in it costs its size plus 128
// bytes of alignment slack.
int64_t Scratchpad(std::initializer_list<int64_t> entries) {
  int64_t total = 0;
  for (int64_t e : entries) {
    if (e > 0) total += e + 128;
  }
  return total;
}

// Appends the allocations (in order), then the frees (in order), skipping empty ones.
void AllocThenFree(std::vector<int64_t>* seq, std::initializer_list<int64_t> allocs,
                   std::initializer_list<int64_t> frees) {
  for (int64_t a : allocs) {
    if (a > 0) seq->push_back(a);
  }
  for (int64_t f : frees) {
    if (f > 0) seq->push_back(-f);
  }
}

// aten/src/ATen/native/Convolution.cpp, ConvParams::use_mkldnn for a float32 CPU input with
// one thread: 1x1 stride-1 kernels stay native below a batch of 16 ("THNN is faster when
// single-threaded"), and so do small single-sample inputs with kernels up to 3x3.
bool UsesOneDnn(const CpuConvProblem& p) {
  if (p.element_bytes != 4) return false;  // float64 (and anything but float32) stays native
  const bool strided = p.stride_h != 1 || p.stride_w != 1;
  const bool dilated = p.dil_h != 1 || p.dil_w != 1;
  const bool c1 = strided || dilated || p.n >= 16 || p.kh != 1 || p.kw != 1;
  const bool c2 = p.groups > 1 || (p.kh > 3 && p.kw > 3) || p.n > 1 || p.n * p.ci * p.h * p.w > 20480;
  return c1 && c2;
}

// The native kernels: slow_conv2d (im2col over the whole batch), slow_conv_dilated2d (per
// image), and for groups > 1 at::_convolution's loop over groups followed by a cat.
void NativeTrace(const CpuConvProblem& p, CpuConvTrace* t) {
  const int64_t e = p.element_bytes;
  const int64_t k = p.kh * p.kw, hw = p.h * p.w, ohw = p.oh * p.ow;
  const int64_t cig = p.ci / p.groups, cog = p.co / p.groups;
  const int64_t x = p.n * p.ci * hw * e, y = p.n * p.co * ohw * e;
  const int64_t wt = p.co * cig * k * e, b = p.co * e;
  const bool dilated = p.dil_h != 1 || p.dil_w != 1;
  const bool unit = k == 1 && p.stride_h == 1 && p.stride_w == 1 && p.pad_h == 0 && p.pad_w == 0;
  const bool cols_needed = !(unit && !dilated);
  const int64_t cols = (dilated ? 1 : p.n) * cig * k * ohw * e;
  std::vector<int64_t>& f = t->forward;
  std::vector<int64_t>& bw = t->backward;
  t->forward_kernel = "native im2col";
  t->scratch = "im2col columns";
  auto cols_pass = [&](std::vector<int64_t>* seq) {
    if (cols_needed) seq->insert(seq->end(), {cols, -cols});
  };
  // Forward: the columns are unfolded, then the output (or a group's) is computed from them.
  auto forward_through_cols = [&](int64_t out) {
    if (cols_needed) {
      f.insert(f.end(), {cols, out, -cols});
    } else {
      f.push_back(out);
    }
  };
  if (p.groups == 1 && dilated) {  // slow_conv_dilated2d
    f.insert(f.end(), {y, cols, -cols});
    if (p.input_grad) bw.push_back(x);
    if (p.weight_grad) {
      bw.push_back(wt);
      if (p.bias) bw.push_back(b);
    }
    bw.push_back(cols);
    if (p.weight_grad && p.bias) bw.insert(bw.end(), {b, -b});
    bw.push_back(-cols);
    return;
  }
  if (p.groups == 1) {  // slow_conv2d
    forward_through_cols(y);
    if (p.input_grad) bw.push_back(x);
    if (p.weight_grad) {
      if (p.bias) bw.push_back(b);
      bw.push_back(wt);
    }
    cols_pass(&bw);
    return;
  }
  // Per group: narrow(1, ...) of an NCHW tensor is contiguous only for one sample; otherwise
  // each group's input (and in backward its output gradient) is copied out.
  const bool slice_copy = p.n > 1;
  const int64_t xg = p.n * cig * hw * e, yg = p.n * cog * ohw * e;
  const int64_t gw = cog * cig * k * e, gb = cog * e;
  for (int64_t g = 0; g < p.groups; ++g) {
    if (slice_copy) f.push_back(xg);
    forward_through_cols(yg);
    if (slice_copy) f.push_back(-xg);
  }
  f.push_back(y);
  f.insert(f.end(), p.groups, -yg);
  for (int64_t g = 0; g < p.groups; ++g) {
    if (slice_copy) bw.insert(bw.end(), {yg, xg});
    if (p.input_grad) bw.push_back(xg);
    if (p.weight_grad) {
      if (p.bias) bw.push_back(gb);
      bw.push_back(gw);
    }
    cols_pass(&bw);
    if (slice_copy) bw.insert(bw.end(), {-xg, -yg});
  }
  if (p.input_grad) bw.push_back(x);
  if (p.weight_grad) {
    bw.push_back(wt);
    if (p.bias) {
      bw.push_back(b);
      bw.insert(bw.end(), p.groups, -gb);
    }
    bw.insert(bw.end(), p.groups, -gw);
  }
  if (p.input_grad) bw.insert(bw.end(), p.groups, -xg);
}

}  // namespace cpu_conv_internal

namespace {

using cpu_conv_internal::AllocThenFree;
using cpu_conv_internal::NativeTrace;
using cpu_conv_internal::RoundUp;
using cpu_conv_internal::Scratchpad;
using cpu_conv_internal::UsesOneDnn;

// One oneDNN primitive's buffers: the reordered (blocked) inputs, its blocked result and its
// scratchpad. 0: not needed (the operand is used in its plain layout).
struct Primitive {
  int64_t a = 0, b = 0;  // reordered operands: (src, weights) forward, (diff_dst, weights /
                         // src) backward
  int64_t result = 0;    // blocked destination, or the plain one for gemm
  int64_t scratch = 0;
};

void OneDnnTrace(const CpuConvProblem& p, CpuIsa isa, CpuConvTrace* t) {
  t->scratch = "oneDNN reorders and scratchpad";
  const int64_t e = p.element_bytes;
  const int64_t blk = isa == CpuIsa::kAvx512 ? 16 : 8;
  const int64_t k = p.kh * p.kw, hw = p.h * p.w, ohw = p.oh * p.ow;
  const int64_t x = p.n * p.ci * hw * e, y = p.n * p.co * ohw * e;
  const int64_t wt = p.co * (p.ci / p.groups) * k * e, b = p.co * e;
  auto xb = [&](int64_t c) { return p.n * RoundUp(p.ci, c) * hw * e; };
  auto yb = [&](int64_t c) { return p.n * RoundUp(p.co, c) * ohw * e; };
  auto wb = [&](int64_t c) { return RoundUp(p.co, c) * RoundUp(p.ci, c) * k * e; };
  auto w_first = [&](int64_t c) { return RoundUp(p.co, c) * p.ci * k * e; };  // Ohwi16o / Ohwi8o
  const int64_t w_dw = RoundUp(p.co, blk) * k * e;            // depthwise Goihw16g / 8g
  auto padded_bias = [&](int64_t c) { return p.bias && p.co % c ? RoundUp(p.co, c) * e : 0; };
  // gemm's im2col buffer (one image), blocked over channels and pixels (cpu_conv_kernels.h).
  const int64_t fwd_col = GemmForwardColumns(p, isa) * e;
  const bool strided = p.stride_h > 1 || p.stride_w > 1;
  const bool one_by_one = k == 1;
  // A padding at least the kernel's extent (only met as 1x1 with padding): gemm.
  const bool pad_covers_kernel = (p.pad_h > 0 && p.pad_h >= p.dil_h * (p.kh - 1) + 1) ||
                                 (p.pad_w > 0 && p.pad_w >= p.dil_w * (p.kw - 1) + 1);
  const bool depthwise = p.groups > 1 && p.groups == p.ci && p.groups == p.co;
  // Grouped, not depthwise: oneDNN pads no channels then, so a blocked operand is as large as
  // the plain one. The block is the channels per group must divide: AVX-512 tries 16, 8 and 4
  // in forward and backward data, 16 then its AVX2 kernel's 8 in backward weights; AVX2 8.
  // Without one, gemm.
  const bool grouped = p.groups > 1 && !depthwise && !pad_covers_kernel;
  auto group_block = [&](std::initializer_list<int64_t> blocks) -> int64_t {
    for (int64_t s : blocks) {
      if ((p.ci / p.groups) % s == 0 && (p.co / p.groups) % s == 0) return s;
    }
    return 0;
  };
  const bool avx512 = isa == CpuIsa::kAvx512;
  const int64_t group_data_block = avx512 ? group_block({16, 8, 4}) : group_block({8});
  const int64_t group_weights_block = avx512 ? group_block({16, 8}) : group_block({8});
  // jit_1x1 handles a strided 1x1 by copying the strided input to a unit-stride one ("reduce
  // to unit stride") when the strides tile the input exactly.
  const bool tiles = p.h % p.oh == 0 && p.w % p.ow == 0;
  const bool jit_1x1 = one_by_one && !pad_covers_kernel && tiles;
  const int64_t rtus = strided ? RoundUp(p.ci, blk) * ohw * e : 0;
  const Primitive gemm_fwd{0, 0, y, Scratchpad({fwd_col})};
  // The direct (non-1x1) kernels, c-channel blocks; the first convolution keeps its source plain.
  auto blocked = [&](int64_t c) { return Primitive{xb(c), wb(c), yb(c), Scratchpad({padded_bias(c)})}; };
  auto first_conv = [&](int64_t c) { return Primitive{0, w_first(c), yb(c), Scratchpad({padded_bias(c)})}; };

  // ---- forward
  Primitive f;
  if (grouped) {
    f = group_data_block ? Primitive{x, wt, y, 0} : gemm_fwd;
    t->forward_kernel = group_data_block ? "oneDNN jit grouped" : "oneDNN gemm";
  } else if (depthwise) {
    const bool jit = DepthwiseForwardTakes(p, isa);
    f = jit ? Primitive{xb(blk), w_dw, yb(blk), Scratchpad({padded_bias(blk)})} : gemm_fwd;
    t->forward_kernel = jit ? "oneDNN jit depthwise" : "oneDNN gemm";
  } else if (pad_covers_kernel) {
    f = gemm_fwd;
    t->forward_kernel = "oneDNN gemm";
  } else if (jit_1x1) {
    f = {xb(blk), wb(blk), yb(blk), Scratchpad({rtus, padded_bias(blk)})};
    t->forward_kernel = "oneDNN jit 1x1";
  } else if (avx512 && Avx512DirectForwardTakes(p)) {
    f = p.ci < 16 ? first_conv(16) : blocked(16);
    t->forward_kernel = p.ci < 16 ? "oneDNN jit first-conv" : "oneDNN jit blocked";
  } else if (Avx2DirectForwardTakes(p)) {  // AVX2's kernel (AVX-512 falls back to it)
    f = p.ci < 8 ? first_conv(8) : blocked(8);
    t->forward_kernel = p.ci < 8 ? "oneDNN jit first-conv" : "oneDNN jit blocked";
  } else {
    f = gemm_fwd;
    t->forward_kernel = "oneDNN gemm";
  }
  AllocThenFree(&t->forward, {f.scratch, f.a, f.b, f.result}, {f.b, f.a, f.scratch});
  // ATen copies the blocked result out to a fresh plain tensor.
  t->forward.push_back(y);
  t->forward.push_back(-f.result);

  std::vector<int64_t>& bw = t->backward;
  // ---- backward data
  if (p.input_grad) {
    Primitive d;
    const Primitive gemm_data{0, 0, x, Scratchpad({GemmBackwardColumns(p, isa, false) * e})};
    if (grouped) {
      d = group_data_block ? Primitive{y, wt, x, 0} : gemm_data;
    } else if (depthwise) {
      d = DepthwiseBackwardDataTakes(p) ? Primitive{yb(blk), w_dw, xb(blk), 0} : gemm_data;
    } else if (pad_covers_kernel) {
      d = gemm_data;
    } else if (jit_1x1) {
      // AVX2 books its backward-data copy for 144 channels (load_blocking_max) whatever the
      // channel count; AVX-512 for the (rounded) channels.
      const int64_t data_rtus = avx512 ? rtus : (strided ? 144 * ohw * e : 0);
      d = {yb(blk), wb(blk), xb(blk), Scratchpad({data_rtus})};
    } else if (avx512 && Avx512DirectBackwardDataTakes(p)) {
      d = {yb(16), wb(16), xb(16), 0};
    } else if (Avx2DirectBackwardDataTakes(p)) {  // AVX2's kernel (AVX-512 falls back to it)
      d = {yb(8), wb(8), xb(8), 0};
    } else {
      d = gemm_data;
    }
    AllocThenFree(&bw, {d.a, d.b, d.result, d.scratch}, {d.scratch, d.b, d.a});
    bw.push_back(x);
    bw.push_back(-d.result);
  }
  // ---- backward weights (and bias); diff_dst is reordered again
  if (p.weight_grad) {
    Primitive w;
    // gemm's second entry is the weight-gradient reduction buffer: oneDNN books the weights'
    // byte count as a number of floats (key_conv_wei_reduction), so 4x the weight per thread.
    const Primitive gemm_weights{0, 0, wt, Scratchpad({GemmBackwardColumns(p, isa, true) * e, 4 * wt})};
    if (grouped) {
      w = group_weights_block ? Primitive{y, x, wt, 0} : gemm_weights;
    } else if (depthwise) {
      const bool jit = !one_by_one && DepthwiseBackwardWeightsTakes(p);
      w = jit ? Primitive{yb(blk), xb(blk), w_dw, 0} : gemm_weights;
    } else if (pad_covers_kernel) {
      w = gemm_weights;
    } else if (jit_1x1) {
      w = {yb(blk), xb(blk), wb(blk), Scratchpad({rtus, padded_bias(blk)})};
    } else if (avx512 && (p.ci >= 16 || p.ci <= 3) && Avx512DirectBackwardWeightsTakes(p)) {
      // Ci <= 3 is AVX-512's first convolution: the source stays plain.
      w = {yb(16), p.ci >= 16 ? xb(16) : 0, p.ci >= 16 ? wb(16) : w_first(16), Scratchpad({padded_bias(16)})};
    } else if (!Avx2DirectBackwardWeightsTakes(p)) {
      w = gemm_weights;
    } else if (p.ci == 3) {  // AVX2's first-conv ("flat")
      w = {yb(8), 0, w_first(8), Scratchpad({padded_bias(8)})};
    } else {  // AVX2's kernel, 8-channel blocks (AVX-512 hands it 4..15 input channels)
      w = {yb(8), xb(8), wb(8), Scratchpad({padded_bias(8)})};
    }
    for (int64_t a : {w.a, w.b, w.result, w.scratch}) {
      if (a > 0) bw.push_back(a);
    }
    if (p.bias) bw.push_back(b);  // diff_bias
    for (int64_t a : {w.scratch, w.b, w.a}) {
      if (a > 0) bw.push_back(-a);
    }
    if (p.bias) bw.push_back(b);  // the bias gradient ATen returns
    bw.push_back(wt);             // the weight gradient copied out plain
    bw.push_back(-w.result);
    if (p.bias) bw.push_back(-b);
  }
}

// A transposed convolution: 1.13 never hands a float one to oneDNN (measured with
// ONEDNN_VERBOSE=1), so slow_conv_transpose2d runs it (1-D as 2-D). Per image it multiplies
// into one columns buffer [Cout/g * kh * kw, H * W] and folds it into the output (col2im),
// with a row of ones [oh, ow] for the bias; backward unfolds the output gradient into columns
// of the same size for the input's gradient and again for the weight's, except for a 1x1
// kernel of unit stride, no padding and no dilation. groups > 1 loops over the groups as
// at::_convolution does for the native kernels: each group's input (and output gradient) is
// copied out when N > 1, the groups' results are concatenated.
void TransposedTrace(const CpuConvProblem& p, CpuConvTrace* t) {
  const int64_t e = p.element_bytes;
  const int64_t k = p.kh * p.kw, hw = p.h * p.w, ohw = p.oh * p.ow;
  const int64_t cig = p.ci / p.groups, cog = p.co / p.groups;
  const int64_t x = p.n * p.ci * hw * e, y = p.n * p.co * ohw * e;
  const int64_t wt = p.ci * cog * k * e, b = p.co * e;
  const int64_t cols = cog * k * hw * e, ones = p.bias ? ohw * e : 0;
  const bool unit = k == 1 && p.stride_h == 1 && p.stride_w == 1 && p.pad_h == 0 &&
                    p.pad_w == 0 && p.dil_h == 1 && p.dil_w == 1;
  const int64_t bcols = unit ? 0 : cols;
  std::vector<int64_t>& f = t->forward;
  std::vector<int64_t>& bw = t->backward;
  t->forward_kernel = "native transposed (col2im)";
  t->scratch = "col2im columns";
  auto forward = [&](int64_t out) { AllocThenFree(&f, {out, cols, ones}, {ones, cols}); };
  auto backward = [&](int64_t gx, int64_t gw, int64_t gb) {
    if (p.input_grad) AllocThenFree(&bw, {gx, bcols}, {bcols});
    if (p.weight_grad) AllocThenFree(&bw, {gw, p.bias ? gb : 0, bcols}, {bcols});
  };
  if (p.groups == 1) {
    forward(y);
    backward(x, wt, b);
    return;
  }
  const bool slice_copy = p.n > 1;
  const int64_t xg = p.n * cig * hw * e, yg = p.n * cog * ohw * e;
  const int64_t gw = cig * cog * k * e, gb = cog * e;
  // Every group repeats the same allocations and leaves its results behind, so the high-water
  // mark is reached in the last group: the groups between the first and the last are written
  // as one allocation of what they leave, and the frees of more than two groups' results as
  // one, which keeps the sequence short for any number of groups.
  auto groups = [&](std::vector<int64_t>* seq, int64_t left_by_one, auto&& one) {
    one();
    if (p.groups > 2) seq->push_back((p.groups - 2) * left_by_one);
    if (p.groups > 1) one();
  };
  auto free_each = [&](std::vector<int64_t>* seq, int64_t bytes) {
    if (p.groups > 2) seq->push_back(-p.groups * bytes);
    else seq->insert(seq->end(), p.groups, -bytes);
  };
  groups(&f, yg, [&] {
    if (slice_copy) f.push_back(xg);
    forward(yg);
    if (slice_copy) f.push_back(-xg);
  });
  f.push_back(y);
  free_each(&f, yg);
  const int64_t left = (p.input_grad ? xg : 0) + (p.weight_grad ? gw + (p.bias ? gb : 0) : 0);
  groups(&bw, left, [&] {
    if (slice_copy) bw.insert(bw.end(), {yg, xg});
    backward(xg, gw, gb);
    if (slice_copy) bw.insert(bw.end(), {-xg, -yg});
  });
  if (p.input_grad) bw.push_back(x);
  if (p.weight_grad) {
    bw.push_back(wt);
    if (p.bias) {
      bw.push_back(b);
      free_each(&bw, gb);
    }
    free_each(&bw, gw);
  }
  if (p.input_grad) free_each(&bw, xg);
}

}  // namespace

CpuConvTrace CpuConvAllocations(const CpuConvProblem& p, CpuIsa isa) {
  CpuConvTrace t;
  if (p.channels_last && !p.transposed) {
    cpu_conv_internal::ChannelsLastTrace(p, isa, &t);
  } else if (p.transposed) {
    TransposedTrace(p, &t);
  } else if (UsesOneDnn(p)) {
    OneDnnTrace(p, isa, &t);
  } else {
    NativeTrace(p, &t);
  }
  return t;
}

EventPeak PeakOfEvents(const std::vector<int64_t>& events) {
  EventPeak r;
  for (int64_t e : events) {
    r.net += e;
    r.peak = std::max(r.peak, r.net);
  }
  return r;
}

}  // namespace memest
