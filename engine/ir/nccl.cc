#include "engine/ir/nccl.h"

#include <algorithm>
#include <utility>

#include "engine/ir/shape.h"

namespace memest {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGranularity = 2 * kMiB;  // cuMemGetAllocationGranularity, every allocation

int64_t RoundUp(int64_t bytes) { return (bytes + kGranularity - 1) / kGranularity * kGranularity; }

// One connection's buffers (src/transport/p2p.cc p2pRecvSetup/p2pSendSetup, net.cc
// recvProxyConnect/sendProxyConnect): LL 8 lines x 512 threads x 8 steps x 16 B, LL128 120 x 640
// x 8 x 8 B, SIMPLE NCCL_BUFFSIZE, and the 4 KiB ncclRecvMem.
constexpr int64_t kLL = 8 * 512 * 8 * 16;
constexpr int64_t kLL128 = 120 * 640 * 8 * 8;
constexpr int64_t kSimple = 4 * kMiB;
const int64_t kP2pReceive = RoundUp(4096 + kLL + kLL128 + kSimple);  // 10 MiB
const int64_t kP2pSend = RoundUp(4096);                              // 2 MiB
const int64_t kNetReceive = RoundUp(kLL + kLL128 + kSimple);         // 10 MiB
const int64_t kNetSend = RoundUp(kLL128 + kSimple);                  // 10 MiB

// NVLink SHARP: 16 channels (SM90), two buffers of NVLS_CHUNKSIZE (128 KiB) x 8 steps each, per
// local rank (src/transport/nvls.cc ncclNvlsBufferSetup, 2.22 and later).
constexpr int64_t kNvlsChannels = 16;
constexpr int64_t kNvlsPerRank = kNvlsChannels * 2 * 128 * 1024 * 8;

// Send/recv across nodes: one send and one receive pool per communicator of p2p channels x
// NCCL_SHARED_STEPS (16) x NCCL_P2P_NET_CHUNKSIZE (128 KiB) (src/transport/net.cc).
int64_t NetPools(int64_t p2p_channels) { return 2 * RoundUp(p2p_channels * 16 * 128 * 1024); }

// The ranks of a group of `size` with rank stride `stride` that share a node of `per_node`.
int64_t LocalRanks(int64_t size, int64_t stride, int64_t per_node) {
  if (stride >= per_node) return 1;
  return std::max<int64_t>(1, std::min(size, per_node / stride));
}

int64_t CommunicatorBytes(const NcclCommunicator& c, const DeviceInfo& device) {
  const bool spans = c.local_ranks < c.ranks;
  // Unknown (a bare capacity) or AMD's (RCCL, Infinity Fabric): as NVLink, the larger figures.
  const bool nvlink = device.compute_capability == 0 || device.compute_capability >= 80;
  // Collective and point-to-point channels (src/graph/connect.cc ncclTopoPostset, paths.cc
  // ncclTopoComputeP2pChannels): logged 24 and 32 on 8 NVLink-connected A100s and H100s, 16 in a
  // communicator across nodes; a PCIe-only node runs about 4.
  const int64_t channels = spans ? 16 : (nvlink ? 24 : 4);
  const int64_t p2p_channels = spans ? 16 : (nvlink ? 32 : 4);
  const int64_t per_peer = spans ? 2 : (nvlink ? 32 : 2);
  const bool nvls = device.compute_capability >= 90 && !spans && c.local_ranks > 2 && c.collectives;
  // At init (src/channel.cc initChannel, initNvlsChannel; src/init.cc devCommSetup).
  int64_t bytes = kGranularity * (2 + 3 * std::max(channels, p2p_channels) + (nvls ? channels + 1 : 0));
  const int64_t pair = spans ? kNetReceive + kNetSend : kP2pReceive + kP2pSend;
  if (c.collectives) {
    bytes += channels * pair;                   // the ring: receive from prev, send to next
    if (spans) bytes += channels * pair;        // the tree NCCL picks across nodes
    if (nvls) bytes += kNvlsPerRank * c.local_ranks;
  }
  if (c.p2p_peers > 0) {
    bytes += c.p2p_peers * per_peer * (kP2pReceive + kP2pSend);
    if (spans) bytes += NetPools(p2p_channels);
  }
  return bytes;
}

// A process group of a rank: its size, the peers it sends to point-to-point, and whether it
// runs collectives.
struct Group {
  const char* name;
  int64_t size;
  int64_t p2p_peers;
  bool collectives;
};

// Megatron-LM's training loop makes more communicators (megatron/training/initialize.py,
// megatron/core/optimizer/optimizer.py and clip_grads.py): the world's, which
// init_process_group(device_id=...) creates eagerly and the start-up barrier and, with the
// distributed optimizer, the gradient norm's and found-inf all-reduces use
// (get_grad_stats_parallel_group returns None: the default group); and, with the plain
// mixed-precision optimizer, the model-parallel group's (tensor x pipeline ranks, Megatron's
// rank order), over which it all-reduces the gradient norm (clip_grad, 1.0 by default); and on
// the first and last stages of a model whose embedding is tied to its head, the embedding
// group's (finalize_model_grads' _allreduce_word_embedding_grads: those two stages' ranks).
template <typename Add>
Status AddMegatronGroups(const ParallelismConfig& p, bool embedding_group, const Add& add) {
  if (!IsMegatron(p.sharding)) return Status::Ok();
  int64_t world = 1;
  for (int64_t degree : {p.tensor, p.context, p.data, p.pipeline}) {
    MEMEST_ASSIGN_OR_RETURN(world, CheckedMul(world, degree));
  }
  MEMEST_RETURN_IF_ERROR(add(Group{"world", world, 0, true}, 1, 0));
  if (p.sharding == DataSharding::kMegatronDdp && p.tensor * p.pipeline > 1) {
    // Its ranks on one node: the tensor group's, times the pipeline ranks a node holds.
    const int64_t pipeline_stride = world / p.pipeline;
    const int64_t local_stages =
        pipeline_stride >= p.gpus_per_node ? 1 : LocalRanks(p.pipeline, pipeline_stride,
                                                            p.gpus_per_node);
    MEMEST_RETURN_IF_ERROR(add(Group{"model parallel", p.tensor * p.pipeline, 0, true}, 1,
                               LocalRanks(p.tensor, 1, p.gpus_per_node) * local_stages));
  }
  if (embedding_group && p.pipeline > 1) {
    MEMEST_ASSIGN_OR_RETURN(const int64_t apart, CheckedMul(world / p.pipeline, p.pipeline - 1));
    MEMEST_RETURN_IF_ERROR(add(Group{"embedding", 2, 0, true}, apart, 0));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<NcclMemory> NcclMemoryOf(const ParallelismConfig& p, const DeviceInfo& device,
                                  bool embedding_group, bool moe, bool router_aux_loss) {
  MEMEST_RETURN_IF_ERROR(ValidateGpusPerNode(p.gpus_per_node));
  NcclMemory out;
  // Megatron-LM's rank order: tensor fastest, then context, data, pipeline.
  const Group groups[] = {
      {"tensor", p.tensor, 0, true},
      // Ring attention passes keys and values to the next rank and gradients back.
      {"context", p.context, std::min<int64_t>(2, p.context - 1), true},
      // HSDP: the shard group within the replicas' group (FSDP2's DeviceMesh (replicate,
      // shard), FSDP1 HYBRID_SHARD's intra- and inter-node groups); else one data group.
      {p.data_shard > 0 ? "data shard" : "data", ShardRanks(p), 0, true},
      {"data replicate", p.data / ShardRanks(p), 0, true},
      // A stage sends activations on and gradients back: two neighbours but at the ends (the
      // worst stage is counted; interleaving connects the last stage to the first too).
      {"pipeline", p.pipeline, std::min<int64_t>(2, p.pipeline - 1), false},
  };
  // A group of `stride` between its ranks (or, `local` > 0, of that many ranks on a node).
  auto add = [&](const Group& g, int64_t stride, int64_t local = 0) -> Status {
    if (g.size <= 1) return Status::Ok();
    NcclCommunicator c;
    c.group = g.name;
    c.ranks = g.size;
    c.local_ranks = local > 0 ? local : LocalRanks(g.size, stride, p.gpus_per_node);
    c.p2p_peers = g.p2p_peers;
    c.collectives = g.collectives;
    c.bytes = CommunicatorBytes(c, device);
    MEMEST_ASSIGN_OR_RETURN(out.bytes, CheckedAdd(out.bytes, c.bytes));
    out.communicators.push_back(std::move(c));
    return Status::Ok();
  };
  int64_t stride = 1;
  for (const Group& g : groups) {
    MEMEST_RETURN_IF_ERROR(add(g, stride));
    MEMEST_ASSIGN_OR_RETURN(stride, CheckedMul(stride, g.size));
  }
  MEMEST_RETURN_IF_ERROR(AddMegatronGroups(p, embedding_group, add));
  if (p.expert > 1 || (moe && p.tensor > 1)) {
    // Megatron's expert groups (parallel_state's expert rank order: expert-tensor, expert,
    // expert-data, pipeline), each a communicator of its own even where it has another group's
    // ranks: the expert-tensor group (the tensor group's ranks: expert_tensor_parallel_size
    // defaults to the tensor size), over which the dispatcher gathers and scatters the tokens;
    // the expert group's ranks next to each other, its all-to-all a send to and a receive from
    // every peer (NCCL runs it as grouped point-to-point); the expert-tensor x expert group, over
    // which the dispatcher all-gathers its token counts every forward (token_dispatcher.py's
    // tp_ep_group); and the expert-data group across them, which reduces the experts' gradients
    // (with one expert rank Megatron keeps the experts in the dense buffers: none).
    const Group expert_tensor = {"expert tensor", p.tensor, 0, true};
    const Group expert = {"expert", p.expert, p.expert - 1, true};
    const Group tensor_expert = {"expert tensor x expert", p.tensor * p.expert, 0, true};
    MEMEST_RETURN_IF_ERROR(add(expert_tensor, 1));
    MEMEST_RETURN_IF_ERROR(add(expert, p.tensor));
    MEMEST_RETURN_IF_ERROR(add(tensor_expert, 1));
    if (p.expert > 1) {
      const Group expert_data = {"expert data", p.data * p.context / p.expert, 0, true};
      MEMEST_ASSIGN_OR_RETURN(int64_t across, CheckedMul(p.tensor, p.expert));
      MEMEST_RETURN_IF_ERROR(add(expert_data, across));
    }
    if (p.expert > 1 && p.sharding == DataSharding::kMegatronDdp) {
      // The experts' own mixed-precision optimizer clips their gradient norm over the expert
      // tensor x expert x pipeline group (optimizer/__init__.py: pg_collection.tp_ep_pp): its
      // expert tensor x expert ranks next to each other, times the stages a node holds.
      MEMEST_ASSIGN_OR_RETURN(int64_t ranks, CheckedMul(p.tensor * p.expert, p.pipeline));
      const int64_t stride = ranks / p.pipeline * (p.data * p.context / p.expert);
      const int64_t local_stages =
          stride >= p.gpus_per_node ? 1 : LocalRanks(p.pipeline, stride, p.gpus_per_node);
      const int64_t local = LocalRanks(p.tensor * p.expert, 1, p.gpus_per_node) * local_stages;
      MEMEST_RETURN_IF_ERROR(add(Group{"expert tensor x expert x pipeline", ranks, 0, true}, 1, local));
    }
  }
  if (moe && router_aux_loss && IsMegatron(p.sharding) && p.tensor * p.context > 1) {
    // The router's load-balancing loss all-reduces its token counts over the tensor x context
    // group every forward (moe_utils.py get_tokens_per_expert_and_token_count, tp_cp_group).
    MEMEST_RETURN_IF_ERROR(add(Group{"tensor x context", p.tensor * p.context, 0, true}, 1));
  }
  return out;
}

}  // namespace memest
