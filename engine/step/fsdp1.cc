// FSDP1's hooks on one rank's step (engine/step/rank_hooks.h; the units and their sizes are
// planned by engine/passes/fsdp1.h, which says what each buffer is and when PyTorch makes it).
//
// The streams (torch/distributed/fsdp/_runtime_utils.py): _unshard runs pre_unshard (the
// mixed-precision shard, the offloaded shard's copy) on _pre_unshard_stream and unshard (the
// padded unsharded flat parameter) on _unshard_stream; _post_backward_hook takes autograd's
// flat gradient (the default stream's) and makes its reduce-dtype copy, the padding, the new
// sharded gradient and its cast on _post_backward_stream. The caching allocator keeps each
// stream's blocks apart. Not modelled: the record_stream frees, which keep a block from reuse
// until the stream's work has run.
#include <memory>
#include <vector>

#include "engine/ir/shape.h"
#include "engine/step/rank_hooks.h"

namespace memest {
namespace {

class Fsdp1Hooks : public RankHooks {
 public:
  explicit Fsdp1Hooks(const Fsdp1View& v, const Graph& g) : v_(v) {
    const int root = static_cast<int>(v.units.size()) - 1;
    starts_at_.assign(g.ops.size(), -1);
    ends_at_.assign(g.ops.size(), -1);
    for (int k = 0; k < root; ++k) {
      const FsdpGroup& grp = v.units[k].group;
      if (grp.first_op < 0 || grp.params.empty()) continue;
      blocks_.push_back(k);
      starts_at_[grp.first_op] = k;
      ends_at_[grp.last_op] = k;
    }
    full_.assign(v.units.size(), -1);
    unsharded_.assign(v.units.size(), false);
    sharded_grad_.assign(v.units.size(), -1);
  }

  // A unit's flat shard is one tensor, counted under its first parameter.
  int64_t ParameterBytes(int t, int64_t whole) const override {
    const int k = v_.unit_of[t];
    if (k < 0) return whole;  // a buffer
    if (v_.cpu_offload) return 0;  // on the host
    return v_.first_param[k] == t ? Bytes(v_.units[k].flat_shard.shape,
                                          v_.units[k].flat_shard.dtype)
                                  : 0;
  }

  // The optimizer steps the flat shards, one per unit (on the CPU when offloaded).
  const Tensor* OptimizerParam(const Graph& g, int t) const override {
    const int k = v_.unit_of[t];
    if (k < 0) return &g.tensors[t];
    if (v_.cpu_offload) return nullptr;
    return v_.first_param[k] == t ? &v_.units[k].flat_shard : nullptr;
  }

  bool HoldsGrad(int t) const override {
    const int k = v_.unit_of[t];
    return k >= 0 && v_.first_param[k] == t && sharded_grad_[k] >= 0;
  }

  int KeptGrad(RankMemory& m, int t, int64_t /*whole*/) override {
    const int k = v_.unit_of[t];
    if (v_.cpu_offload) return kNoGrad;  // _cpu_grad, on the host
    if (v_.first_param[k] == t && sharded_grad_[k] < 0) {
      sharded_grad_[k] =
          m.Allocate(ShardedGradBytes(k), Category::kGradients, kReduceScatterStream);
    }
    return kNoGrad;
  }

  void ForwardOpStarts(RankMemory& m, int op) override {
    if (op == 0) {
      unsharded_.assign(unsharded_.size(), false);
      Unshard(m, Root());
    }
    if (starts_at_[op] >= 0) Unshard(m, starts_at_[op]);
  }

  // FULL_SHARD frees a unit's full parameters after its forward (the root's never).
  void ForwardOpEnds(RankMemory& m, int op) override {
    const int k = ends_at_[op];
    if (k >= 0 && v_.units[k].group.reshard_after_forward) Reshard(m, k);
  }

  // The root's pre-backward unshards it first (still gathered: a no-op but for offload's cast).
  void BackwardStarts(RankMemory& m) override {
    unsharded_.assign(unsharded_.size(), false);
    Unshard(m, Root());
    pre_ = post_ = static_cast<int>(blocks_.size()) - 1;
  }

  // A unit's pre-backward unshards it (if it was resharded) and, BACKWARD_PRE, the unit before
  // it; its post-backward runs once its first op's backward has.
  void BackwardReaches(RankMemory& m, int op) override {
    while (post_ >= 0 && v_.units[blocks_[post_]].group.first_op > op) {
      PostBackward(m, blocks_[post_--]);
    }
    while (pre_ >= 0 && v_.units[blocks_[pre_]].group.last_op >= op) {
      Unshard(m, blocks_[pre_]);
      if (pre_ > 0) Unshard(m, blocks_[pre_ - 1]);
      --pre_;
    }
  }

  // Offloaded, prepare_gradient_for_optim deletes each `_saved_grad_shard`.
  void BackwardEnds(RankMemory& m) override {
    while (post_ >= 0) PostBackward(m, blocks_[post_--]);
    PostBackward(m, Root());
    if (!v_.cpu_offload) return;
    for (int& shard : sharded_grad_) {
      if (shard >= 0) m.Deallocate(shard);
      shard = -1;
    }
  }

 private:
  int Root() const { return static_cast<int>(v_.units.size()) - 1; }

  int64_t ShardedGradBytes(int k) const {
    const Fsdp1Unit& u = v_.units[k];
    return u.grad_cast_bytes > 0 ? u.grad_cast_bytes : u.sharded_grad_bytes;
  }

  // The shard the all-gather reads: `_mp_shard` under mixed precision (offloaded, filled from
  // a GPU copy of the host shard, freed once cast), else offloaded the GPU copy itself.
  // Offloaded under mixed precision, pre_unshard casts a copy of the host shard into
  // `_mp_shard` even for a unit still gathered (the root in backward, SHARD_GRAD_OP's blocks),
  // freed by post_unshard: once per pass, when its own pre-hook or the prefetch first unshards
  // it.
  void Unshard(RankMemory& m, int k) {
    const Fsdp1Unit& u = v_.units[k];
    if (u.group.params.empty()) return;
    const bool first = !unsharded_[k];
    unsharded_[k] = true;
    if (full_[k] >= 0) {
      if (first && u.mp_shard_bytes > 0 && u.offload_copy_bytes > 0) {
        const int mp = m.Allocate(u.mp_shard_bytes, Category::kCommunication, kPreAllGatherStream);
        m.Deallocate(
            m.Allocate(u.offload_copy_bytes, Category::kCommunication, kPreAllGatherStream));
        m.Deallocate(mp);
      }
      return;
    }
    int input = -1;
    if (u.mp_shard_bytes > 0) {
      input = m.Allocate(u.mp_shard_bytes, Category::kCommunication, kPreAllGatherStream);
      if (u.offload_copy_bytes > 0) {
        m.Deallocate(
            m.Allocate(u.offload_copy_bytes, Category::kCommunication, kPreAllGatherStream));
      }
    } else if (u.offload_copy_bytes > 0) {
      input = m.Allocate(u.offload_copy_bytes, Category::kCommunication, kPreAllGatherStream);
    }
    full_[k] = m.Allocate(u.full_bytes, Category::kParameters, kAllGatherStream);
    if (input >= 0) m.Deallocate(input);
  }

  void Reshard(RankMemory& m, int k) {
    if (full_[k] >= 0) m.Deallocate(full_[k]);
    full_[k] = -1;
  }

  // The parameters' gradients become the flat gradient (autograd's concatenation, both alive
  // during it), whose hook frees the full parameters and reduce-scatters it through its
  // copies; the hook's locals keep the flat gradient and each copy until it returns (measured
  // on 2.15: under bf16 the bf16 gradient beside its float32 copy).
  void PostBackward(RankMemory& m, int k) {
    const Fsdp1Unit& u = v_.units[k];
    std::vector<int> with_grad;
    for (int t : u.group.params) {
      if (m.HasOwnGrad(t)) with_grad.push_back(t);
    }
    if (with_grad.empty()) {
      Reshard(m, k);
      return;
    }
    std::vector<int> unsharded = {m.Allocate(u.flat_grad_bytes, Category::kGradients)};
    for (int t : with_grad) m.ReleaseGrad(t, false);
    Reshard(m, k);
    for (int64_t copy : {u.reduce_copy_bytes, u.pad_bytes}) {
      if (copy > 0) {
        unsharded.push_back(m.Allocate(copy, Category::kCommunication, kReduceScatterStream));
      }
    }
    int shard = m.Allocate(u.sharded_grad_bytes, Category::kGradients, kReduceScatterStream);
    for (int b : unsharded) m.Deallocate(b);
    if (u.grad_cast_bytes > 0) {
      const int cast = m.Allocate(u.grad_cast_bytes, Category::kGradients, kReduceScatterStream);
      m.Deallocate(shard);
      shard = cast;
    }
    if (sharded_grad_[k] >= 0) m.Deallocate(shard);  // _saved_grad_shard += new
    else sharded_grad_[k] = shard;
  }

  const Fsdp1View& v_;
  std::vector<int> blocks_;
  std::vector<int> starts_at_, ends_at_;
  std::vector<int> full_;          // per unit: its _full_param_padded (-1: resharded)
  std::vector<bool> unsharded_;    // per unit: unsharded once in this pass (forward, backward)
  std::vector<int> sharded_grad_;  // per unit: its sharded gradient (-1: none)
  int pre_ = -1, post_ = -1;
};

}  // namespace

std::unique_ptr<RankHooks> MakeFsdp1Hooks(const RankView& view, const Graph& graph) {
  return std::make_unique<Fsdp1Hooks>(*view.fsdp1, graph);
}

}  // namespace memest
