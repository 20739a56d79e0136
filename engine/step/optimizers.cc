#include "engine/step/optimizers.h"

namespace memest {
namespace {

bool IsHalf(DType d) { return d == DType::kFloat16 || d == DType::kBFloat16; }

// [.., rows, cols] -> the numel of the tensor without its last dim, and without its second
// last.
int64_t Rows(const Shape& s) { return Numel(Shape(s.begin(), s.end() - 1)); }
int64_t Cols(const Shape& s) {
  Shape c(s.begin(), s.end() - 2);
  c.push_back(s.back());
  return Numel(c);
}

// `count` values of `size` bytes, checked: a state tensor of a shape no graph tensor has (an
// empty parameter's [rows, 1] variance may pass 2^62 bytes) saturates at kMaxBytes, which the
// step simulator then refuses, naming the sum it entered.
int64_t StateBytes(int64_t count, int64_t size) {
  const StatusOr<int64_t> bytes = CheckedMul(count, size);
  return bytes.ok() ? *bytes : kMaxBytes;
}

}  // namespace

OptimizerCosts CostsOf(const OptimizerConfig& o, Runtime runtime) {
  OptimizerCosts c;
  const int wd = o.weight_decay > 0 ? 1 : 0;  // grad.add(param, alpha=wd): a new tensor
  switch (o.kind) {
    case OptimizerKind::kSgd: c = {0, wd, wd}; break;
    case OptimizerKind::kSgdMomentum: c = {1, wd, wd}; break;
    // _single_tensor_adam: (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps) holds the
    // sqrt and the quotient at once; _multi_tensor_adam: one _foreach_sqrt list, then in place.
    case OptimizerKind::kAdam: c = {2, 2 + wd, 1 + wd}; break;
    case OptimizerKind::kAdamW: c = {2, 2, 1}; break;  // decay is param.mul_(): in place
    case OptimizerKind::kAdagrad: c = {1, 1 + wd, 1 + wd}; c.state_at_init = true; break;
    case OptimizerKind::kRmsprop: c = {1, 1 + wd, 1 + wd}; break;
    case OptimizerKind::kLion: c = {1, 1, 1}; break;  // exp_avg.clone().lerp_(grad).sign_()
    // torch.optim.Adafactor: var_estimate = row_var @ col_var (a full-size tensor), then in
    // place; the factored state is ExtraStateBytes.
    case OptimizerKind::kAdafactor: c = {0, 1, 1}; break;
    // transformers.AdamW: exp_avg, exp_avg_sq; denom = exp_avg_sq.sqrt().add_(eps), one
    // tensor; decay p.add_(p, alpha=...) in place; `step` a Python int.
    case OptimizerKind::kHfAdamW: c = {2, 1, 1}; break;
    // transformers.Adafactor (beta1=None, its default: no exp_avg): update = grad**2 + eps is
    // two float32 tensors at once, and so is update = _approx_sq_grad(row, col) (r_factor *
    // c_factor) while the old update is still referenced; the rest is in place.
    case OptimizerKind::kHfAdafactor:
      c = {0, 2, 2};
      c.float32_scratch = true;
      break;
    // bitsandbytes' Optimizer2State: the state is ExtraStateBytes's; `step` a Python int; each
    // parameter one fused kernel that allocates nothing.
    case OptimizerKind::kBnbAdamW8bit:
    case OptimizerKind::kBnbPagedAdamW8bit:
    case OptimizerKind::kBnbPagedAdamW32bit:
      return c;
  }
  // The for-loop's `denom` (the quotient) is a local of the loop body in _single_tensor_adam
  // and _single_tensor_adamw, 1.13 and 2.x alike: the previous parameter's lives until the next
  // one's is assigned, after that parameter's sqrt and quotient are made. transformers' loops
  // keep theirs the same way: AdamW's `denom`, and Adafactor's `update`, reassigned only once
  // the next parameter's `(grad ** 2) + eps` exists.
  if (o.kind == OptimizerKind::kAdam || o.kind == OptimizerKind::kAdamW ||
      o.kind == OptimizerKind::kHfAdamW || o.kind == OptimizerKind::kHfAdafactor) {
    c.loop_carry = 1;
  }
  const bool step_tensor = o.kind == OptimizerKind::kAdam || o.kind == OptimizerKind::kAdamW ||
                           o.kind == OptimizerKind::kAdagrad;
  if (o.impl == OptimizerImpl::kFused) {
    c.loop_scratch = c.loop_carry = c.all_scratch = 0;
    c.device_step = step_tensor;
  }
  if (runtime == Runtime::kCpuTorch113) {
    // 1.13's _multi_tensor_adam: denom = _foreach_add(_foreach_sqrt(exp_avg_sqs), eps), two
    // lists; and the step counters are CPU tensors, on the CPU the step's own device.
    if (o.kind == OptimizerKind::kAdam || o.kind == OptimizerKind::kAdamW) c.all_scratch += 1;
    c.device_step = step_tensor;
  }
  return c;
}

OptimizerImpl EffectiveImpl(const OptimizerConfig& o) {
  if (IsBitsandbytes(o.kind)) return OptimizerImpl::kFused;
  if (o.kind == OptimizerKind::kHfAdamW || o.kind == OptimizerKind::kHfAdafactor) {
    return OptimizerImpl::kForLoop;
  }
  return o.impl;
}

std::vector<int64_t> ExtraStateBytes(const OptimizerConfig& o, const Tensor& p) {
  const Shape& s = p.shape;
  if (IsBitsandbytes(o.kind)) {
    // Optimizer8bit.init_state (bitsandbytes/optim/optimizer.py): 8-bit for parameters of
    // min_8bit_size = 4096 elements or more, uint8 state1 and state2 with a float32 absmax per
    // 256-element block each; float32 state1 and state2 otherwise, and for the 32-bit kind.
    const int64_t n = Numel(s);
    if (o.kind != OptimizerKind::kBnbPagedAdamW32bit && n >= kBnbMin8bitSize) {
      const int64_t absmax = StateBytes((n + kBnbStateBlock - 1) / kBnbStateBlock, 4);
      return {n, n, absmax, absmax};
    }
    return {StateBytes(n, 4), StateBytes(n, 4)};
  }
  if (o.kind == OptimizerKind::kAdafactor) {
    const int64_t es = DTypeSize(p.dtype);
    if (s.size() < 2) return {StateBytes(Numel(s), es)};
    return {StateBytes(Rows(s), es), StateBytes(Cols(s), es)};
  }
  if (o.kind == OptimizerKind::kHfAdafactor) {
    // zeros of the (float32 when half) grad's shape; factored when len(shape) >= 2.
    const int64_t es = IsHalf(p.dtype) ? 4 : DTypeSize(p.dtype);
    if (s.size() < 2) return {StateBytes(Numel(s), es), 4};
    return {StateBytes(Rows(s), es), StateBytes(Cols(s), es), 4};
  }
  return {};
}

std::vector<int64_t> LoopSideScratchBytes(const OptimizerConfig& o, const Tensor& p) {
  if (o.kind != OptimizerKind::kHfAdafactor || p.shape.size() < 2) return {};
  return {StateBytes(Rows(p.shape), 4), StateBytes(Cols(p.shape), 4)};
}

int64_t ScratchBytes(const OptimizerCosts& c, const Tensor& p) {
  if (c.float32_scratch && IsHalf(p.dtype)) return Numel(p.shape) * 4;
  return Bytes(p.shape, p.dtype);
}

int UpcastCopies(const OptimizerCosts& c, const Tensor& p) {
  return c.float32_scratch && IsHalf(p.dtype) ? 2 : 0;
}

}  // namespace memest
