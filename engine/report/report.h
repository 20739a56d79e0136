// The answer: where the memory of one step goes, when it peaks, and what would make it fit.
#ifndef MEMEST_ENGINE_REPORT_REPORT_H_
#define MEMEST_ENGINE_REPORT_REPORT_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/ir/nccl.h"

namespace memest {

enum class Category : uint8_t {
  kParameters,         // parameters and module buffers (BatchNorm statistics, causal masks)
  kGradients,          // parameter .grad tensors
  kOptimizerState,     // exp_avg, exp_avg_sq, momentum buffers, ...
  kMasterAndCasts,     // autocast's low-precision copies of weights (and master weights)
  kActivations,        // tensors autograd holds for backward
  kTemporaries,        // everything transient: op outputs awaiting use, op scratch, activation
                       // gradients, optimizer temporaries
  kInputs,             // the data batch
  kKvCache,            // inference: keys and values cached for generation
  kWorkspace,          // library workspace (cuBLAS), allocated through PyTorch's allocator
  kCommunication,      // data-parallel buffers allocated through PyTorch's allocator (DDP's
                       // gradient buckets)
  kAllocatorOverhead,  // reserved minus allocated: rounding, segment slack, cached blocks
  kCudaContext,        // the CUDA context and kernels: outside PyTorch's allocator
  kNccl,               // NCCL's communicator buffers: outside PyTorch's allocator (ir/nccl.h)
  kCount,
};
inline constexpr int kNumCategories = static_cast<int>(Category::kCount);
const char* CategoryName(Category c);  // "parameters", "gradients", ...

enum class Phase : int { kData, kForward, kLoss, kBackward, kOptimizerStep, kCount };
inline constexpr int kNumPhases = static_cast<int>(Phase::kCount);
const char* PhaseName(Phase p);  // "data", "forward", "loss", "backward", "optimizer_step"

using CategoryBytes = std::array<int64_t, kNumCategories>;

// "0 B", "512 B", "1.50 KiB", "23.4 MiB", "79.2 GiB": binary units with three significant
// figures, never "1024 KiB" (it moves up a unit first); negative counts get a leading '-'.
std::string FormatBytes(int64_t bytes);

// The report's note on NCCL's memory: its bytes, and each communicator's ranks and bytes.
std::string NcclNote(const NcclMemory& nccl);

// The moment of a peak: how much was allocated and reserved, by what, and where.
struct PeakPoint {
  Phase phase = Phase::kData;
  int64_t allocated_bytes = 0;  // as torch.cuda.max_memory_allocated would report
  int64_t reserved_bytes = 0;   // as torch.cuda.max_memory_reserved would report
  // Allocated bytes by category at that moment, each allocation rounded as the allocator rounds
  // it; kAllocatorOverhead, kCudaContext and kNccl are 0 here (they belong to the Report's breakdown).
  CategoryBytes by_category{};
  std::string op;               // op kind running at the peak ("" between ops)
  std::string scope;            // its module scope
  int micro_batch = 0;          // index (0-based) of the micro-batch, not its size
  bool recompute = false;       // inside a checkpointed region's recomputation
};

// One row per module scope at the granularity of the model's layers.
struct LayerRow {
  std::string scope;  // "" for ops at the model's top level (often the loss)
  int64_t parameter_bytes = 0;
  int64_t saved_bytes = 0;      // held by autograd from forward until backward
  int64_t output_bytes = 0;     // bytes of the tensors the layer's ops produce
  int64_t temporary_bytes = 0;  // the largest transient its ops need at once
};

struct Advice {
  std::string kind;      // "broadcast_reduce", "fused_activation", "checkpoint", ...
  std::string message;   // one sentence naming the fix
  int64_t saving_bytes = 0;  // how much lower the peak would be
  std::string scope;     // where it applies ("" for the whole model)
};

struct DeviceFit {
  std::string device;  // the catalog name, or "bare" for a bare capacity
  int64_t capacity_bytes = 0;
  int64_t required_bytes = 0;  // peak reserved + CUDA context: what nvidia-smi would show
  bool fits = false;
  int64_t headroom_bytes = 0;  // capacity - required (negative when it does not fit)
};

// One rank's view of a data-parallel step (engine/passes/data_parallel.h), as the report shows it.
struct DataParallelReport {
  int64_t world = 1;
  int64_t rank = 0;                    // the rank estimated: the one that holds the most
  std::vector<int64_t> bucket_bytes;   // DDP's gradient buckets
  std::vector<int64_t> owned_elements; // ZeRO-1: per rank, the elements its optimizer steps
  // Host (CPU) memory the rank's strategy keeps outside the GPU: DeepSpeed's offloaded
  // optimizer (fp32 master partition, its gradient, optimizer state, staging buffers) and
  // ZeRO-3's offloaded parameter partitions; FSDP2's CPU offload (sharded parameters, their
  // gradients, optimizer state).
  int64_t host_bytes = 0;
};

// One rank of an expert-parallel group (engine/passes/expert_parallel.h): the ranks differ by
// the token choices their experts receive, which config.expert_load spreads.
struct ExpertParallelReport {
  int64_t size = 1;                 // ranks in the group
  int64_t rank = 0;                 // the rank estimated: the one that receives the most
  int64_t local_experts = 0;        // each MoE layer's experts on a rank
  int64_t received_rows = 0;        // token choices its experts compute on, per layer
  int64_t least_rank = 0;           // the rank that receives the fewest
  int64_t least_received_rows = 0;
};

// One pipeline stage's estimate, in a report of the stage that needs the most.
struct PipelineStageReport {
  int64_t stage = 0;
  int64_t first_block = 0;  // the blocks it runs: [first_block, last_block]
  int64_t last_block = 0;
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  Phase peak_phase = Phase::kData;
  int64_t parameter_count = 0;  // the stage's parameters (elements)
};

struct PipelineReport {
  int64_t stages = 1;
  int64_t micro_batches = 1;
  int64_t worst_stage = 0;  // the stage this report is the estimate of: the most reserved
  std::vector<PipelineStageReport> per_stage;
};

// A model served by vLLM (config.serving; engine/report/serving.h): the settings it ran with,
// its startup budget on this GPU and what the KV cache it allocates holds.
struct ServingReport {
  // vLLM's settings, its defaults filled in.
  double gpu_memory_utilization = 0;
  int64_t block_size = 0;
  int64_t max_num_seqs = 0;
  int64_t max_num_batched_tokens = 0;
  int64_t max_model_len = 0;
  std::string kv_cache_dtype;     // the element type its pages store: "bfloat16", "fp8_e4m3", ..
  int64_t profile_requests = 0;   // the profile run's requests: min(max_num_seqs, batched tokens)
  // The budget (gpu_worker.py, determine_available_memory): requested = total * utilization;
  // the KV cache gets requested - weights - activation peak - non-torch.
  int64_t requested_bytes = 0;
  int64_t weights_bytes = 0;          // what load_model allocates: parameters and buffers
  // Of weights_bytes, with LoRA: the adapter slots and the punica wrapper's index tensors.
  int64_t lora_bytes = 0;
  int64_t activation_peak_bytes = 0;  // the profile run's peak above the weights
  int64_t non_torch_bytes = 0;        // memory outside PyTorch's allocator the profile adds
  int64_t kv_cache_bytes = 0;         // "Available KV cache memory" (negative: none left)
  // The pages: every layer's keys and values of block_size tokens on this GPU.
  int64_t kv_bytes_per_token = 0;     // all layers on this GPU
  int64_t kv_layers = 0;
  int64_t num_blocks = 0;             // block 0 is vLLM's null block; the rest hold requests
  int64_t kv_tokens = 0;              // "GPU KV cache size: N tokens" (num_blocks * block_size)
  double max_concurrency = 0;         // "Maximum concurrency for max_model_len tokens per request"
  // The questions: requests of request_tokens that fit at once (and run at once, within
  // max_num_seqs), and the longest request when `concurrency` run at once (0: not asked).
  int64_t request_tokens = 0;
  int64_t concurrent_requests = 0;
  int64_t concurrency = 0;
  int64_t longest_request = 0;
  // The longest request the cache holds alone (vLLM's "estimated maximum model length").
  int64_t longest_single_request = 0;
  // Before the budget: the CUDA context (and NCCL's communicators with tensor parallelism), which
  // vLLM's startup check wants room for beside requested_bytes.
  int64_t baseline_bytes = 0;
  bool starts = false;
  std::string refusal;  // vLLM's error when it does not start
};

struct Report {
  int64_t parameter_count = 0;
  int64_t trainable_parameter_count = 0;
  int64_t micro_batch = 0;
  int64_t op_count = 0;
  // The full breakdown at the overall peak: allocated categories, allocator overhead
  // (reserved - allocated) and the CUDA context.
  CategoryBytes breakdown{};
  PeakPoint peak;                  // overall: the largest allocated moment of the step
  int64_t peak_reserved_bytes = 0; // the largest reserved moment (may differ in time)
  // One per phase that ran, in step order: the largest moment of that phase over all
  // micro-batches (micro_batch says which).
  std::vector<PeakPoint> phases;
  std::vector<LayerRow> layers;
  std::optional<DeviceFit> fit;
  // Bytes autograd holds for backward at the end of the forward and loss (distinct storages,
  // inputs included, parameters and buffers not; the tensors' own sizes, not rounded).
  int64_t saved_for_backward_bytes = 0;
  // What is allocated when the step ends: parameters, gradients (zero_grad runs at the start of
  // the next step), optimizer state, workspace.
  CategoryBytes end_of_step{};
  std::vector<Advice> advice;      // biggest saving first
  std::vector<std::string> notes;  // assumptions the estimate made
  std::optional<DataParallelReport> data_parallel;  // with config.parallelism
  std::optional<ExpertParallelReport> expert_parallel;  // with config.parallelism.expert > 1
  std::optional<PipelineReport> pipeline;           // with config.parallelism.pipeline > 1
  std::optional<ServingReport> serving;             // with config.serving
  // The share of forward ops checkpointing runs again in backward (ops in checkpointed regions
  // over all ops; 0 without checkpointing).
  double recompute_fraction = 0;
  // Bytes this rank sends per optimizer step in its collectives and pipeline sends (see
  // CommunicatedBytesPerStep, engine/passes/data_parallel.h); 0 on one GPU.
  int64_t communicated_bytes_per_step = 0;
};

}  // namespace memest

#endif  // MEMEST_ENGINE_REPORT_REPORT_H_
