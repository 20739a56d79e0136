#include "engine/rules/cpu_conv.h"

#include <algorithm>
#include <initializer_list>

namespace memest {
namespace {

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

// oneDNN's jit_avx2_conv_bwd_data_kernel_f32::init_conf: whether AVX2's direct backward-data
// kernel takes a (blocked, ungrouped) problem; when it does not, oneDNN falls back to gemm. It
// searches a register blocking of the input width and refuses blockings whose tails it cannot
// handle, which for example rules out most strided 1-D convolutions (given as 2-D with unequal
// strides) and 3x3 stride-2 ones whose output does not reach the input's last column.
bool Avx2DirectBackwardDataTakes(const CpuConvProblem& p) {
  if (p.ci < 8 && p.kw > 3 && p.stride_w > 1) return false;  // "gemm performs better"
  if (p.stride_w != p.stride_h) return false;
  const int64_t ext_kw = (p.kw - 1) * p.dil_w + 1, ext_kh = (p.kh - 1) * p.dil_h + 1;
  const int64_t r_pad = (p.ow - 1) * p.stride_w + ext_kw - (p.w + p.pad_w);
  const int64_t b_pad = (p.oh - 1) * p.stride_h + ext_kh - (p.h + p.pad_h);
  if (ext_kw <= p.pad_w || ext_kw <= r_pad || ext_kh <= p.pad_h || ext_kh <= b_pad) return false;
  const int64_t l_overflow = std::max<int64_t>(0, (ext_kw - 1 - p.pad_w) / p.stride_w);
  constexpr int64_t kMaxRegs = 15;
  if (p.stride_w + 1 > kMaxRegs) return false;
  const int64_t nb_ic = RoundUp(p.ci, 8) / 8;
  int64_t ur_w = 1, best_nfmas = 0;
  for (int64_t b = 1; b <= 4; ++b) {
    if (nb_ic % b != 0) continue;
    for (int64_t u = p.stride_w; u * b + u / p.stride_w <= kMaxRegs && u < p.w + p.stride_w;
         u += p.stride_w) {
      const int64_t ur = std::min(u, p.w);
      if (l_overflow * p.stride_w > ur && ur != p.w) continue;
      const int64_t nfmas = (ur + p.stride_w - 1) / p.stride_w * b;
      if (nfmas > best_nfmas || (nfmas == best_nfmas && ur_w < ur)) {
        ur_w = ur;
        best_nfmas = nfmas;
      }
    }
  }
  if (best_nfmas == 0) return false;
  const int64_t tail = p.w % ur_w;
  const int64_t r_overflow_no_tail = std::max<int64_t>(0, (ext_kw - 1 - r_pad - tail) / p.stride_w);
  return !(r_overflow_no_tail * p.stride_w > ur_w ||
           (p.w > ur_w && ur_w % p.stride_w != 0) || (p.w > ur_w && r_pad + tail < 0));
}

// jit_avx2_conv_bwd_weights_kernel_f32::init_conf: AVX2's direct backward-weights kernel (also
// what AVX-512 hands 4..15 input channels to) refuses dilation, kernels wider than 13, kernels
// taller than the input, and paddings as large as the kernel; oneDNN then takes gemm.
bool Avx2DirectBackwardWeightsTakes(const CpuConvProblem& p) {
  if (p.dil_h != 1 || p.dil_w != 1 || p.kw >= 14 || p.kh > p.h || p.pad_h >= p.kh) return false;
  const int64_t r_pad = std::max<int64_t>(0, (p.ow - 1) * p.stride_w + p.kw - (p.w + p.pad_w));
  const int64_t b_pad = std::max<int64_t>(0, (p.oh - 1) * p.stride_h + p.kh - (p.h + p.pad_h));
  return p.pad_w < p.kw && r_pad < p.kw && b_pad < p.kh;
}

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
  const int64_t w_first = RoundUp(p.co, blk) * p.ci * k * e;  // first-conv: Ohwi16o / Ohwi8o
  const int64_t w_dw = RoundUp(p.co, blk) * k * e;            // depthwise Goihw16g / 8g
  auto padded_bias = [&](int64_t c) { return p.bias && p.co % c ? RoundUp(p.co, c) * e : 0; };
  const int64_t col = (p.ci / p.groups) * k * ohw * e;  // gemm im2col, one image
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
  const Primitive gemm_fwd{0, 0, y, Scratchpad({col})};

  // ---- forward
  Primitive f;
  if (grouped) {
    f = group_data_block ? Primitive{x, wt, y, 0} : gemm_fwd;
    t->forward_kernel = group_data_block ? "oneDNN jit grouped" : "oneDNN gemm";
  } else if (depthwise) {
    f = pad_covers_kernel ? gemm_fwd : Primitive{xb(blk), w_dw, yb(blk), Scratchpad({padded_bias(blk)})};
    t->forward_kernel = pad_covers_kernel ? "oneDNN gemm" : "oneDNN jit depthwise";
  } else if (pad_covers_kernel) {
    f = gemm_fwd;
    t->forward_kernel = "oneDNN gemm";
  } else if (jit_1x1) {
    f = {xb(blk), wb(blk), yb(blk), Scratchpad({rtus, padded_bias(blk)})};
    t->forward_kernel = "oneDNN jit 1x1";
  } else if (p.ci < blk) {  // "first convolution": the source stays plain
    f = {0, w_first, yb(blk), Scratchpad({padded_bias(blk)})};
    t->forward_kernel = "oneDNN jit first-conv";
  } else {
    f = {xb(blk), wb(blk), yb(blk), Scratchpad({padded_bias(blk)})};
    t->forward_kernel = "oneDNN jit blocked";
  }
  AllocThenFree(&t->forward, {f.scratch, f.a, f.b, f.result}, {f.b, f.a, f.scratch});
  // ATen copies the blocked result out to a fresh plain tensor.
  t->forward.push_back(y);
  t->forward.push_back(-f.result);

  std::vector<int64_t>& bw = t->backward;
  // ---- backward data
  if (p.input_grad) {
    Primitive d;
    const Primitive gemm_data{0, 0, x, Scratchpad({col})};
    if (grouped) {
      d = group_data_block ? Primitive{y, wt, x, 0} : gemm_data;
    } else if (depthwise) {
      d = {yb(blk), w_dw, xb(blk), 0};
    } else if (pad_covers_kernel) {
      d = gemm_data;
    } else if (jit_1x1) {
      // AVX2 books its backward-data copy for 144 channels (load_blocking_max) whatever the
      // channel count; AVX-512 for the (rounded) channels.
      const int64_t data_rtus = avx512 ? rtus : (strided ? 144 * ohw * e : 0);
      d = {yb(blk), wb(blk), xb(blk), Scratchpad({data_rtus})};
    } else if (!avx512 && !Avx2DirectBackwardDataTakes(p)) {
      d = gemm_data;
    } else {
      d = {yb(blk), wb(blk), xb(blk), 0};
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
    const Primitive gemm_weights{0, 0, wt, Scratchpad({col, 4 * wt})};
    if (grouped) {
      w = group_weights_block ? Primitive{y, x, wt, 0} : gemm_weights;
    } else if (depthwise) {
      w = one_by_one ? gemm_weights : Primitive{yb(blk), xb(blk), w_dw, 0};
    } else if (pad_covers_kernel) {
      w = gemm_weights;
    } else if (jit_1x1) {
      w = {yb(blk), xb(blk), wb(blk), Scratchpad({rtus, padded_bias(blk)})};
    } else if (avx512 && p.ci >= 16) {
      w = {yb(16), xb(16), wb(16), Scratchpad({padded_bias(16)})};
    } else if (avx512 && p.ci <= 3) {  // first-conv: the source stays plain
      w = {yb(16), 0, w_first, Scratchpad({padded_bias(16)})};
    } else if (!Avx2DirectBackwardWeightsTakes(p)) {
      w = gemm_weights;
    } else if (!avx512 && p.ci == 3) {  // AVX2's first-conv
      w = {yb(8), 0, w_first, Scratchpad({padded_bias(8)})};
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
  if (p.transposed) {
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
