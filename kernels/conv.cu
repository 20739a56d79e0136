// Convolutions through cuDNN's legacy API (still in cuDNN 9), chosen and run as PyTorch's
// cudnn_convolution does with cudnn.benchmark=False (aten/src/ATen/native/cudnn/Conv_v7.cpp).
#include <algorithm>
#include <climits>
#include <cmath>
#include <string>
#include <vector>

#include "engine/report/report.h"
#include "kernels/benchmarks.h"
#include "kernels/cuda_status.h"
#include "kernels/pattern.h"

namespace memest::kernels {

using validate::ConvShape;
using validate::WorkKind;

namespace {

cudnnDataType_t CudnnDataType(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return CUDNN_DATA_HALF;
    case DType::kBFloat16: return CUDNN_DATA_BFLOAT16;
    default: return CUDNN_DATA_FLOAT;
  }
}

const char* KindName(WorkKind kind) { return validate::WorkKindName(kind); }

// The descriptors of one convolution, destroyed with it. x is the input, w the filter, y the
// output of the forward convolution; the backward kinds use the same three (dy is y's shape,
// dx x's, dw w's).
class ConvDescriptors {
 public:
  ConvDescriptors() = default;
  ConvDescriptors(const ConvDescriptors&) = delete;
  ConvDescriptors& operator=(const ConvDescriptors&) = delete;
  ~ConvDescriptors() {
    if (x != nullptr) (void)cudnnDestroyTensorDescriptor(x);
    if (y != nullptr) (void)cudnnDestroyTensorDescriptor(y);
    if (w != nullptr) (void)cudnnDestroyFilterDescriptor(w);
    if (conv != nullptr) (void)cudnnDestroyConvolutionDescriptor(conv);
  }

  Status Init(const Work& work) {
    const ConvShape& c = work.conv;
    // The legacy API counts in int, and PyTorch splits a batch whose tensors pass 2^31 - 1
    // elements before it calls cuDNN; one call here never does.
    const int64_t x_elems = c.n * c.c * c.h * c.w;
    const int64_t y_elems = c.n * c.k * c.out_h() * c.out_w();
    const int64_t w_elems = c.k * (c.c / c.groups) * c.r * c.s;
    if (std::max({x_elems, y_elems, w_elems}) > INT_MAX) {
      return FailedPrecondition(
          "work.conv: a tensor has more than 2^31 - 1 elements; PyTorch splits such a batch "
          "into several cuDNN calls, and one call here cannot hold it");
    }
    const cudnnDataType_t dt = CudnnDataType(work.dtype);
    MEMEST_CUDNN_TRY(cudnnCreateTensorDescriptor(&x));
    MEMEST_CUDNN_TRY(cudnnCreateTensorDescriptor(&y));
    MEMEST_CUDNN_TRY(cudnnCreateFilterDescriptor(&w));
    MEMEST_CUDNN_TRY(cudnnCreateConvolutionDescriptor(&conv));
    MEMEST_CUDNN_TRY(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, dt, I(c.n), I(c.c), I(c.h),
                                                I(c.w)));
    MEMEST_CUDNN_TRY(cudnnSetFilter4dDescriptor(w, dt, CUDNN_TENSOR_NCHW, I(c.k),
                                                I(c.c / c.groups), I(c.r), I(c.s)));
    MEMEST_CUDNN_TRY(cudnnSetConvolution2dDescriptor(
        conv, I(c.pad_h), I(c.pad_w), I(c.stride_h), I(c.stride_w), I(c.dilation_h),
        I(c.dilation_w), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    MEMEST_CUDNN_TRY(cudnnSetConvolutionGroupCount(conv, I(c.groups)));
    // PyTorch's ConvolutionDescriptor: tensor-op math for float16, the default otherwise (for
    // float32 on sm_80+ that permits TF32, as allow_tf32 = True does; bfloat16 runs on tensor
    // cores under the default math too). The heuristics take it into account.
    MEMEST_CUDNN_TRY(cudnnSetConvolutionMathType(
        conv, work.dtype == DType::kFloat16 ? CUDNN_TENSOR_OP_MATH : CUDNN_DEFAULT_MATH));
    int on = 0, oc = 0, oh = 0, ow = 0;
    MEMEST_CUDNN_TRY(cudnnGetConvolution2dForwardOutputDim(conv, x, w, &on, &oc, &oh, &ow));
    if (on != c.n || oc != c.k || oh != c.out_h() || ow != c.out_w()) {
      return Internal("cuDNN's output shape [" + std::to_string(on) + ", " + std::to_string(oc) +
                      ", " + std::to_string(oh) + ", " + std::to_string(ow) +
                      "] differs from ConvShape's [" + std::to_string(c.n) + ", " +
                      std::to_string(c.k) + ", " + std::to_string(c.out_h()) + ", " +
                      std::to_string(c.out_w()) + "]");
    }
    MEMEST_CUDNN_TRY(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, dt, on, oc, oh, ow));
    return Status::Ok();
  }

  cudnnTensorDescriptor_t x = nullptr;
  cudnnTensorDescriptor_t y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;

 private:
  static int I(int64_t v) { return static_cast<int>(v); }  // range checked by the caller
};

// One entry of the heuristics' list: the three perf structs share these fields.
struct ConvAlgo {
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  int64_t memory = 0;
};

template <typename Perf>
std::vector<ConvAlgo> Successful(const std::vector<Perf>& perf, int returned) {
  std::vector<ConvAlgo> out;
  for (int i = 0; i < returned; ++i) {
    // PyTorch's getValidAlgorithms: status success (and, only when deterministic is set,
    // which is not the default, deterministic ones).
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    out.push_back({static_cast<int>(perf[i].algo), perf[i].mathType,
                   static_cast<int64_t>(perf[i].memory)});
  }
  return out;
}

// The heuristics' algorithms with status success, best first.
StatusOr<std::vector<ConvAlgo>> HeuristicAlgos(const KernelContext& ctx, WorkKind kind,
                                               const ConvDescriptors& d) {
  int max = 0, returned = 0;
  std::vector<ConvAlgo> algos;
  switch (kind) {
    case WorkKind::kConvForward: {
      MEMEST_CUDNN_TRY(cudnnGetConvolutionForwardAlgorithmMaxCount(ctx.cudnn, &max));
      std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(std::max(max, 1));
      MEMEST_CUDNN_TRY(cudnnGetConvolutionForwardAlgorithm_v7(ctx.cudnn, d.x, d.w, d.conv, d.y,
                                                              max, &returned, perf.data()));
      algos = Successful(perf, returned);
      break;
    }
    case WorkKind::kConvBackwardData: {
      MEMEST_CUDNN_TRY(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(ctx.cudnn, &max));
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(std::max(max, 1));
      MEMEST_CUDNN_TRY(cudnnGetConvolutionBackwardDataAlgorithm_v7(
          ctx.cudnn, d.w, d.y, d.conv, d.x, max, &returned, perf.data()));
      algos = Successful(perf, returned);
      break;
    }
    case WorkKind::kConvBackwardFilter: {
      MEMEST_CUDNN_TRY(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(ctx.cudnn, &max));
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(std::max(max, 1));
      MEMEST_CUDNN_TRY(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
          ctx.cudnn, d.x, d.y, d.conv, d.w, max, &returned, perf.data()));
      algos = Successful(perf, returned);
      break;
    }
    default:
      return Internal("not a convolution kind");
  }
  if (algos.empty()) {
    return FailedPrecondition("cuDNN's heuristics list no algorithm that can run this "
                              "convolution (no entry with status success)");
  }
  return algos;
}

// One run of `algo` on ctx.stream. The math type goes on the descriptor first: cuDNN picks a
// (algorithm, math type) pair and runs the slower kernel if the descriptor disagrees.
Status LaunchConv(const KernelContext& ctx, const Work& work, const ConvDescriptors& d,
                  const ConvAlgo& algo) {
  MEMEST_CUDNN_TRY(cudnnSetConvolutionMathType(d.conv, algo.math));
  const float alpha = 1.0f, beta = 0.0f;  // float scaling for float, half and bfloat16 data
  void* ws = algo.memory > 0 ? reinterpret_cast<void*>(work.workspace) : nullptr;
  const size_t ws_bytes = static_cast<size_t>(algo.memory);
  const void* in0 = reinterpret_cast<const void*>(work.inputs[0]);
  const void* in1 = reinterpret_cast<const void*>(work.inputs[1]);
  void* out = reinterpret_cast<void*>(work.output);
  switch (work.kind) {
    case WorkKind::kConvForward:  // inputs: x, w
      MEMEST_CUDNN_TRY(cudnnConvolutionForward(
          ctx.cudnn, &alpha, d.x, in0, d.w, in1, d.conv,
          static_cast<cudnnConvolutionFwdAlgo_t>(algo.algo), ws, ws_bytes, &beta, d.y, out));
      break;
    case WorkKind::kConvBackwardData:  // inputs: dy, w
      MEMEST_CUDNN_TRY(cudnnConvolutionBackwardData(
          ctx.cudnn, &alpha, d.w, in1, d.y, in0, d.conv,
          static_cast<cudnnConvolutionBwdDataAlgo_t>(algo.algo), ws, ws_bytes, &beta, d.x, out));
      break;
    case WorkKind::kConvBackwardFilter:  // inputs: x, dy
      MEMEST_CUDNN_TRY(cudnnConvolutionBackwardFilter(
          ctx.cudnn, &alpha, d.x, in0, d.y, in1, d.conv,
          static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo.algo), ws, ws_bytes, &beta, d.w,
          out));
      break;
    default:
      return Internal("not a convolution kind");
  }
  return Status::Ok();
}

// ---- Check ---------------------------------------------------------------------------------

// Flat indices of the three NCHW arrays, and the host's sums over them.
struct ConvRef {
  const ConvShape& c;
  int64_t cg, kg, oh, ow;  // channels per group (in, out), output height and width

  explicit ConvRef(const ConvShape& shape)
      : c(shape),
        cg(shape.c / shape.groups),
        kg(shape.k / shape.groups),
        oh(shape.out_h()),
        ow(shape.out_w()) {}

  int64_t X(int64_t n, int64_t ch, int64_t h, int64_t w) const {
    return ((n * c.c + ch) * c.h + h) * c.w + w;
  }
  int64_t W(int64_t k, int64_t ch, int64_t r, int64_t s) const {
    return ((k * cg + ch) * c.r + r) * c.s + s;
  }
  int64_t Y(int64_t n, int64_t k, int64_t h, int64_t w) const {
    return ((n * c.k + k) * oh + h) * ow + w;
  }
  // The input row or column that output position `o`, kernel tap `t` reads; -1 outside.
  static int64_t In(int64_t o, int64_t t, int64_t stride, int64_t pad, int64_t dil, int64_t size) {
    const int64_t i = o * stride - pad + t * dil;
    return i >= 0 && i < size ? i : -1;
  }
  // The output position whose tap `t` reads input position `i`; -1 if none.
  static int64_t Out(int64_t i, int64_t t, int64_t stride, int64_t pad, int64_t dil,
                     int64_t size) {
    const int64_t v = i + pad - t * dil;
    if (v < 0 || v % stride != 0) return -1;
    return v / stride < size ? v / stride : -1;
  }
};

// Sums for output element `idx` of the kind: the value, the sum of |terms| and the square root
// of the sum of squared terms. `a` and `b` are the seeds of inputs[0] and inputs[1].
void Reference(const ConvRef& r, WorkKind kind, int a, int b, int64_t idx, double* want,
               double* l1, double* l2, std::string* name) {
  const ConvShape& c = r.c;
  double sum = 0, abs_sum = 0, sq_sum = 0;
  auto add = [&](double p) {
    sum += p;
    abs_sum += std::fabs(p);
    sq_sum += p * p;
  };
  if (kind == WorkKind::kConvForward) {  // y[n, k, oh, ow]
    const int64_t ow = idx % r.ow, oh = idx / r.ow % r.oh, k = idx / (r.ow * r.oh) % c.k,
                  n = idx / (r.ow * r.oh * c.k);
    const int64_t g = k / r.kg;
    for (int64_t ch = 0; ch < r.cg; ++ch)
      for (int64_t t = 0; t < c.r; ++t)
        for (int64_t u = 0; u < c.s; ++u) {
          const int64_t ih = ConvRef::In(oh, t, c.stride_h, c.pad_h, c.dilation_h, c.h);
          const int64_t iw = ConvRef::In(ow, u, c.stride_w, c.pad_w, c.dilation_w, c.w);
          if (ih < 0 || iw < 0) continue;
          add(double{PatternValue(a, r.X(n, g * r.cg + ch, ih, iw))} *
              PatternValue(b, r.W(k, ch, t, u)));
        }
    *name = "y[" + std::to_string(n) + ", " + std::to_string(k) + ", " + std::to_string(oh) +
            ", " + std::to_string(ow) + "]";
  } else if (kind == WorkKind::kConvBackwardData) {  // dx[n, ch, ih, iw]; a: dy, b: w
    const int64_t iw = idx % c.w, ih = idx / c.w % c.h, ch = idx / (c.w * c.h) % c.c,
                  n = idx / (c.w * c.h * c.c);
    const int64_t g = ch / r.cg;
    for (int64_t k = g * r.kg; k < (g + 1) * r.kg; ++k)
      for (int64_t t = 0; t < c.r; ++t)
        for (int64_t u = 0; u < c.s; ++u) {
          const int64_t oh = ConvRef::Out(ih, t, c.stride_h, c.pad_h, c.dilation_h, r.oh);
          const int64_t ow = ConvRef::Out(iw, u, c.stride_w, c.pad_w, c.dilation_w, r.ow);
          if (oh < 0 || ow < 0) continue;
          add(double{PatternValue(a, r.Y(n, k, oh, ow))} *
              PatternValue(b, r.W(k, ch - g * r.cg, t, u)));
        }
    *name = "dx[" + std::to_string(n) + ", " + std::to_string(ch) + ", " + std::to_string(ih) +
            ", " + std::to_string(iw) + "]";
  } else {  // dw[k, ch, t, u]; a: x, b: dy
    const int64_t u = idx % c.s, t = idx / c.s % c.r, ch = idx / (c.s * c.r) % r.cg,
                  k = idx / (c.s * c.r * r.cg);
    const int64_t g = k / r.kg;
    for (int64_t n = 0; n < c.n; ++n)
      for (int64_t oh = 0; oh < r.oh; ++oh)
        for (int64_t ow = 0; ow < r.ow; ++ow) {
          const int64_t ih = ConvRef::In(oh, t, c.stride_h, c.pad_h, c.dilation_h, c.h);
          const int64_t iw = ConvRef::In(ow, u, c.stride_w, c.pad_w, c.dilation_w, c.w);
          if (ih < 0 || iw < 0) continue;
          add(double{PatternValue(a, r.X(n, g * r.cg + ch, ih, iw))} *
              PatternValue(b, r.Y(n, k, oh, ow)));
        }
    *name = "dw[" + std::to_string(k) + ", " + std::to_string(ch) + ", " + std::to_string(t) +
            ", " + std::to_string(u) + "]";
  }
  *want = sum;
  *l1 = abs_sum;
  *l2 = std::sqrt(sq_sum);
}

// cuDNN's names for the algorithm numbers of each kind, for messages.
const char* AlgoName(WorkKind kind, int algo) {
  static const char* const kForward[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM",
                                         "DIRECT", "FFT", "FFT_TILING", "WINOGRAD",
                                         "WINOGRAD_NONFUSED"};
  static const char* const kBackwardData[] = {"ALGO_0", "ALGO_1", "FFT", "FFT_TILING",
                                              "WINOGRAD", "WINOGRAD_NONFUSED"};
  static const char* const kBackwardFilter[] = {"ALGO_0", "ALGO_1", "FFT", "ALGO_3",
                                                "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"};
  auto pick = [algo](const char* const* names, int count) {
    return algo >= 0 && algo < count ? names[algo] : "unknown";
  };
  switch (kind) {
    case WorkKind::kConvForward: return pick(kForward, 8);
    case WorkKind::kConvBackwardData: return pick(kBackwardData, 6);
    default: return pick(kBackwardFilter, 7);
  }
}

// FFT and Winograd transform their operands before multiplying; the others sum products of
// the operands as they are.
bool Transforms(WorkKind kind, int algo) {
  switch (kind) {
    case WorkKind::kConvForward:
      return algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT ||
             algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
             algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD ||
             algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
    case WorkKind::kConvBackwardData:
      return algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT ||
             algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
             algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD ||
             algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
    default:
      return algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT ||
             algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
             algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD ||
             algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
  }
}

// Products of pattern values are exact in every precision, TF32 included (pattern.h), so an
// algorithm that sums them in float is exact before the output's rounding; a small margin
// relative to the sum of |terms| (l1) covers a partial sum kept in the output type.
//
// FFT and Winograd round transformed operands (to TF32 on sm_80+ for float32 under the default
// math type, to half for float16), and the transforms amplify that rounding, past any fixed
// fraction of l1 (2e-3 and 4e-3 of it fail legitimate results). Simulating Winograd with the transformed operands rounded to 11 significant bits (TF32, half) over
// these patterns gives |error| / l1 up to 2.3e-2 for F(4x4,3x3) and 6.4e-2 for F(6x6,3x3) with
// one input channel, 4.6e-3 for F(6x6,3x3) at 32 channels: the error grows like the square
// root of the number of terms, l1 like the number, so no fixed fraction of l1 fits both few
// and many channels. Relative to l2 (the root of the sum of squared terms) it stays put: at
// most 0.05 (F(4x4)) and 0.16 (F(6x6)) with round-to-nearest, so 0.4 leaves room for
// truncating conversions; 8-bit bfloat16 operands would err about 8 times more (cuDNN's FFT
// and Winograd algorithms are not known to take bfloat16 at all). A wrong index or layout
// still shows: it moves the result by about l2 times sqrt(2), and every sample is checked.
Tolerance ConvTolerance(DType dtype, bool transforms) {
  switch (dtype) {
    case DType::kFloat16: return {1e-6, 2e-3, transforms ? 0.4 : 1e-3};
    case DType::kBFloat16: return {1e-6, 1.6e-2, transforms ? 3.0 : 8e-3};
    default: return {1e-6, 1e-5, transforms ? 0.4 : 1e-5};
  }
}

Status CheckConv(const KernelContext& ctx, const Work& work, const std::vector<int>& seeds,
                 int algo) {
  const ConvShape& c = work.conv;
  const ConvRef r(c);
  int64_t total = 0, cost = 0;  // output elements, host multiply-adds per sample
  switch (work.kind) {
    case WorkKind::kConvForward: total = c.n * c.k * r.oh * r.ow; cost = r.cg * c.r * c.s; break;
    case WorkKind::kConvBackwardData: total = c.n * c.c * c.h * c.w; cost = r.kg * c.r * c.s; break;
    default: total = c.k * r.cg * c.r * c.s; cost = c.n * r.oh * r.ow; break;
  }
  const int count = static_cast<int>(std::clamp<int64_t>(20'000'000 / std::max<int64_t>(cost, 1),
                                                         4, 48));
  const bool transforms = Transforms(work.kind, algo);
  const Tolerance tol = ConvTolerance(work.dtype, transforms);
  for (int64_t idx : SampleIndices(total, count)) {
    double want = 0, l1 = 0, l2 = 0;
    std::string name;
    Reference(r, work.kind, seeds[0], seeds[1], idx, &want, &l1, &l2, &name);
    MEMEST_ASSIGN_OR_RETURN(std::vector<double> got,
                            ReadBack(ctx, work.output, work.dtype, idx, 1));
    // The scale ConvTolerance's rscale is relative to: l2 for FFT and Winograd, l1 otherwise.
    Status st = ExpectNear(name, got[0], RoundTo(work.dtype, want), transforms ? l2 : l1, tol);
    if (!st.ok()) {
      return Internal(st.message() + " (cuDNN algorithm " + AlgoName(work.kind, algo) + ")");
    }
  }
  return Status::Ok();
}

std::vector<int64_t> InputElements(const Work& work) {
  const ConvShape& c = work.conv;
  const int64_t x = c.n * c.c * c.h * c.w;
  const int64_t w = c.k * (c.c / c.groups) * c.r * c.s;
  const int64_t y = c.n * c.k * c.out_h() * c.out_w();
  switch (work.kind) {
    case WorkKind::kConvForward: return {x, w};
    case WorkKind::kConvBackwardData: return {y, w};
    default: return {x, y};
  }
}

}  // namespace

StatusOr<int64_t> ConvWorkspaceBytes(const KernelContext& ctx, const Work& work) {
  const std::string prefix = std::string(KindName(work.kind)) + ": ";
  ConvDescriptors d;
  MEMEST_RETURN_IF_ERROR(d.Init(work).Prefixed(prefix));
  StatusOr<std::vector<ConvAlgo>> algos = HeuristicAlgos(ctx, work.kind, d);
  if (!algos.ok()) return algos.status().Prefixed(prefix);
  return algos->front().memory;
}

StatusOr<Timing> RunConv(const KernelContext& ctx, const Work& work, int repeats) {
  const std::string prefix = std::string(KindName(work.kind)) + ": ";
  ConvDescriptors d;
  MEMEST_RETURN_IF_ERROR(d.Init(work).Prefixed(prefix));
  StatusOr<std::vector<ConvAlgo>> algos = HeuristicAlgos(ctx, work.kind, d);
  if (!algos.ok()) return algos.status().Prefixed(prefix);

  // The first algorithm whose workspace fits and that cuDNN agrees to run (one trial launch,
  // on whatever the buffers hold; the harness fills them before anything it measures).
  const ConvAlgo* chosen = nullptr;
  Status first_error;
  for (const ConvAlgo& algo : *algos) {
    if (algo.memory > work.workspace_bytes) continue;
    Status st = LaunchConv(ctx, work, d, algo);
    if (st.ok()) {
      chosen = &algo;
      break;
    }
    if (first_error.ok()) first_error = st;
  }
  if (chosen == nullptr) {
    if (!first_error.ok()) return first_error.Prefixed(prefix);
    return FailedPrecondition(prefix +
                              "every algorithm cuDNN lists needs more workspace than the " +
                              FormatBytes(work.workspace_bytes) +
                              " given (its first choice needs " +
                              FormatBytes(algos->front().memory) +
                              "; WorkspaceBytes says what to allocate)");
  }

  const std::vector<int> seeds = PatternSeeds(work.inputs);
  const std::vector<int64_t> elements = InputElements(work);
  const ConvAlgo algo = *chosen;
  Bench bench;
  bench.name = KindName(work.kind);
  bench.prepare = [&] { return FillInputs(ctx, work.dtype, work.inputs, elements); };
  bench.launch = [&] { return LaunchConv(ctx, work, d, algo); };
  bench.check = [&] { return CheckConv(ctx, work, seeds, algo.algo); };
  return RunBench(ctx, bench, repeats);
}

Status TinyConv(const KernelContext& ctx, DevicePtr scratch) {
  Work work;
  work.kind = WorkKind::kConvForward;
  work.dtype = DType::kFloat32;
  work.conv.n = 1;
  work.conv.c = 1;
  work.conv.h = 8;
  work.conv.w = 8;
  work.conv.k = 1;
  work.conv.r = 3;
  work.conv.s = 3;
  work.inputs = {scratch, scratch + 1024};  // x: 256 B, w: 36 B
  work.output = scratch + 2048;             // y: 144 B
  MEMEST_CUDA_TRY(cudaMemsetAsync(reinterpret_cast<void*>(scratch), 0, 4096, ctx.stream));
  ConvDescriptors d;
  MEMEST_RETURN_IF_ERROR(d.Init(work));
  MEMEST_ASSIGN_OR_RETURN(std::vector<ConvAlgo> algos, HeuristicAlgos(ctx, work.kind, d));
  // The heuristics' choices that need no workspace, then implicit GEMM, which never does:
  // the first that runs.
  std::vector<ConvAlgo> candidates;
  for (const ConvAlgo& a : algos) {
    if (a.memory == 0) candidates.push_back(a);
  }
  candidates.push_back({CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, CUDNN_DEFAULT_MATH, 0});
  Status st;
  for (const ConvAlgo& a : candidates) {
    st = LaunchConv(ctx, work, d, a);
    if (st.ok()) break;
  }
  MEMEST_RETURN_IF_ERROR(st);
  MEMEST_CUDA_TRY(cudaStreamSynchronize(ctx.stream));
  return Status::Ok();
}

}  // namespace memest::kernels
