// Recurrent layers (ops lstm and gru: one nn.LSTM / nn.GRU call) as PyTorch 1.13 runs them on
// the CPU.
//
// An lstm / gru op reads the input x ([T, B, I], or [B, T, I] with attrs.batch_first=1), then
// for each layer l and direction d (forward, then reverse with attrs.bidirectional=1) the
// weights w_ih [G, I_l], w_hh [G, H] and, with attrs.bias=1 (the default), b_ih [G] and b_hh
// [G] (nn.RNNBase._flat_weights' order; G = 4H for LSTM, 3H for GRU, I_l = I for the first
// layer and D * H after it), then optionally the initial state h0 (and c0 for LSTM), each
// [L * D, B, H]: without them the layer starts from zeros it makes itself, as nn.LSTM does.
// attrs.num_layers (1), attrs.dropout (0: between layers, in training). Outputs: output
// [T, B, D * H] (batch-first like x), h_n and for LSTM c_n, [L * D, B, H].
//
// On the CUDA runtime the op is one cuDNN call (engine/rules/rnn.cc). PyTorch 1.13's CPU path
// (aten/src/ATen/native/RNN.cpp, _lstm_impl / _gru_impl with pre-computed input projections)
// is a sequence of aten ops: ExpandRecurrentForCpu replaces each lstm / gru op with exactly
// those ops, so that their own rules give what autograd keeps per step.
#ifndef MEMEST_ENGINE_PASSES_RNN_EXPAND_H_
#define MEMEST_ENGINE_PASSES_RNN_EXPAND_H_

#include <string>
#include <vector>

#include "engine/ir/graph.h"
#include "engine/ir/status.h"

namespace memest {

// An lstm / gru op's layer, read off its inputs and attributes.
struct RecurrentShape {
  bool lstm = true;
  int64_t layers = 1, dirs = 1;
  int64_t seq = 0, batch = 0, input = 0, hidden = 0;
  bool batch_first = false, bias = true, has_state = false;
  double dropout = 0;
  // Input index of w_ih for layer l, direction d (w_hh, b_ih, b_hh follow it).
  int Weight(int64_t l, int64_t d) const {
    return 1 + static_cast<int>((l * dirs + d) * (bias ? 4 : 2));
  }
};

// Validates op (kind lstm or gru) and its inputs; errors name "<field>.inputs[i]" or
// "<field>.attrs.<name>".
StatusOr<RecurrentShape> ReadRecurrent(const Op& op, const TensorPtrs& inputs,
                                       const std::string& field);

// True if `g` has an lstm or gru op.
bool HasRecurrent(const Graph& g);

// `g` with every lstm / gru op replaced by the ops PyTorch 1.13's CPU path runs for it. An op
// that would become more than kMaxExpandedOps ops is refused (INVALID_ARGUMENT naming it).
inline constexpr int64_t kMaxExpandedOps = 1'000'000;
StatusOr<Graph> ExpandRecurrentForCpu(const Graph& g);

}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_RNN_EXPAND_H_
