// The step simulator's pipeline stage (engine/step/simulator.h; the stage's slice and the order
// of its micro-batches come from engine/passes/pipeline.h): micro-batches in flight between
// their forward and their backward, as Megatron-LM's schedule (schedules.py,
// forward_backward_pipelining_without_interleaving) keeps them:
// - a forward receives its input (a new tensor that requires grad), runs, sends its output and
//   then, unless the outputs are kept, frees the output's storage for a one-element stub
//   (deallocate_output_tensor); what autograd saved stays until the micro-batch's backward;
// - a backward starts from the received gradient of the sent output (the last stage: the loss's
//   seed); in 1F1B's steady state that gradient arrives with the forward just before it
//   (send_forward_recv_backward), before the sent output is freed; in the cool-down, at the
//   backward (recv_backward). The input's gradient a backward sends back stays referenced by
//   the loop's input_tensor_grad until the next backward returns.
// With interleaving (forward_backward_pipelining_with_interleaving) each action runs one model
// chunk of the stage: its op range, from its own received input to its own sent output, in a
// table of its own per micro-batch. Its steady state runs a forward and a backward before their
// sends (send_forward_backward_recv_forward_backward; with overlap_p2p_comm the free waits for
// the next forward), so the forward's output is freed only after that backward.
// Megatron's model keeps more: set_input_tensor stores each chunk's received input on its
// TransformerBlock (self.input_tensor, transformer_block.py, never reset), and backward_step
// calls retain_grad() on it, so the chunk's last input and its gradient stay after its last
// backward, through the optimizer step, until the chunk's first forward of the next step sets a
// new one (only with Megatron's data parallelism: megatron-ddp, megatron-distopt).
#include <utility>
#include <vector>

#include "engine/ir/config.h"
#include "engine/step/fold.h"
#include "engine/step/simulator.h"

namespace memest {

void StepSimulator::RunPipeline() {
  const PipelineStage& p = *opt_.pipeline;
  const std::vector<PipelineAction>& actions = folded_ ? p.fold->actions : p.actions;
  micro_batches_ = static_cast<int>(folded_ ? p.fold->micro_batches : cfg_.grad_accum_steps);
  // Where each action's events and buffers start (a folded schedule's periods are checked).
  std::vector<int> action_event, action_id;
  const int chunks = static_cast<int>(p.chunks.size());
  auto chunk_loss = [&](int c) { return chunks == 1 ? g_.loss : p.chunks[c].sent; };
  // Whether a chunk sends its output on (all but the model's last chunk, which ends in the loss).
  auto sends = [&](int c) { return p.stage < p.stages - 1 || c < chunks - 1; };
  const StorageTable leaves = main_;  // parameters and buffers: every micro-batch reads them
  std::vector<InFlight> flight(static_cast<size_t>(micro_batches_) * chunks);
  std::vector<int> sent_grads;  // the previous backward's input gradients (input_tensor_grad)
  InFlight* deferred = nullptr;  // interleaved: the forward whose output the next backward keeps
  int deferred_out = -1;
  // Megatron's TransformerBlock.input_tensor per chunk: the received input (and its retained
  // gradient) of the chunk's latest forward, once its micro-batch's backward is done.
  const bool megatron = IsMegatron(cfg_.parallelism.sharding);
  std::vector<std::vector<int>> retained(static_cast<size_t>(chunks));
  std::vector<int64_t> received_bytes(static_cast<size_t>(chunks), 0);
  auto chunk_of_op = [&](int op) {
    for (int c = 0; c < chunks; ++c) {
      if (chunks == 1 || (op >= p.chunks[c].first_op && op <= p.chunks[c].last_op)) return c;
    }
    return -1;
  };
  auto received = [&](int t) {  // a chunk's received activation: an input that takes a gradient
    const Tensor& x = g_.tensors[t];
    return x.role == TensorRole::kInput && x.requires_grad;
  };
  if (megatron) {
    for (size_t t = 0; t < g_.tensors.size(); ++t) {
      const int c = received(static_cast<int>(t)) ? chunk_of_op(first_reader_[t]) : -1;
      if (c >= 0) received_bytes[c] += Bytes(g_.tensors[t].shape, g_.tensors[t].dtype);
    }
    if (cfg_.step == StepKind::kSteadyState) {  // the previous step's, still on the blocks
      for (int c = 0; c < chunks; ++c) {
        if (received_bytes[c] == 0) continue;
        retained[c] = {NewBuffer(received_bytes[c], Category::kInputs),
                       NewBuffer(received_bytes[c], Category::kGradients)};
      }
    }
  }
  // deallocate_output_tensor: out.data = torch.empty((1,)) (the pin stays, harmless).
  auto deallocate_output = [&](StorageTable& table, int out, InFlight& f) {
    FreeBuffer(table.buffer[out]);
    table.buffer[out] = -1;
    f.stub = NewBuffer(DTypeSize(g_.tensors[out].dtype), Category::kActivations);
  };
  auto swap_in = [&](InFlight& f) {
    std::swap(main_, f.table);
    std::swap(op_saved_, f.saved);
    std::swap(graph_held_, f.graph_held);
    std::swap(rng_state_of_, f.rng_state_of);
  };
  for (size_t k = 0; k < actions.size(); ++k) {
    const PipelineAction& a = actions[k];
    if (failed()) return;
    if (folded_) {
      action_event.push_back(static_cast<int>(s_.events.size()));
      action_id.push_back(next_buffer_);
    }
    mb_ = static_cast<int>(a.micro_batch);
    // One chunk is the whole graph simulated (a pass may have rebuilt it since the stage was
    // planned); interleaved chunks come with their ranges moved through those passes (PlanStep).
    first_op_ = chunks == 1 ? 0 : p.chunks[a.chunk].first_op;
    last_op_ = chunks == 1 ? static_cast<int>(g_.ops.size()) - 1 : p.chunks[a.chunk].last_op;
    loss_ = chunk_loss(a.chunk);
    InFlight& f = flight[static_cast<size_t>(mb_) * chunks + a.chunk];
    if (a.forward) {
      main_ = leaves;
      op_saved_.assign(g_.ops.size(), SavedByOp{});
      graph_held_.clear();
      rng_state_of_.assign(regions_.size(), -1);
      AllocMicroBatchInputs();
      for (int b : retained[a.chunk]) FreeBuffer(b);  // set_input_tensor replaces the last one
      retained[a.chunk].clear();
      const int64_t before = saved_bytes_;
      Forward();
      if (failed()) return;
      if (mb_ == 0) s_.saved_for_backward_bytes += saved_bytes_ - before;
      const int out = base_[loss_];
      const bool sent = sends(a.chunk);
      // The next backward's gradient arrives with this send (send_forward_recv_backward).
      if (k + 1 < actions.size() && !actions[k + 1].forward && sends(actions[k + 1].chunk)) {
        const Tensor& o = g_.tensors[chunk_loss(actions[k + 1].chunk)];
        received_grad_ = NewBuffer(Bytes(o.shape, o.dtype), Category::kTemporaries);
      }
      if (sent && !p.keep_outputs && main_.saved[out] == 0 && main_.buffer[out] >= 0) {
        if (chunks > 1 && k + 1 < actions.size() && !actions[k + 1].forward) {
          deferred = &f;  // freed after the backward that follows
          deferred_out = out;
        } else {
          deallocate_output(main_, out, f);
        }
      }
      swap_in(f);
      continue;
    }
    swap_in(f);
    Backward();
    if (failed()) return;
    // The chunk's last micro-batch: its input was the latest set on the block, and stays with
    // its gradient.
    const bool retain = megatron && mb_ == micro_batches_ - 1;
    std::vector<int> grads;
    for (size_t t = 0; t < g_.tensors.size(); ++t) {
      if (retain && received(static_cast<int>(t)) && main_.buffer[t] >= 0 &&
          chunk_of_op(first_reader_[t]) == a.chunk) {
        retained[a.chunk].push_back(main_.buffer[t]);
        main_.buffer[t] = -1;
        main_.pins[t] = 0;
        if (param_grad_[t] >= 0) retained[a.chunk].push_back(param_grad_[t]);
        param_grad_[t] = kNoGrad;
        continue;
      }
      if (g_.tensors[t].role == TensorRole::kInput && param_grad_[t] >= 0) {
        grads.push_back(param_grad_[t]);
        param_grad_[t] = kNoGrad;
      }
    }
    for (int b : sent_grads) FreeBuffer(b);
    sent_grads = std::move(grads);
    EndMicroBatch();
    if (f.stub >= 0) FreeBuffer(f.stub);
    f = InFlight{};
    if (deferred != nullptr) {
      deallocate_output(deferred->table, deferred_out, *deferred);
      deferred = nullptr;
    }
  }
  for (int b : sent_grads) FreeBuffer(b);
  if (folded_) {
    action_event.push_back(static_cast<int>(s_.events.size()));
    action_id.push_back(next_buffer_);
    s_.repeat = FindRepeatedSpan(s_, action_event, action_id, *p.fold);
  }
}

}  // namespace memest
