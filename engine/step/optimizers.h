// The optimizer cost table: what each optimizer keeps per parameter and what its step
// allocates, as torch.optim (and transformers' own optimizers) run it. The step simulator
// (engine/step/optimizer_step.cc) allocates from this table; docs/step-model.md gives the source
// of each row.
#ifndef MEMEST_ENGINE_STEP_OPTIMIZERS_H_
#define MEMEST_ENGINE_STEP_OPTIMIZERS_H_

#include <cstdint>
#include <vector>

#include "engine/ir/config.h"
#include "engine/ir/graph.h"

namespace memest {

// Per parameter, in tensors shaped like it.
struct OptimizerCosts {
  int state = 0;          // persistent state (exp_avg, momentum_buffer, ...)
  int loop_scratch = 0;   // scratch per parameter, one parameter at a time (for-loop)
  int all_scratch = 0;    // scratch for every parameter at once (foreach)
  bool state_at_init = false;  // created in the constructor (Adagrad), not on the first step
  bool device_step = false;    // fused: a 0-dim float32 `step` per parameter on the device
  int loop_carry = 0;  // of the for-loop's scratch, the last made that a local keeps alive
                       // until the next parameter's scratch exists
  // The scratch is float32 whatever the parameter's dtype (transformers' Adafactor computes in
  // float32), and a float16/bfloat16 parameter's grad and data are first copied to float32
  // (grad.float(), p.float()), both alive through that parameter's update.
  bool float32_scratch = false;
};

// The costs of `o` under `runtime` (1.13's CPU foreach Adam keeps one more list of scratch).
OptimizerCosts CostsOf(const OptimizerConfig& o, Runtime runtime);

// How the step loops: transformers' optimizers have one implementation, a Python loop over the
// parameters, whatever config.optimizer.impl says; torch.optim's follow it.
OptimizerImpl EffectiveImpl(const OptimizerConfig& o);

// bitsandbytes' 8-bit optimizers: parameters below this many elements keep float32 state
// (min_8bit_size), and the 8-bit state's blocks (one float32 absmax each).
constexpr int64_t kBnbMin8bitSize = 4096;
constexpr int64_t kBnbStateBlock = 256;

// The state kept beyond CostsOf().state parameter-sized tensors, one entry per tensor:
//   bitsandbytes' AdamW: state1 and state2, uint8 with their float32 absmax [n / 256] from
//     4096 elements (8-bit kinds), float32 otherwise;
//   Adafactor (torch.optim, 2.5+): row_var [.., rows, 1] and col_var [.., 1, cols] in the
//     parameter's dtype for a matrix, one variance like it for a vector;
//   transformers' Adafactor: exp_avg_sq_row [.., rows] and exp_avg_sq_col [.., cols] in float32
//     (exp_avg_sq like the parameter for a vector), and the 0-dim float32 RMS.
std::vector<int64_t> ExtraStateBytes(const OptimizerConfig& o, const Tensor& p);

// Smaller scratch the loop holds beside its full-size scratch for parameter `p`, one entry per
// tensor: transformers' Adafactor's r_factor [.., rows] and c_factor [.., cols] (float32), alive
// while _approx_sq_grad multiplies them into the new update. Empty otherwise.
std::vector<int64_t> LoopSideScratchBytes(const OptimizerConfig& o, const Tensor& p);

// The bytes of one scratch tensor of the step for parameter `p`.
int64_t ScratchBytes(const OptimizerCosts& c, const Tensor& p);

// The float32 copies a step makes of a half parameter and its grad before updating it (two for
// transformers' Adafactor on a float16/bfloat16 parameter; none otherwise), each of these bytes.
int UpcastCopies(const OptimizerCosts& c, const Tensor& p);

}  // namespace memest

#endif  // MEMEST_ENGINE_STEP_OPTIMIZERS_H_
