// FSDP2's hooks on one rank's step (engine/step/rank_hooks.h; the groups and their sizes are
// planned by engine/passes/fsdp.h, which says what each buffer is and when PyTorch makes it).
//
// The streams (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py): foreach_all_gather
// makes its copy-in casts and output on all_gather_copy_in_stream (forward and pre-backward,
// where FSDP2 prefetches implicitly: FSDPCommContext.get_all_gather_streams), the copy-out's
// unsharded parameters on the default stream; foreach_reduce makes its input on the default
// stream and the output, its cast and the sharded gradients (views of it) on
// reduce_scatter_stream. The caching allocator keeps each stream's blocks apart.
#include <memory>
#include <vector>

#include "engine/ir/shape.h"
#include "engine/step/rank_hooks.h"

namespace memest {
namespace {

class Fsdp2Hooks : public RankHooks {
 public:
  // Where the loss begins: its ops, or (a graph that does not mark them) the op that makes it.
  Fsdp2Hooks(const Fsdp2View& v, const Graph& g)
      : v_(v),
        loss_begin_(g.loss_begin >= 0 ? g.loss_begin
                                      : g.loss >= 0 ? g.tensors[g.loss].producer : -1) {
    const int root = static_cast<int>(v.groups.size()) - 1;
    starts_at_.assign(g.ops.size(), -1);
    ends_at_.assign(g.ops.size(), -1);
    for (int k = 0; k < root; ++k) {
      const FsdpGroup& grp = v.groups[k];
      if (grp.first_op < 0 || grp.params.empty()) continue;
      blocks_.push_back(k);
      starts_at_[grp.first_op] = k;
      ends_at_[grp.last_op] = k;
    }
    unsharded_.resize(v.groups.size());
    flat_.assign(v.groups.size(), -1);
    sharded_grad_.assign(v.groups.size(), -1);
  }

  // The rank keeps its shards (on the host with CPUOffloadPolicy).
  int64_t ParameterBytes(int t, int64_t whole) const override {
    if (v_.group_of[t] < 0) return whole;  // a buffer: not sharded
    return v_.cpu_offload ? 0 : Bytes(v_.shards[t].shape, v_.shards[t].dtype);
  }

  // The optimizer steps the shards: on the CPU, with its state there, under CPUOffloadPolicy.
  const Tensor* OptimizerParam(const Graph& g, int t) const override {
    if (v_.group_of[t] < 0) return &g.tensors[t];
    return v_.cpu_offload ? nullptr : &v_.shards[t];
  }

  bool HoldsGrad(int t) const override {
    return v_.group_of[t] >= 0 && sharded_grad_[v_.group_of[t]] >= 0;
  }

  // zero_grad(set_to_none=False) keeps the sharded gradients (one flat tensor per group).
  int KeptGrad(RankMemory& m, int t, int64_t /*whole*/) override {
    const int k = v_.group_of[t];
    if (v_.cpu_offload) return kNoGrad;  // on the host
    if (sharded_grad_[k] < 0) {  // made by the first step's reduce-scatter, on its stream
      sharded_grad_[k] = m.Allocate(v_.groups[k].sharded_grad_bytes, Category::kGradients,
                                    kReduceScatterStream);
    }
    return kNoGrad;
  }

  // The root's pre-forward gathers its group first; each block's, before its first op.
  void ForwardOpStarts(RankMemory& m, int op) override {
    if (op == 0) Gather(m, Root(), true);
    if (starts_at_[op] >= 0) Gather(m, starts_at_[op], true);
  }

  // A block's post-forward reshards it; the root's (after the head, before the loss) frees the
  // last all-gather buffer.
  void ForwardOpEnds(RankMemory& m, int op) override {
    const int k = ends_at_[op];
    if (k >= 0 && v_.groups[k].reshard_after_forward) Reshard(m, k);
    if (op + 1 == loss_begin_) DropStash(m);
  }

  void BackwardStarts(RankMemory& m) override {
    DropStash(m);  // a model without loss ops: the root's post-forward has run by now
    pre_ = post_ = static_cast<int>(blocks_.size()) - 1;
  }

  // Groups whose first op's backward has run are done (post-backward); a group whose last op
  // backward now reaches is copied out of its prefetched all-gather (or gathered, if nothing
  // prefetched it), and the group before it in forward order is all-gathered, its copy-out
  // left for its own pre-backward (_backward_prefetch).
  void BackwardReaches(RankMemory& m, int op) override {
    while (post_ >= 0 && v_.groups[blocks_[post_]].first_op > op) PostBackward(m, blocks_[post_--]);
    while (pre_ >= 0 && v_.groups[blocks_[pre_]].last_op >= op) {
      Gather(m, blocks_[pre_], false);
      if (pre_ > 0) AllGather(m, blocks_[pre_ - 1]);
      --pre_;
    }
  }

  // The blocks backward did not finish, then the root; the root's final callback drops the
  // last reduce-scatter input.
  void BackwardEnds(RankMemory& m) override {
    while (post_ >= 0) PostBackward(m, blocks_[post_--]);
    PostBackward(m, Root());
    if (reduce_input_ >= 0) m.Deallocate(reduce_input_);
    reduce_input_ = -1;
    DropStash(m);
  }

 private:
  int Root() const { return static_cast<int>(v_.groups.size()) - 1; }

  // The all-gather: the copy-in buffer (mixed precision), freed when the all-gather returns,
  // and the flat output. Nothing when the group is gathered or being gathered.
  void AllGather(RankMemory& m, int k) {
    const FsdpGroup& grp = v_.groups[k];
    if (!unsharded_[k].empty() || flat_[k] >= 0 || grp.params.empty()) return;
    std::vector<int> inputs;
    if (v_.cpu_offload) {
      OffloadedInputs(m, grp, &inputs);
    } else if (grp.copy_in_bytes > 0) {
      inputs.push_back(m.Allocate(grp.copy_in_bytes, Category::kCommunication, kAllGatherStream));
    }
    flat_[k] = m.Allocate(grp.flat_bytes, Category::kCommunication, kAllGatherStream);
    for (int b : inputs) m.Deallocate(b);
  }

  // CPUOffloadPolicy's all-gather inputs, parameter by parameter: the host shard copied to the
  // GPU and, under mixed precision, cast to param_dtype (the copy freed once cast).
  void OffloadedInputs(RankMemory& m, const FsdpGroup& grp, std::vector<int>* inputs) {
    for (size_t j = 0; j < grp.shard_bytes.size(); ++j) {
      const int copy = m.Allocate(grp.shard_bytes[j], Category::kCommunication, kAllGatherStream);
      if (grp.cast_bytes[j] == 0) {
        inputs->push_back(copy);
        continue;
      }
      inputs->push_back(
          m.Allocate(grp.cast_bytes[j], Category::kCommunication, kAllGatherStream));
      m.Deallocate(copy);
    }
  }

  // wait_for_unshard: the previous forward all-gather's buffer is released first, then each
  // parameter is copied out of the flat output into a tensor of its own (the unsharded
  // parameters). In forward the flat output is kept until the next group's wait; in backward
  // it goes right after its own copy-out.
  void Gather(RankMemory& m, int k, bool forward) {
    const FsdpGroup& grp = v_.groups[k];
    if (!unsharded_[k].empty() || grp.params.empty()) return;
    AllGather(m, k);
    DropStash(m);
    for (int64_t bytes : grp.unsharded_bytes) {
      unsharded_[k].push_back(m.Allocate(bytes, Category::kParameters));
    }
    if (forward) stash_ = flat_[k];
    else m.Deallocate(flat_[k]);
    flat_[k] = -1;
  }

  void DropStash(RankMemory& m) {
    if (stash_ >= 0) m.Deallocate(stash_);
    stash_ = -1;
  }

  void Reshard(RankMemory& m, int k) {
    for (int b : unsharded_[k]) m.Deallocate(b);
    unsharded_[k].clear();
  }

  // post_backward: the unsharded gradients are taken, the group resharded, the previous
  // reduce-scatter input dropped; foreach_reduce copies the gradients into a new input and frees
  // them, and reduce-scatters into the sharded gradients (cast to the sharded dtype when it
  // differs; added into existing ones).
  void PostBackward(RankMemory& m, int k) {
    const FsdpGroup& grp = v_.groups[k];
    std::vector<int> with_grad;
    for (int t : grp.params) {
      if (m.HasOwnGrad(t)) with_grad.push_back(t);
    }
    Reshard(m, k);
    if (with_grad.empty()) return;
    if (reduce_input_ >= 0) m.Deallocate(reduce_input_);
    reduce_input_ = m.Allocate(grp.reduce_input_bytes, Category::kCommunication);
    for (int t : with_grad) m.ReleaseGrad(t, false);
    const bool cast = v_.reduce_dtype != v_.sharded_dtype;
    int grads = m.Allocate(grp.reduce_output_bytes,
                           cast ? Category::kCommunication : Category::kGradients,
                           kReduceScatterStream);
    if (cast) {
      const int out = grads;
      grads = m.Allocate(grp.sharded_grad_bytes, Category::kGradients, kReduceScatterStream);
      m.Deallocate(out);
    }
    // Offloaded: each shard's gradient copied to the host; else added into the kept ones
    // (sharded_param.grad += new) or kept.
    if (v_.cpu_offload || sharded_grad_[k] >= 0) m.Deallocate(grads);
    else sharded_grad_[k] = grads;
  }

  const Fsdp2View& v_;
  std::vector<int> blocks_;     // the block groups that run, in forward order
  std::vector<int> starts_at_;  // per op: the block group it opens (-1)
  std::vector<int> ends_at_;    // per op: the block group it closes (-1)
  const int loss_begin_;        // the first op of the loss (-1: none)
  std::vector<std::vector<int>> unsharded_;  // per group: its unsharded parameters now
  std::vector<int> flat_;       // per group: its all-gather output, not yet copied out (-1)
  std::vector<int> sharded_grad_;            // per group: its sharded gradients (-1: none)
  int stash_ = -1;         // the last forward all-gather's flat output
  int reduce_input_ = -1;  // the last reduce-scatter input
  int pre_ = -1;           // backward: the next block (index into blocks_) to gather
  int post_ = -1;          // backward: the next block to finish
};

}  // namespace

std::unique_ptr<RankHooks> MakeFsdp2Hooks(const RankView& view, const Graph& graph) {
  return std::make_unique<Fsdp2Hooks>(*view.fsdp2, graph);
}

}  // namespace memest
