// NCCL's own device memory on one rank: the buffers of the communicators its process groups
// create, allocated by NCCL with cuMemCreate/cudaMalloc, outside PyTorch's caching allocator
// (torch.cuda.memory_reserved does not see them; nvidia-smi does). It is counted like the CUDA
// context: a fixed cost on top of the step's peak.
//
// The model is NCCL 2.22-2.27's with its defaults (cuMem on, runtime connect on), read in
// NVIDIA/nccl's source (docs/nccl.md gives every figure with its file and line):
// - every allocation is rounded up to cuMem's 2 MiB granularity;
// - a connection to a peer over NVLink/PCIe costs the receiver one buffer per protocol
//   (LL 512 KiB + LL128 4.69 MiB + SIMPLE 4 MiB + 4 KiB, 10 MiB rounded) and the sender 2 MiB;
//   over the network (GPUDirect RDMA) 10 MiB each side;
// - at init, per channel, three small device arrays (2 MiB each once rounded), plus one per
//   channel and one more for NVLink SHARP (NVLS) on Hopper;
// - collectives connect a ring (per channel: a receive from the previous rank, a send to the
//   next); a communicator that spans nodes also a tree; NVLS (H100/H200, more than two GPUs of
//   the node in the communicator) adds 16 channels x 2 x 1 MiB per local rank;
// - point-to-point (pipeline stages' send/recv through batch_isend_irecv, context parallelism's
//   ring) connects every channel of the peer: 32 per NVLink peer, 1-2 per network peer, which
//   share two pools per communicator instead.
// Channels: 24 collective and 32 point-to-point channels within an NVLink node (compute
// capability 8.0 and later; a PCIe-only machine uses fewer, so memest over-predicts there), 16
// for a communicator spanning nodes.
//
// The process groups of a rank follow Megatron-LM's order (tensor, context, data, pipeline: the
// tensor group innermost, on one node; the pipeline's outermost), ParallelismConfig's degrees,
// and gpus_per_node.
#ifndef MEMEST_ENGINE_IR_NCCL_H_
#define MEMEST_ENGINE_IR_NCCL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/ir/config.h"
#include "engine/ir/devices.h"
#include "engine/ir/status.h"

namespace memest {

// One communicator a rank belongs to.
struct NcclCommunicator {
  std::string group;        // "tensor", "context", "data" (HSDP: "data shard" and "data
                            // replicate"), "pipeline", "expert", "expert tensor x
                            // expert", "expert data"
  int64_t ranks = 0;        // in the communicator
  int64_t local_ranks = 0;  // of them on this rank's node
  int64_t p2p_peers = 0;    // peers this rank sends to and receives from (point-to-point)
  bool collectives = true;  // all-reduce, all-gather, reduce-scatter over the group
  int64_t bytes = 0;        // this rank's device bytes for it
};

struct NcclMemory {
  std::vector<NcclCommunicator> communicators;  // those with more than one rank
  int64_t bytes = 0;                            // their sum
};

// The NCCL memory of one rank under `parallelism` on `device`: none for one GPU. Errors name the
// field (gpus_per_node out of range). `embedding_group`: the rank is a first or last pipeline
// stage of a model whose embedding is tied to its head, which Megatron's strategies keep on
// both and whose gradient they all-reduce over the two (the embedding group). `moe`: the model
// has Megatron-LM's MoE layers, whose expert groups are used under tensor parallelism even with
// one expert-parallel rank; `router_aux_loss`: their routers' load-balancing loss, whose token
// counts are all-reduced over the tensor x context group.
StatusOr<NcclMemory> NcclMemoryOf(const ParallelismConfig& parallelism, const DeviceInfo& device,
                                  bool embedding_group = false, bool moe = false,
                                  bool router_aux_loss = false);

}  // namespace memest

#endif  // MEMEST_ENGINE_IR_NCCL_H_
