// A leaf that several ops read (a tied weight: GPT-2's and BERT's word embedding is also the LM
// head): autograd sums the readers' gradients in its AccumulateGrad node's input buffer and
// runs AccumulateGrad once, after the first reader's backward (measured: the zoo's hf_bert,
// hf_bart and hf_gpt_neo, and a tied embedding/head pair, tests/conformance/zoo.py).
#include <gtest/gtest.h>

#include "engine/models/model.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::PhasePeak;

constexpr int64_t kTable = 512 * 64 * 4;  // W [512, 64], float32

// logits = linear(embedding(W, ids), W): W is read twice; loss = sum(logits).
OpGraphSpec TiedHead() {
  OpGraphSpec g;
  g.tensors = {TensorSpec{"ids", {4}, DType::kInt64, TensorRole::kInput, 0},
               TensorSpec{"W", {512, 64}, DType::kFloat32, TensorRole::kParameter, -1}};
  g.ops = {OpSpec{"embedding", {"W", "ids"}, {"h"}, {}, ""},
           OpSpec{"linear", {"h", "W"}, {"logits"}, {}, ""},
           OpSpec{"sum", {"logits"}, {"loss"}, {}, ""}};
  g.loss = "loss";
  g.traced_batch = 4;
  return g;
}

TEST(SharedLeafTest, GradientsAreSummedBeforeAccumulateGrad) {
  RunConfig cfg = enginetest::PlainTraining();
  cfg.runtime = Runtime::kCpuTorch113;  // bytes as they are; 1.13 sums out of place
  const Graph g = BuildOpGraph(TiedHead(), enginetest::MakeContext(4)).value();
  const Liveness l = enginetest::Walk(g, cfg);
  // W, the head's gradient held in the input buffer, the embedding's table-sized gradient and
  // their sum are alive together...
  EXPECT_GE(PhasePeak(l, Phase::kBackward).allocated_bytes, 4 * kTable);
  EXPECT_LT(PhasePeak(l, Phase::kBackward).allocated_bytes, 5 * kTable);
  // ...and the sum becomes W.grad, the only gradient left.
  EXPECT_EQ(l.at_end[static_cast<int>(Category::kGradients)], kTable);
}

}  // namespace
}  // namespace memest
