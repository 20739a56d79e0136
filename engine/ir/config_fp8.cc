// config.fp8 (engine/ir/config.h), checked for ValidateRunConfig.
#include <string>

#include "engine/ir/config.h"

namespace memest {

Status ValidateFp8(const RunConfig& c) {
  const Fp8Config& f = c.fp8;
  if (f.recipe == Fp8Recipe::kNone) {
    if (f.amax_history_len != Fp8Config{}.amax_history_len) {
      return InvalidArgument("config.fp8.amax_history_len: set without config.fp8.recipe");
    }
    return Status::Ok();
  }
  if (f.amax_history_len < 1 || f.amax_history_len > kMaxAmaxHistory) {
    return InvalidArgument("config.fp8.amax_history_len: in [1, " +
                           std::to_string(kMaxAmaxHistory) + "], got " +
                           std::to_string(f.amax_history_len));
  }
  if (f.recipe == Fp8Recipe::kCurrent && f.amax_history_len != Fp8Config{}.amax_history_len) {
    return InvalidArgument("config.fp8.amax_history_len: current scaling keeps no history");
  }
  if (c.mode != Mode::kTraining) {
    return InvalidArgument(
        "config.fp8: fp8 training; accelerate runs evaluation without "
        "fp8_autocast (use_autocast_during_eval false)");
  }
  if (c.precision != Precision::kBf16Amp && c.precision != Precision::kBf16Pure) {
    return InvalidArgument(
        "config.precision: accelerate's fp8 runs the model under bfloat16 "
        "autocast (bf16, or bf16-pure for a model loaded in bfloat16)");
  }
  if (c.runtime != Runtime::kCuda) {
    return InvalidArgument("config.fp8: TransformerEngine runs on CUDA; the step runs on " +
                           std::string(RuntimeName(c.runtime)));
  }
  if (c.quantization.format != WeightFormat::kDense || c.lora.rank > 0) {
    return InvalidArgument(std::string("config.fp8: with ") +
                           (c.lora.rank > 0 ? "adapters (config.lora)" : "quantized weights") +
                           " is not modelled");
  }
  const ParallelismConfig& p = c.parallelism;
  if (p.tensor > 1 || p.context > 1 || p.pipeline > 1 ||
      (p.sharding != DataSharding::kNone && p.sharding != DataSharding::kDdp)) {
    return InvalidArgument(
        "config.fp8: TransformerEngine's te.Linear is modelled on one GPU and "
        "under DDP");
  }
  return Status::Ok();
}

}  // namespace memest
