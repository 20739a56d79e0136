// Rules for whole recurrent layers: lstm and gru (nn.LSTM / nn.GRU, one op per call of
// torch._VF.lstm / gru).
//
// On CUDA, PyTorch runs them as cuDNN's fused RNN (aten/src/ATen/native/cudnn/RNN.cpp,
// _cudnn_rnn): it returns output, hy, cy, a reserve space and the flat weight buffer, and
// autograd keeps input, hx, cx, output, the reserve and the weights for _cudnn_rnn_backward.
// The reserve holds what cuDNN's backward needs from the forward (the gates of every layer and
// step); its size comes from cudnnGetRNNTempSpaceSizes, which is cuDNN's own (closed) code:
// memest uses T * B * H * e * (L * D * k + (L - 1) * D) bytes with k = 5 (LSTM: four gates and
// the cell) and k = 6 (GRU), which reproduces the sizes cuDNN reported in
// pytorch/pytorch#2895 (736,000,000 and 864,000,000 bytes for a 4-layer, 320-unit LSTM and
// GRU on 25,000 steps x samples). The workspace (cuDNN scratch, a few percent of that) is not
// modelled, as for convolutions. The weights are taken as flattened (nn.RNNBase flattens them
// on .cuda()), so no weight_buf copy is made.
//
// On PyTorch 1.13's CPU runtime the op is not scheduled itself: engine/passes/rnn_expand.h replaces
// it with the aten ops 1.13's CPU path runs (linear over the sequence, per step addmm, add_,
// unsafe_split, sigmoid_ / tanh_, mul, ...), whose own rules give what autograd keeps per step.
#include "engine/passes/rnn_expand.h"
#include "engine/rules/internal.h"

namespace memest {
namespace rules {
namespace {

// cudnnGetRNNTempSpaceSizes' reserve for training, as above; an error when it passes 2^62.
StatusOr<int64_t> CheckedReserveBytes(const RecurrentShape& s, int64_t e) {
  const int64_t per_unit = s.layers * s.dirs * (s.lstm ? 5 : 6) + (s.layers - 1) * s.dirs;
  int64_t bytes = 1;
  for (int64_t f : {s.seq, s.batch, s.hidden, e, per_unit}) {
    MEMEST_ASSIGN_OR_RETURN(bytes, CheckedMul(bytes, f));
  }
  return bytes;
}

StatusOr<std::vector<OutputSpec>> InferRecurrent(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(RecurrentShape s, ReadRecurrent(c.op, c.inputs, c.field));
  const StatusOr<int64_t> reserve = CheckedReserveBytes(s, DTypeSize(c.in(0).dtype));
  if (!reserve.ok()) return InvalidArgument(c.field + ": its cuDNN reserve space passes 2^62 bytes");
  const int64_t t = s.seq, b = s.batch, out_features = s.dirs * s.hidden;
  const Shape out = s.batch_first ? Shape{b, t, out_features} : Shape{t, b, out_features};
  const Shape state{s.layers * s.dirs, b, s.hidden};
  const DType d = c.in(0).dtype;
  std::vector<OutputSpec> outs{{out, d}, {state, d}};
  // batch_first: aten::lstm / gru run sequence-major and hand back output.transpose(0, 1), a
  // [B, T, H] view of a [T, B, H] tensor (nn.MultiheadAttention's transpose back is then a
  // contiguous view).
  if (s.batch_first) outs[0].strides = Strides{out_features, b * out_features, 1};
  if (s.lstm) outs.push_back({state, d});
  return outs;
}

void CudnnRecurrentMemory(const OpCall& c, OpMemory* m) {
  StatusOr<RecurrentShape> read = ReadRecurrent(c.op, c.inputs, c.field);
  if (!read.ok()) return;
  const RecurrentShape& s = *read;
  const int64_t e = DTypeSize(c.in(0).dtype);
  const int states = s.lstm ? 2 : 1;
  const int64_t state_bytes = s.layers * s.dirs * s.batch * s.hidden * e;
  bool grad = false;
  for (size_t i = 0; i < c.inputs.size(); ++i) grad = grad || c.needs_grad(i);
  // nn.LSTM / nn.GRU make zero states in Python when none is given; _cudnn_rnn keeps them.
  std::vector<Alloc> zero_state;
  if (!s.has_state) {
    for (int k = 0; k < states; ++k) zero_state.push_back(Alloc{state_bytes, "zero hidden state"});
  }
  // cuDNN works on a sequence-major input: a batch-first one is copied (x.contiguous()).
  if (s.batch_first) m->forward_temps.push_back(Alloc{BytesOf(c.in(0)), "sequence-major input copy"});
  if (!grad) {  // inference: no reserve (cudnnRNNForward in inference mode)
    for (const Alloc& a : zero_state) m->forward_temps.push_back(a);
    return;
  }
  m->saved_inputs.push_back(0);
  for (int k = 0; k < states && s.has_state; ++k) {
    m->saved_inputs.push_back(static_cast<int>(c.inputs.size()) - states + k);
  }
  m->saved_outputs.push_back(0);
  for (const Alloc& a : zero_state) m->saved_extras.push_back(a);
  const StatusOr<int64_t> reserve = CheckedReserveBytes(s, e);  // checked when inferred
  m->saved_extras.push_back(Alloc{reserve.ok() ? *reserve : 0, "cuDNN reserve space"});
  // _cudnn_rnn_backward: zeros for the gradients of hy / cy that did not arrive (taken as the
  // common case: only the output is used), dx and dhx / dcx computed unconditionally (they
  // update the reserve), and batch-first copies of x and of the output's gradient.
  int64_t scratch = states * state_bytes;
  if (!c.needs_grad(0)) scratch += BytesOf(c.in(0));
  const bool state_grad = s.has_state && c.needs_grad(c.inputs.size() - 1);
  if (!state_grad) scratch += states * state_bytes;
  if (s.batch_first) scratch += BytesOf(c.in(0)) + BytesOf(c.out(0));
  m->backward_temps.push_back(Alloc{scratch, "cuDNN RNN backward: dhy/dcy zeros, dx, dhx, copies"});
}

}  // namespace

void RegisterRecurrentRules(std::vector<OpRule>* r) {
  r->push_back({"lstm", 3, -1, InferRecurrent, CudnnRecurrentMemory});
  r->push_back({"gru", 3, -1, InferRecurrent, CudnnRecurrentMemory});
}

}  // namespace rules
}  // namespace memest
