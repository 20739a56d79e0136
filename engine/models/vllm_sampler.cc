// vLLM's profile run around the LM head (engine/models/vllm_sampler.h).
#include "engine/models/vllm_sampler.h"

#include <algorithm>
#include <string>

#include "engine/models/layers.h"

namespace memest {

int VllmSamplerInput(GraphBuilder& b, int h, int* gathered) {
  if (!b.ok() || h < 0) return h;
  *gathered = b.Add1("contiguous", {h});
  return b.Add1("full", {}, {{"shape", AttrInts(b.shape(*gathered))},
                             {"dtype", std::string(DTypeName(b.tensor(*gathered).dtype))}});
}

void VllmSampler(GraphBuilder& b, int logits, int multiprocessors) {
  if (!b.ok() || logits < 0) return;
  ScopeGuard scope(b, "sampler");
  const Shape shape = b.shape(logits);
  const std::string f32(DTypeName(DType::kFloat32));
  int x = b.Add1("to", {logits}, {{"dtype", f32}});
  const int upcast = x;
  Shape temp_shape(shape.size(), 1);
  temp_shape[0] = shape[0];
  const int temperature = b.Add1("full", {}, {{"shape", AttrInts(temp_shape)}, {"dtype", f32}});
  x = b.Add1("div_", {x, temperature});
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  int scratch = -1;
  if (rows >= 8) {
    // NUM_PROGRAMS = min(SMs, batch); the buffer's rows min(next_power_of_2(NUM_PROGRAMS), SMs).
    const int64_t programs = std::min<int64_t>(rows, multiprocessors);
    int64_t buffer = 1;
    while (buffer < programs) buffer *= 2;
    buffer = std::min<int64_t>(buffer, multiprocessors);
    scratch = b.Add1("full", {}, {{"shape", AttrInts({buffer, shape.back()})}, {"dtype", f32}});
  } else {
    b.Add("sort", {x}, {{"dim", AttrInt(-1)}});
  }
  const int probs = b.Add1("softmax", {x}, {{"dim", AttrInt(-1)}});
  int q = b.Add1("full", {}, {{"shape", AttrInts(b.shape(probs))}, {"dtype", f32}});
  q = b.Add1("exponential_", {q});
  const int ratio = b.Add1("div_", {probs, q});
  b.Add("max", {ratio}, {{"dim", AttrInt(-1)}});
  b.HoldUntilLastOp(upcast);  // Sampler.forward's `logits`, while sample() runs
  b.HoldUntilLastOp(scratch);  // _TRITON_BUFFER_CACHE
}

}  // namespace memest
