#include "engine/rules/cpu_conv_kernels.h"

#include <algorithm>
#include <cmath>

namespace memest {
namespace {

int64_t DivUp(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t RoundUp(int64_t a, int64_t b) { return DivUp(a, b) * b; }
int64_t RoundDown(int64_t a, int64_t b) { return a / b * b; }
int64_t Saturate(int64_t lo, int64_t hi, int64_t v) { return std::max(lo, std::min(hi, v)); }

// jit_primitive_conf.hpp: the extent of a dilated kernel, and the padding a problem needs past
// the input's end (negative when the last window stops short of it).
int64_t Extent(int64_t k, int64_t dil) { return (k - 1) * dil + 1; }
int64_t EndPadding(int64_t start_pad, int64_t dst, int64_t src, int64_t stride, int64_t ext) {
  return (dst - 1) * stride + ext - (src + start_pad);
}

// The geometry every init_conf starts from.
struct Geometry {
  int64_t ext_kw, ext_kh, r_pad, b_pad;
  explicit Geometry(const CpuConvProblem& p)
      : ext_kw(Extent(p.kw, p.dil_w)),
        ext_kh(Extent(p.kh, p.dil_h)),
        r_pad(EndPadding(p.pad_w, p.ow, p.w, p.stride_w, ext_kw)),
        b_pad(EndPadding(p.pad_h, p.oh, p.h, p.stride_h, ext_kh)) {}
  // "kernel_outside_src": some window lies entirely in the padding.
  bool KernelOutsideSource(const CpuConvProblem& p) const {
    return ext_kw <= p.pad_w || ext_kw <= r_pad || ext_kh <= p.pad_h || ext_kh <= b_pad;
  }
};

// jit_avx512_common_conv_fwd_kernel::init_conf, get_thr_eff / get_ow_block with one thread.
float ForwardThreadEfficiency(int64_t ow, int64_t ow_block) {
  return static_cast<float>(ow) / static_cast<float>(RoundUp(ow, ow_block));
}

int64_t ForwardOwBlock(const CpuConvProblem& p, bool first_conv, int64_t ic_block,
                       int64_t nb_oc_blocking, int64_t ur_w) {
  if (first_conv) return p.ow;
  const int64_t l2_part = (p.l2_bytes * 7 / 8) / 4;
  const int64_t src_chunk = ic_block * ur_w * p.kh;
  const int64_t dst_chunk = 16 * nb_oc_blocking * ur_w;
  const int64_t wei_chunk = 16 * nb_oc_blocking * ic_block * p.kw * p.kh;
  const int64_t nurw_cache = (l2_part - 2 * wei_chunk) / (2 * dst_chunk + 2 * src_chunk);
  int64_t ow_block_thr = ur_w * std::max<int64_t>(2, nurw_cache);
  float eff = ForwardThreadEfficiency(p.ow, ow_block_thr);
  const int64_t max_nb_ow = DivUp(p.ow, 2 * ur_w);
  for (int64_t nb_ow = DivUp(p.ow, ow_block_thr); nb_ow <= max_nb_ow; ++nb_ow) {
    const int64_t ow_block = std::min(RoundUp(DivUp(p.ow, nb_ow), ur_w), p.ow);
    if (ow_block < nb_oc_blocking * 16 && eff > 0.9f) break;
    if (DivUp(p.ow, ow_block) != nb_ow) continue;
    const float thr_eff = ForwardThreadEfficiency(p.ow, ow_block);
    if (ow_block >= 2 * ur_w && thr_eff > eff) {
      ow_block_thr = ow_block;
      eff = thr_eff;
    }
    if (eff > 0.98f) break;
  }
  return std::min(p.ow, std::max(2 * ur_w, ow_block_thr));
}

}  // namespace

bool Avx512DirectForwardTakes(const CpuConvProblem& p) {
  const Geometry g(p);
  if (g.KernelOutsideSource(p)) return false;
  constexpr int64_t kRegs = 28;
  const bool first_conv = p.ci < 16;
  const int64_t ic = first_conv ? p.ci : RoundUp(p.ci, 16), oc = RoundUp(p.co, 16);
  const int64_t ic_block = first_conv ? p.ci : 16;
  const int64_t nb_oc = oc / 16;
  int64_t ur_w = std::min(p.ow, kRegs);
  int64_t n_oi = p.ow / ur_w;
  const int64_t r_pad_blocks = EndPadding(p.pad_w, ur_w * n_oi, p.w, p.stride_w, g.ext_kw);
  if (p.pad_w > 0 && r_pad_blocks > 0) --n_oi;
  // "Heuristic to optimize code size on KNX" (it matters where the branch below keeps ur_w).
  if (ur_w != p.ow && p.pad_w > 0 && r_pad_blocks > 0 && n_oi > 1) {
    const int64_t ops_per_reg = 6 + ic_block * p.kw;
    const int64_t mult = 1 + (p.pad_w > 0) + (r_pad_blocks > 0);
    for (int64_t u = ur_w; u > kRegs / 2; --u) {
      if (u * mult * ops_per_reg * 9.0 < 24 * 1024) {
        ur_w = u;
        break;
      }
    }
  }
  const int64_t ker_total = 4 * DivUp(p.w, p.stride_w) * ic_block * p.kh + 4 * p.ow * 16 * 2 +
                            4 * p.kh * p.kw * ic_block * 16 * 2;
  const bool embd_base = p.kw == 3 && p.ow <= 28 && ker_total < p.l1_bytes &&
                         !(p.ow == 13 && ic >= 192) && !(p.ow == 28 && ic >= 512);
  const bool unit_stride = p.stride_h == 1 && p.stride_w == 1;
  const bool expl_condition = p.n == 1 && unit_stride && p.ow == 1 && p.w == p.kw && nb_oc > 1 &&
                              p.pad_w == 0 && r_pad_blocks == 0 && g.r_pad == 0 && p.dil_w == 1 &&
                              p.oh >= 60 && p.kh >= 3;
  const bool embd = !expl_condition &&
                    (p.kw > 3 || (unit_stride && embd_base) ||
                     (!unit_stride && p.n <= 16 && (oc <= 192 || p.oh <= 10) && embd_base) ||
                     (p.n == 1 && (ur_w >= p.ow || first_conv || (p.ow <= 147 && oc <= 96))));
  int64_t nb_oc_blocking = 1;
  if (embd) {
    ur_w = std::min(p.ow, kRegs);
    if (ker_total < p.l1_bytes && p.ow <= 8 && p.kh <= 3 && p.kw <= 3 && nb_oc % 2 == 0 &&
        (!first_conv || p.n == 1) && (p.n != 1 || ur_w < p.ow)) {
      nb_oc_blocking = 2;
      ur_w = std::min<int64_t>(p.ow, 31 / 3);
    }
  } else if (!first_conv || p.n > 1 || expl_condition) {
    float best = 0.f;
    for (int64_t i = std::min<int64_t>(nb_oc, 5); i > 0; --i) {
      if (nb_oc % i != 0) continue;
      if (expl_condition) {
        nb_oc_blocking = i;
        break;
      }
      const int64_t u = std::min<int64_t>(p.ow, 31 / (i + 1));
      const float eff = ForwardThreadEfficiency(p.ow, ForwardOwBlock(p, first_conv, ic_block, i, u));
      if (eff > 1.05f * best) {
        nb_oc_blocking = i;
        best = eff;
      }
    }
    ur_w = std::min<int64_t>(p.ow, 31 / (nb_oc_blocking + 1));
  }
  if (p.pad_w > ur_w) return false;
  const int64_t tail = p.ow % ur_w;
  if (EndPadding(p.pad_w, p.ow - tail, p.w, p.stride_w, g.ext_kw) > ur_w) return false;
  // "A rough check on code size": 256 KiB of generated code at most.
  const int64_t mult = 1 + (p.pad_w > 0) + (r_pad_blocks > 0);
  return static_cast<float>(mult) * p.kw * ic_block * nb_oc_blocking * ur_w * 15.f <= 256.f * 1024;
}

bool Avx2DirectForwardTakes(const CpuConvProblem& p) {
  const Geometry g(p);
  if (g.KernelOutsideSource(p)) return false;
  constexpr int64_t kAvailRegs = 15;
  int64_t ur_w = std::min<int64_t>(3, p.ow);
  int64_t tail = p.ow % ur_w;
  if (p.pad_w > ur_w) return false;
  if (p.kw > 7 && !((p.pad_h == 0 && p.pad_w == 0) || (p.stride_w == 1 && p.stride_h == 1))) {
    return false;
  }
  int64_t r_pad_no_tail = std::max<int64_t>(0, EndPadding(p.pad_w, p.ow - tail, p.w, p.stride_w, g.ext_kw));
  if (r_pad_no_tail > ur_w * p.stride_w && p.ow / ur_w > 1) {
    ur_w = std::min(r_pad_no_tail / p.stride_w + tail, std::min(p.ow, kAvailRegs / 2));
    tail = p.ow % ur_w;
    r_pad_no_tail = std::max<int64_t>(0, EndPadding(p.pad_w, p.ow - tail, p.w, p.stride_w, g.ext_kw));
    if (ur_w < std::max(p.pad_w, r_pad_no_tail)) return false;
  }
  return true;
}

bool Avx512DirectBackwardDataTakes(const CpuConvProblem& p) {
  if ((p.dil_w != 1 && p.stride_w != 1) || (p.dil_h != 1 && p.stride_h != 1)) return false;
  const Geometry g(p);
  if (g.KernelOutsideSource(p)) return false;
  constexpr int64_t kRegs = 28;
  const int64_t nb_ic = DivUp(p.ci, 16);
  int64_t ur_w = p.stride_w;
  if (p.w <= kRegs) {
    ur_w = p.w;
  } else {
    for (int64_t u = kRegs; u > 0; --u) {
      if (u % p.stride_w == 0) {
        ur_w = u;
        break;
      }
    }
  }
  const int64_t reach = (p.kw - 1) * p.dil_w;
  const int64_t l_overflow = std::max<int64_t>(0, (reach - p.pad_w) / p.stride_w);
  int64_t r_overflow = std::max<int64_t>(0, (reach - std::max<int64_t>(0, g.r_pad + p.w % ur_w)) / p.stride_w);
  int64_t n_oi = p.w / ur_w;
  if (r_overflow > 0) --n_oi;
  if (ur_w != p.ow && ((l_overflow <= 0 && n_oi > 0) || (l_overflow > 0 && n_oi > 1)) &&
      r_overflow > 0 && l_overflow > 0) {
    const int64_t ops_per_reg = 6 + 16 * p.kw;
    const int64_t mult = 1 + (l_overflow > 0) + (r_overflow > 0);
    for (int64_t u = ur_w; u > kRegs / 2; --u) {
      if ((u / p.stride_w) * mult * ops_per_reg * 9.2 < 24 * 1024 && u % p.stride_w == 0) {
        ur_w = u;
        break;
      }
    }
  }
  const bool large_w_filter = p.kw >= 14 && p.kw < 20 && p.ow == 1 && nb_ic > 1 && p.kw == p.w &&
                              p.stride_w == 1 && p.dil_h == 1 && p.dil_w == 1;
  const int64_t ker_total = 4 * p.w * 16 * 2 * p.kh + 4 * p.ow * 16 + 4 * p.kh * p.kw * 16 * 16 * 2;
  // oneDNN's `use_expl_bcast` selects the embedded-broadcast kernel.
  const bool embd = !(p.kw == 1 || (p.kw == 5 && p.w < 8) ||
                      (p.kw < 5 && ((p.w <= 5 || (p.w > 8 && p.w <= 13)) || ker_total > p.l1_bytes))) ||
                    p.stride_h > 1;
  int64_t nb_ic_blocking = 1;
  if (embd && !large_w_filter) {
    ur_w = std::min(p.w, kRegs);
    if (!(p.kw > 3 || (p.kw == 3 && ker_total < p.l1_bytes && p.ow > 8)) && p.stride_h == 1 &&
        nb_ic % 2 == 0) {
      nb_ic_blocking = 2;
      ur_w = std::min<int64_t>(31 / 3, p.w);
    }
  } else {
    nb_ic_blocking = std::min<int64_t>(large_w_filter ? 2 : 4, nb_ic);
    while (nb_ic % nb_ic_blocking != 0) --nb_ic_blocking;
    ur_w = std::min<int64_t>(31 / (nb_ic_blocking + 1), p.w);
  }
  const int64_t tail = p.w % ur_w;
  if (l_overflow * p.stride_w > ur_w && !large_w_filter) return false;
  r_overflow = std::max<int64_t>(0, (reach - std::max<int64_t>(0, g.r_pad + tail)) / p.stride_w);
  if (r_overflow * p.stride_w > ur_w || (p.w > ur_w && ur_w % p.stride_w != 0) ||
      (p.w > ur_w && g.r_pad + tail < 0)) {
    return false;
  }
  const int64_t mult = 1 + (l_overflow > 0) + (r_overflow > 0);
  return large_w_filter ||
         static_cast<float>(p.kw) * 16 * nb_ic_blocking * ur_w * 15.f * mult <= 256.f * 1024;
}

bool Avx2DirectBackwardDataTakes(const CpuConvProblem& p) {
  if ((p.dil_w != 1 && p.stride_w != 1) || (p.dil_h != 1 && p.stride_h != 1)) return false;
  if (p.ci < 8 && p.kw > 3 && p.stride_w > 1) return false;  // "gemm performs better"
  if (p.stride_w != p.stride_h) return false;
  const Geometry g(p);
  if (g.KernelOutsideSource(p)) return false;
  const int64_t l_overflow = std::max<int64_t>(0, (g.ext_kw - 1 - p.pad_w) / p.stride_w);
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
  const int64_t r_overflow_no_tail = std::max<int64_t>(0, (g.ext_kw - 1 - g.r_pad - tail) / p.stride_w);
  return !(r_overflow_no_tail * p.stride_w > ur_w || (p.w > ur_w && ur_w % p.stride_w != 0) ||
           (p.w > ur_w && g.r_pad + tail < 0));
}

bool Avx512DirectBackwardWeightsTakes(const CpuConvProblem& p) {
  const Geometry g(p);
  if (p.dil_h != 1 && (p.stride_h != 1 || g.ext_kh > p.h)) return false;
  const int64_t r_pad = std::max<int64_t>(0, g.r_pad), b_pad = std::max<int64_t>(0, g.b_pad);
  constexpr int64_t kMaxUrW = 28;
  const bool boundaries_ok = p.pad_w < g.ext_kw && r_pad < g.ext_kw && p.pad_h <= g.ext_kh / 2 &&
                             b_pad <= g.ext_kh / 2 && p.pad_w <= kMaxUrW && r_pad <= kMaxUrW;
  return boundaries_ok && p.kw <= 14;
}

bool Avx2DirectBackwardWeightsTakes(const CpuConvProblem& p) {
  if (p.dil_h != 1 || p.dil_w != 1 || p.kw >= 14 || p.kh > p.h || p.pad_h >= p.kh) return false;
  const int64_t r_pad = std::max<int64_t>(0, (p.ow - 1) * p.stride_w + p.kw - (p.w + p.pad_w));
  const int64_t b_pad = std::max<int64_t>(0, (p.oh - 1) * p.stride_h + p.kh - (p.h + p.pad_h));
  return p.pad_w < p.kw && r_pad < p.kw && b_pad < p.kh;
}

bool DepthwiseForwardTakes(const CpuConvProblem& p, CpuIsa isa) {
  const Geometry g(p);
  if (g.KernelOutsideSource(p)) return false;
  const int64_t ur_w = std::min<int64_t>(isa == CpuIsa::kAvx512 ? 6 : 4, p.ow);
  const int64_t tail = p.ow % ur_w;
  const int64_t r_pad_no_tail = std::max<int64_t>(0, EndPadding(p.pad_w, p.ow - tail, p.w, p.stride_w, g.ext_kw));
  return p.pad_w <= ur_w && r_pad_no_tail <= ur_w;
}

bool DepthwiseBackwardDataTakes(const CpuConvProblem& p) { return p.dil_h == 1 && p.dil_w == 1; }

bool DepthwiseBackwardWeightsTakes(const CpuConvProblem& p) {
  if (p.dil_h != 1 || p.dil_w != 1 || p.kw > 3 || p.stride_w > p.kw) return false;
  const Geometry g(p);
  const int64_t r_pad = std::max<int64_t>(0, g.r_pad), b_pad = std::max<int64_t>(0, g.b_pad);
  const int64_t max_hpad = p.kh / 2, max_wpad = p.kw / 2;
  const int64_t min_ih = p.kh + ((-p.pad_h) % p.stride_h + p.stride_h) % p.stride_h;
  return p.pad_h <= max_hpad && b_pad <= max_hpad && p.pad_w <= max_wpad && r_pad <= max_wpad &&
         p.h >= min_ih && (p.pad_h <= 1 || p.pad_h % p.stride_h == 0) &&
         (b_pad <= 1 || b_pad % p.stride_h == 0);
}

int64_t GemmForwardColumns(const CpuConvProblem& p, CpuIsa isa) {
  const int64_t ic = p.ci / p.groups, oc = p.co / p.groups, ks = p.kh * p.kw, os = p.oh * p.ow;
  const int64_t sh = p.stride_h, sw = p.stride_w;
  const bool im2col = !(p.ow == p.w && p.oh == p.h && sw == 1 && sh == 1 && ks == 1);
  if (!im2col) return 0;
  const int64_t simd_w = isa == CpuIsa::kAvx512 ? 16 : 8;
  const int64_t l2 = p.l2_bytes / 4;  // in floats
  const int64_t spatial = p.n * p.groups * os, k_total = ic * ks;
  const bool blocking = spatial >= simd_w || os < p.n * p.groups ||
                        (sw == 1 && static_cast<double>(k_total) <= 0.05 * oc);
  if (!blocking) return ic * ks * os;
  // init_conf's search over (oc block, os block), each scored by try_cfg; one thread, so the
  // thread-balance terms are 1 and every block is bounded by the whole problem.
  constexpr int64_t kMinOcBlock = 8;
  const int64_t min_os_block = simd_w;
  const float k_sum = 8 + 1 + 1 + 1 + 1 + 1 + 0.5f + 1;
  int64_t best_osb = 1, best_icb = ic, best_ocb = 1;
  float best_eff = 0;
  auto max_icb_of = [&](int64_t ocb, int64_t osb, int64_t oc_per_thr, int64_t os_per_thr) {
    const int64_t out_block = ocb * osb, inp_row = sh * sw * osb, col_row = ks * osb;
    int64_t max_icb;
    if (osb >= os_per_thr) {
      max_icb = l2 / (inp_row + col_row);
      if (ocb < oc_per_thr) max_icb = std::min(max_icb, (l2 - out_block) / (col_row + ks * ocb));
    } else {
      max_icb = (l2 - out_block) / (inp_row + col_row + ks * oc_per_thr);
    }
    if (max_icb < ic) max_icb = (l2 - out_block) / (inp_row + col_row + ks * oc_per_thr);
    return max_icb;
  };
  auto try_cfg = [&](int64_t ocb, int64_t osb) {
    const int64_t oc_per_thr = oc, os_per_thr = spatial;
    ocb = std::min(oc_per_thr, Saturate(kMinOcBlock, oc, ocb));
    const int64_t os_max = std::min(os, os_per_thr);
    osb = std::min(os_max, Saturate(min_os_block, spatial, osb));
    int64_t max_icb = max_icb_of(ocb, osb, oc_per_thr, os_per_thr);
    const int64_t access = max_icb < 1 ? 20 : 1;
    max_icb = std::max<int64_t>(1, max_icb);
    const int64_t icb = std::max<int64_t>(1, ic / DivUp(ic, max_icb));
    const int64_t nb_ic = DivUp(ic, icb), kb = icb * ks, kb_al = RoundUp(kb, simd_w);
    const int64_t out_ops = access * oc_per_thr * RoundUp(os_per_thr, simd_w) * (icb == ic ? 1 : 2 * nb_ic - 1);
    const int64_t osb_al = RoundUp(osb, simd_w);
    const int64_t inp_size = ic * RoundUp(os_per_thr * sh * sw, simd_w);
    const int64_t inp_ops = access * ks * inp_size;
    const float col_tail = static_cast<float>(osb_al) / static_cast<float>(osb);
    const float col_part = static_cast<float>(ks * inp_size) * col_tail;
    int64_t col_ops = static_cast<int64_t>(access * (col_part + col_part));
    if (sw != 1) col_ops *= 8;
    const int64_t wei_ops = access * oc_per_thr * RoundUp(k_total, simd_w);
    const float thr_mem_eff = static_cast<float>(os_per_thr) / simd_w * oc_per_thr * k_total /
                              static_cast<float>(inp_ops + col_ops + wei_ops + out_ops);
    const float oc_disb = static_cast<float>(oc_per_thr) / RoundUp(oc_per_thr, ocb);
    const float os_disb = static_cast<float>(os_max) / RoundUp(os_max, osb);
    const float ic_disb = static_cast<float>(ic) / RoundUp(ic, icb);
    const float reg_osb_disb = static_cast<float>(osb) / RoundUp(osb, 3 * simd_w);
    const float gemm_eff = static_cast<float>(osb) * ocb * kb /
                           (static_cast<float>(oc_per_thr) * os_per_thr * k_total);
    const float gemm_calc_eff = static_cast<float>(osb) / simd_w * ocb * kb /
                                static_cast<float>(osb_al * kb + ocb * kb_al + ocb * osb_al);
    const float eff = std::pow(oc_disb * os_disb * ic_disb * reg_osb_disb * thr_mem_eff *
                                   std::pow(gemm_eff, 0.5f) * gemm_calc_eff,
                               1.f / k_sum);
    if (eff > best_eff) {
      best_eff = eff;
      best_ocb = ocb;
      best_osb = osb;
      best_icb = icb;
    }
  };
  auto explore = [&](int64_t ocb, int64_t osb) {
    try_cfg(ocb, osb);
    try_cfg(RoundDown(ocb, 8), RoundDown(osb, 48));
    try_cfg(RoundUp(ocb, 8), RoundDown(osb, 48));
    try_cfg(RoundUp(ocb, 8), RoundUp(osb, min_os_block));
    try_cfg(RoundUp(ocb, 8), RoundUp(osb, 48));
  };
  try_cfg(oc, spatial);
  if (!(best_ocb == oc && best_osb == spatial && best_icb == ic)) {
    const int64_t a_k = sh * sw + ks, b_k = ks * oc;
    int64_t icb = ic;
    int64_t ocb = Saturate(kMinOcBlock, oc, (l2 - a_k * icb * min_os_block - b_k * icb) / min_os_block);
    int64_t osb = Saturate(min_os_block, spatial, (l2 - b_k * icb) / (a_k * icb + ocb));
    explore(ocb, osb);
    const int64_t icb_max = std::max<int64_t>(1, l2 / (2 * kMinOcBlock * a_k + 2 * b_k));
    if (icb_max < ic) {
      icb = ic / std::max<int64_t>(1, ic / icb_max);
      osb = std::max<int64_t>(1, (l2 - 2 * b_k * icb) / (2 * icb * a_k));
      ocb = l2 / 2 / osb;
      if (ocb > oc) {
        ocb = oc;
        osb = Saturate(min_os_block, spatial, (l2 - b_k * icb) / (a_k * icb + ocb));
      } else if (osb > spatial) {
        osb = spatial;
        ocb = Saturate(kMinOcBlock, oc, (l2 - a_k * icb * osb - b_k * icb) / osb);
      }
      explore(ocb, osb);
    }
    explore(oc, std::max(min_os_block, RoundDown((l2 - b_k * ic) / (a_k * ic + oc), min_os_block)));
  }
  return best_icb * ks * best_osb;
}

int64_t GemmBackwardColumns(const CpuConvProblem& p, CpuIsa isa, bool weights) {
  const int64_t ic = p.ci / p.groups, ks = p.kh * p.kw, os = p.oh * p.ow;
  const bool im2col = !(p.ow == p.w && p.oh == p.h && p.stride_w == 1 && p.stride_h == 1 && ks == 1);
  if (!im2col) return 0;
  const int64_t e = 4;  // float32
  const int64_t x = p.n * p.ci * p.h * p.w * e, y = p.n * p.co * os * e;
  const int64_t wt = p.co * ic * ks * e;
  const int64_t limit = std::min<int64_t>(int64_t{1} << 30, 15 * (x + wt + y));
  // Already booked: the weight-reduction buffer (the weights' bytes counted as floats), with
  // the registrar's 128 bytes of alignment.
  const int64_t booked = weights ? 4 * wt + 128 : 0;
  const int64_t available = limit - booked;
  if (available >= ic * ks * os * e) return ic * ks * os;
  const int64_t simd_w = isa == CpuIsa::kAvx512 ? 16 : 8;
  const int64_t max_os_block = available / (e * ic * ks);
  const float coef = weights ? 0.05f : 0.1f;
  const int64_t os_block = std::max(simd_w, static_cast<int64_t>(max_os_block * coef));
  return ic * ks * os_block;
}

}  // namespace memest
