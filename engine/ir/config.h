// The run configuration: how one training (or inference) step is executed.
#ifndef MEMEST_ENGINE_IR_CONFIG_H_
#define MEMEST_ENGINE_IR_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/ir/dtype.h"
#include "engine/ir/status.h"

namespace memest {

enum class Mode { kTraining, kInference };

// What runs the step. memest predicts PyTorch 2.x on CUDA; the CPU runtime emulates PyTorch 1.13
// on the CPU, where the conformance suite measures real PyTorch exactly: there is no caching
// allocator (allocated bytes are the tensors' own), no cuBLAS workspace and no CUDA context, and
// a few ops and the autograd engine behave as 1.13 does on the CPU (docs/op-rules.md lists them:
// dropout keeps a float mask, mean over dims keeps its input, gradients of a tensor used twice
// are summed out of place, foreach Adam keeps two lists of scratch, step counters are tensors).
enum class Runtime { kCuda, kCpuTorch113 };

// The vector ISA oneDNN dispatches to under the CPU runtime (its verbose "isa:" line; capped by
// ONEDNN_MAX_CPU_ISA). Convolutions pick kernels and channel-blocked layouts by it
// (engine/rules/cpu_conv.h). AVX-512 covers every AVX-512 core level (avx512_core, _vnni,
// _bf16, _amx): their float32 convolution kernels are the same.
enum class CpuIsa { kAvx512, kAvx2 };

enum class Precision {
  kFp32,      // everything in float32
  kFp16Amp,   // float32 parameters (the master weights), torch.autocast(float16), GradScaler
  kBf16Amp,   // float32 parameters, torch.autocast(bfloat16)
  kBf16Pure,  // parameters, gradients, optimizer state and activations in bfloat16
  kFp16Pure,  // the same in float16 (inference, or training without master weights)
};

enum class OptimizerKind {
  kSgd,
  kSgdMomentum,
  kAdam,
  kAdamW,
  kAdagrad,
  kRmsprop,
  kLion,
  kAdafactor,    // torch.optim.Adafactor (PyTorch 2.5+)
  kHfAdamW,      // transformers.AdamW (deprecated; optim="adamw_hf"): a Python loop
  kHfAdafactor,  // transformers.Adafactor (optim="adafactor"): a Python loop, float32 math
  // bitsandbytes (engine/step/optimizers.h): one fused kernel per parameter, no scratch.
  kBnbAdamW8bit,        // AdamW8bit (optim="adamw_bnb_8bit"): 8-bit blockwise state
  kBnbPagedAdamW8bit,   // PagedAdamW8bit (optim="paged_adamw_8bit")
  kBnbPagedAdamW32bit,  // PagedAdamW (optim="paged_adamw_32bit"): float32 state
};
// One of bitsandbytes' optimizers.
inline bool IsBitsandbytes(OptimizerKind k) {
  return k == OptimizerKind::kBnbAdamW8bit || k == OptimizerKind::kBnbPagedAdamW8bit ||
         k == OptimizerKind::kBnbPagedAdamW32bit;
}
// How torch.optim runs the update: one parameter at a time, _foreach_ ops over all
// parameters at once (PyTorch's default on CUDA), or one fused kernel.
enum class OptimizerImpl { kForLoop, kForeach, kFused };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kAdamW;
  OptimizerImpl impl = OptimizerImpl::kForeach;
  double weight_decay = 0.0;  // for Adam (not AdamW) and SGD, a non-zero value adds a temporary
};

enum class CheckpointPolicy {
  kNone,
  kEveryBlock,     // torch.utils.checkpoint around each block
  kEveryKBlocks,   // around each run of `every_k` consecutive blocks
  kSqrtBlocks,     // k = round(sqrt(L)): O(sqrt L) memory for one extra forward
  kAttentionCore,  // selective: only the attention core (scores, softmax, dropout, context)
  kScopes,         // around each of the named scopes
};

struct CheckpointConfig {
  CheckpointPolicy policy = CheckpointPolicy::kNone;
  int64_t every_k = 1;              // for kEveryKBlocks
  std::vector<std::string> scopes;  // for kScopes
  // torch.utils.checkpoint(..., use_reentrant=False): the region runs with grad but keeps
  // nothing; backward recomputes it when it first needs a saved tensor (on CUDA, PyTorch 2.x,
  // only up to the last op that saves one) and frees each recomputed tensor as backward uses
  // it. Reentrant (the default): outputs and their gradients are held until the region's
  // backward ends.
  bool non_reentrant = false;
};

enum class StepKind {
  kSteadyState,  // a step after the first: optimizer state exists already
  kFirstStep,    // the first step: optimizer state is created inside it
};

// How attention runs in the presets' and layer models' attention layers (traced graphs carry
// their own ops). Hugging Face's attn_implementation names map onto these: "eager" -> kEager,
// "sdpa" -> kSdpa, "flash_attention_2" -> kFlash (the flash-attn package keeps what SDPA's
// flash kernel keeps: engine/rules/sdpa_select.h).
enum class AttentionImpl {
  kDefault,       // kSdpa on CUDA (what transformers >= 4.36 and torchvision give on PyTorch
                  // 2.x); kEager on the cpu-1.13 runtime, which has no SDPA
  kEager,         // the math written out op by op: [T, T] scores, softmax, dropout kept
  kSdpa,          // F.scaled_dot_product_attention, the kernel PyTorch 2.x selects
                  // (flash, then memory-efficient, then math)
  kFlash,         // the flash kernel only (sdpa_kernel(FLASH_ATTENTION), HF flash_attention_2)
  kMemEfficient,  // the memory-efficient (xformers/CUTLASS) kernel only
  kCudnn,         // cuDNN attention first, as PyTorch orders it where it prefers cuDNN
};

// How the CUDA driver loads PyTorch's kernel images (CUDA_MODULE_LOADING): lazily, when a
// kernel first runs (PyTorch's default since 1.13, with CUDA >= 11.7), or all at
// initialisation (CUDA_MODULE_LOADING=EAGER, or an older CUDA): the CUDA context grows
// (engine/ir/devices.h, CudaContextBytes).
enum class ModuleLoading { kLazy, kEager };

// How a mixture-of-experts router spreads a micro-batch's tokens over its experts
// (config.expert_load; docs/moe.md): every token to the same top-k experts, the last ones of the
// experts' loop (the largest working set one expert can have, held longest), or evenly.
// kDefault is kWorst, and is the only value a model without experts takes.
enum class ExpertLoad { kDefault, kWorst, kBalanced };

// How data-parallel ranks hold the model states (docs/parallelism.md).
enum class DataSharding {
  kNone,   // one process, no data parallelism (parallelism.data must be 1)
  kDdp,    // DistributedDataParallel: every rank holds the whole model, its gradients and its
           // optimizer state, and DDP's gradient buckets (one more copy of the gradients)
  kZero1,  // torch.distributed.optim.ZeroRedundancyOptimizer over DDP: each rank keeps the
           // optimizer state of the whole parameters it owns (largest first, to the rank with
           // the fewest elements so far); parameters and gradients stay whole
  kDeepSpeedZero2,  // DeepSpeed ZeRO stage 2 (stage_1_and_2.py): the model whole in its own
                    // dtype; each rank keeps 1/N of the flattened parameters' fp32 master copy,
                    // optimizer state and gradients; gradients leave through the ipg buckets
  kDeepSpeedZero1,  // DeepSpeed ZeRO stage 1 (stage_1_and_2.py, partition_gradients False): as
                    // stage 2, but the gradients stay whole in .grad until the accumulation
                    // boundary, where they are reduced through the ipg buckets after backward
  kMegatronDdp,      // Megatron-LM's DistributedDataParallel (one float32 gradient buffer) with
                     // its mixed-precision optimizer (engine/passes/megatron_ddp.h)
  kMegatronDistOpt,  // the same with the distributed optimizer (its state sharded over ranks)
  kFsdp1,  // FSDP1 (FullyShardedDataParallel, auto-wrapped by block, use_orig_params=False):
           // each unit's parameters one flat shard; FULL_SHARD, or SHARD_GRAD_OP with
           // reshard_after_forward=false (engine/passes/fsdp1.h)
  kFsdp2,  // FSDP2 (fully_shard on each block and the root, PyTorch 2.x): parameters, gradients
           // and optimizer state sharded on dim 0; a block's parameters are all-gathered
           // around its forward and again around its backward (engine/passes/fsdp.h)
  kDeepSpeedZero3,  // DeepSpeed ZeRO stage 3 (stage3.py): every parameter partitioned 1/N per
                    // rank, gathered per module around its forward and backward by the
                    // partitioned-parameter coordinator (engine/passes/deepspeed_zero3.h)
};

// The order a pipeline stage runs its micro-batches in (engine/passes/pipeline.h).
enum class PipelineSchedule {
  k1F1B,   // Megatron-LM's non-interleaved schedule: warm-up forwards, then one forward and one
           // backward in turn (torch.distributed.pipelining's Schedule1F1B)
  kGPipe,  // all forwards, then all backwards (ScheduleGPipe)
};

// How the model's Linear weights are stored: bitsandbytes' 4-bit layers as transformers loads
// them (engine/passes/quantize.h), or a quantized checkpoint as vLLM serves it
// (engine/passes/served_quantize.h, with config.serving only).
enum class WeightFormat {
  kDense,    // as the precision says
  kBnbNf4,   // bitsandbytes Linear4bit, NF4 (BitsAndBytesConfig(load_in_4bit=True,
             // bnb_4bit_quant_type="nf4"))
  kBnbFp4,   // the same with bnb_4bit_quant_type="fp4", transformers' default
  kBnbInt8,  // bitsandbytes Linear8bitLt, LLM.int8 (BitsAndBytesConfig(load_in_8bit=True))
  kTorchaoInt4,  // torchao's Int4WeightOnlyConfig (transformers' TorchAoConfig), inference
  kTorchaoInt8,  // torchao's Int8WeightOnlyConfig, per row, inference
  kW8A8Fp8,  // float8_e4m3 weights with float32 scales, inputs quantized to fp8 (vLLM's "fp8",
             // compressed-tensors' float-quantized FP8 and FP8-dynamic checkpoints)
  kW8A8Int8, // int8 weights with float32 scales, inputs quantized to int8 (compressed-tensors'
             // int-quantized W8A8 checkpoints)
  kW4A16,    // 4-bit weights packed eight to an int32, scales per group in the model's dtype,
             // inputs as they are (GPTQ, AWQ, compressed-tensors' pack-quantized W4A16)
  kW8A16,    // the same with 8-bit weights (GPTQ 8-bit, compressed-tensors W8A16)
};

// Whether `format` is one vLLM serves (kW8A8Fp8 and after).
bool IsServedWeightFormat(WeightFormat format);
// Whether `format` is one of torchao's weight-only formats (engine/passes/quantize_torchao.h).
inline bool IsTorchaoFormat(WeightFormat f) {
  return f == WeightFormat::kTorchaoInt4 || f == WeightFormat::kTorchaoInt8;
}

// A W8A8 weight's scales: one per output channel, one per tensor, or one per block of
// block_n x block_k values (DeepSeek's and Qwen3's fp8 checkpoints, weight_block_size).
enum class ScaleGranularity { kChannel, kTensor, kBlock };

// How a W8A8 linear's input is quantized: per token as it arrives (FP8-dynamic, W8A8 dynamic),
// per tensor as it arrives, or with a static scale from the checkpoint.
enum class InputQuantization { kDynamicToken, kDynamicTensor, kStatic };

// LLM.int8's default count of outlier columns in each 8-bit Linear's input: the LLM.int8() paper's
// |O| <= 7 "for transformers up to 13B" (Dettmers et al. 2022, section 3.2; docs/qlora.md).
inline constexpr int64_t kDefaultInt8OutlierColumns = 7;
inline constexpr int64_t kMaxInt8OutlierColumns = int64_t{1} << 30;

// transformers' BitsAndBytesConfig for load_in_4bit or load_in_8bit: every nn.Linear but the
// skipped ones becomes a frozen bitsandbytes Linear4bit or Linear8bitLt; the rest of the model
// keeps the precision's dtype.
struct QuantizationConfig {
  WeightFormat format = WeightFormat::kDense;
  // bnb_4bit_use_double_quant: the per-block absmax constants are themselves quantized.
  bool double_quant = false;
  // bnb_4bit_compute_dtype: the dtype the weight is dequantized to and the matmul runs in
  // (transformers' default float32).
  DType compute_dtype = DType::kFloat32;
  // llm_int8_skip_modules: modules left unquantized, matched as transformers matches them (a
  // name that is a component run of the module's path); empty: transformers'
  // get_keys_to_not_convert, the output layer.
  std::vector<std::string> skip_modules;
  // LLM.int8 (kBnbInt8): llm_int8_threshold, the magnitude from which an input value is an
  // outlier (0: no mixed-precision decomposition); and how many of each 8-bit Linear's input
  // columns hold one in a call (the columns the decomposition gathers: data, not config;
  // capped at each layer's input width, which is the worst case).
  double int8_threshold = 6.0;
  int64_t int8_outlier_columns = kDefaultInt8OutlierColumns;
  // PEFT's prepare_model_for_kbit_training: every parameter frozen, every float16 or bfloat16
  // one that is not 4-bit cast to float32 (the QLoRA recipes', and TRL's SFTTrainer's for a
  // 4-bit model with a peft_config). Unset: in training only (KbitPrepared), a training recipe's
  // step that a model loaded for inference does not take.
  std::optional<bool> prepare_for_kbit_training;

  // The served formats' (kW8A8Fp8 and after) settings; each must keep its default otherwise.
  // W8A8: the weights' scales (block_n x block_k for kBlock: weight_block_size), the inputs'
  // quantization, and whether int8 inputs carry zero points (compressed-tensors'
  // input_activations.symmetric false: an int32 zero point per token, and per layer a
  // correction of int32 per output channel).
  ScaleGranularity weight_scales = ScaleGranularity::kChannel;
  int64_t block_n = 128;
  int64_t block_k = 128;
  InputQuantization inputs = InputQuantization::kDynamicToken;
  bool asymmetric_inputs = false;
  // W4A16 and W8A16: the values one scale covers along the input features (-1: all of them, a
  // scale per output channel); zero points per group (AWQ, GPTQ with sym=false); GPTQ's
  // desc_act (act-order), whose g_idx and sorting indices the kernels keep and whose inputs
  // they permute.
  int64_t group_size = 128;
  bool zero_point = false;
  bool act_order = false;
  // A GPTQ checkpoint (quant_method "gptq"): its qzeros and g_idx are loaded whatever sym and
  // desc_act say, and stay where the kernel does not replace them (Machete).
  bool gptq_layout = false;
};

// FP8 training with TransformerEngine (engine/passes/fp8_te.h): te.Linear under fp8_autocast.
enum class Fp8Recipe {
  kNone,
  kDelayed,  // DelayedScaling: per-tensor scales from an amax history (TE's default on H100)
  kCurrent,  // Float8CurrentScaling: per-tensor scales from each tensor's own amax, no history
};
struct Fp8Config {
  Fp8Recipe recipe = Fp8Recipe::kNone;
  int64_t amax_history_len = 1024;  // DelayedScaling's amax_history_len
};
inline constexpr int64_t kMaxAmaxHistory = int64_t{1} << 20;

struct RunConfig;
// Whether config.quantization's 4-bit model went through prepare_model_for_kbit_training.
bool KbitPrepared(const RunConfig& config);
// config.quantization with prepare_for_kbit_training resolved (KbitPrepared).
QuantizationConfig PreparedQuantization(const RunConfig& config);

// PEFT's LoRA: get_peft_model(model, LoraConfig(...)) (engine/passes/lora.h). Every parameter
// of the model is frozen; each target module (a torch.nn.Linear or Hugging Face Conv1D) keeps
// its frozen base and adds lora_B(lora_A(dropout(x))) * scaling, whose two low-rank weights
// train; each module of modules_to_save trains a whole copy of itself beside its frozen
// original. rank 0: no adapters.
struct LoraConfig {
  int64_t rank = 0;  // LoraConfig.r
  // lora_alpha: the adapter's output is scaled by alpha / rank, a multiply that is counted
  // whatever its value.
  double alpha = 8;
  double dropout = 0;  // lora_dropout: 0 (PEFT's default) is nn.Identity, no copy of the input
  // target_modules, matched as PEFT matches a list: a module whose whole name is an entry, or
  // whose name ends in "." + an entry; {"all-linear"}: every Linear and Conv1D but the output
  // layer (the last linear before the loss, PEFT's get_output_embeddings()).
  std::vector<std::string> target_modules;
  // modules_to_save: a module whose name ends with an entry (PEFT's plain endswith) trains a
  // copy of its parameters; the original stays, frozen.
  std::vector<std::string> modules_to_save;
  // get_peft_model(autocast_adapter_dtype=True), PEFT's default: the adapters of a float16 or
  // bfloat16 model are float32, and each adapted module's input is cast to float32 for them.
  // false: the adapters take the base weight's dtype.
  bool autocast_adapter_dtype = true;
  // use_dora: DoRA (PEFT's DoraLinearLayer): each adapted Linear also trains a magnitude vector
  // of its output features, and its forward recomputes the base linear from the weight with
  // the adapters' product added, normalised by output row.
  bool use_dora = false;
};

// LoRA's limits: a rank beyond any layer's width, and name lists beyond any model's modules.
constexpr int64_t kMaxLoraRank = int64_t{1} << 20;
constexpr size_t kMaxLoraModules = 1024;  // also for config.quantization.skip_modules
inline constexpr char kLoraAllLinear[] = "all-linear";

// The KV cache's element type in a server (vLLM's --kv-cache-dtype): kAuto is the model's dtype;
// the fp8 formats store one byte per element (float8_e4m3fn, float8_e5m2).
enum class KvCacheDType : uint8_t { kAuto, kFp8E4m3, kFp8E5m2 };

// Which of a served model's modules vLLM's LoRA manager wraps beyond its linears, read from the
// model's class (engine/models/served_model.h, ServedLoraModules). Set by EstimateServing, not
// by a request.
struct ServedLoraLayout {
  // The class lists embedding_modules: embed_tokens gets slots, and lm_head's logits do.
  bool embeddings = false;
  // lm_head is embed_tokens itself (Qwen3 with tie_word_embeddings): the manager wraps it a
  // second time under its second name.
  bool head_is_embedding = false;
};

// The model served by vLLM's engine (V1) on each GPU (docs/serving.md): its weights, the profile
// run it starts with (one forward of max_num_batched_tokens tokens split over up to max_num_seqs
// requests, then the sampler on each request's last token), and the paged KV cache it allocates
// from what gpu_memory_utilization leaves. 0 in max_num_seqs, max_num_batched_tokens or
// max_model_len asks for vLLM's default (engine/report/serving.h says which).
struct ServingConfig {
  bool enabled = false;
  double gpu_memory_utilization = 0.9;  // of the GPU's total memory, for this instance
  int64_t block_size = 16;              // tokens per KV-cache page
  int64_t max_num_seqs = 0;             // requests scheduled at once
  int64_t max_num_batched_tokens = 0;   // tokens in one step (chunked prefill's chunk)
  int64_t max_model_len = 0;            // the longest request (prompt + output) admitted
  KvCacheDType kv_cache_dtype = KvCacheDType::kAuto;
  // Questions a user asks of the KV cache: how many requests of request_tokens tokens run at
  // once (0: max_model_len's), and the longest request when `concurrency` run at once (0: none).
  int64_t request_tokens = 0;
  int64_t concurrency = 0;
  // vLLM's LoRA serving (--enable-lora), with config.lora: its rank is --max-lora-rank, its
  // target_modules vLLM's (module suffixes: "qkv_proj", "o_proj", ...; empty: every module the
  // model supports). max_loras: adapters in one batch, each a slot in every wrapped module (0:
  // vLLM's default, 1). fully_sharded_loras: the adapters split by tensor parallelism too.
  int64_t max_loras = 0;
  bool fully_sharded_loras = false;
  ServedLoraLayout lora_layout;  // EstimateServing's, from the model
};

// Serving's limits: counts beyond any server's.
constexpr int64_t kMaxServingTokens = int64_t{1} << 24;  // max_model_len, batched tokens
constexpr int64_t kMaxServingSeqs = int64_t{1} << 20;
constexpr int64_t kMaxServingLoras = int64_t{1} << 16;  // max_loras

// The step as one rank of a multi-GPU job runs it. batch_size stays per rank.
// How a tensor-parallel plan shards a module's parameters (DTensor's ColwiseParallel and
// RowwiseParallel, Megatron's ColumnParallelLinear and RowParallelLinear): a linear's output
// features, or its input features; an embedding's rows (the vocabulary) under kRowwise.
// kColwiseGathered: a column-parallel linear whose output is all-gathered whole on every rank
// (Megatron's ColumnParallelLinear(gather_output=True); vLLM's ParallelLMHead, whose
// LogitsProcessor all-gathers the logits).
enum class TensorShardStyle : uint8_t { kColwise, kRowwise, kColwiseGathered };
// Which implementation runs the tensor-parallel layers (engine/passes/tensor_parallel.h):
// Megatron-LM's column- and row-parallel linears (in-place collectives, the sequence-parallel
// input gathered into its global buffer and saved as the rank's shard), or PyTorch's DTensor
// under parallelize_module (torchtitan: functional collectives into new tensors, the gathered
// input saved, loss_parallel, the row-split embedding's gradient whole on every rank).
enum class TensorParallelLayers : uint8_t { kMegatron, kDTensor };
const char* TensorParallelLayersName(TensorParallelLayers layers);  // "megatron", "dtensor"

struct TensorPlanEntry {
  // A module path pattern: '*' matches any run of characters; a pattern matches a module whose
  // whole path it matches, or the part of the path after a '.' ("attn.c_proj" matches
  // "h.3.attn.c_proj", not "h.3.mlp.c_proj").
  std::string module;
  TensorShardStyle style = TensorShardStyle::kColwise;
};

struct ParallelismConfig {
  int64_t data = 1;  // data-parallel ranks (the world size of the data-parallel group)
  DataSharding sharding = DataSharding::kNone;
  // DistributedDataParallel(bucket_cap_mb=...) in bytes (int(mb * 2^20), as DDP computes it);
  // 0: not given, PyTorch's 25 MiB, with a first bucket of 1 MiB.
  int64_t bucket_cap_bytes = 0;
  // DistributedDataParallel(gradient_as_bucket_view=True): .grad is a view into its bucket.
  bool gradient_as_bucket_view = false;
  // DeepSpeed's zero_optimization.reduce_bucket_size (elements) and overlap_comm (a second ipg
  // buffer); 0: DeepSpeed's defaults, 5e8 and (for stage 2) false.
  int64_t reduce_bucket_elements = 0;
  bool overlap_comm = false;
  // DeepSpeed's zero_optimization.offload_optimizer.device: cpu (pin_memory false, DeepSpeed's
  // default; ZeRO-1, -2 or -3): the fp32 master partition, its gradient and the optimizer state
  // live in host memory, the optimizer steps on the CPU (engine/passes/data_parallel.h).
  bool offload_optimizer = false;
  // DeepSpeed ZeRO-3's zero_optimization.offload_param.device: cpu: each parameter's partition
  // lives in host memory and is copied to the GPU to be gathered (engine/passes/
  // deepspeed_zero3.h).
  bool offload_param = false;
  // FSDP2: fully_shard(block, reshard_after_forward=...): a block's gathered parameters are
  // freed after its forward and gathered again for its backward (true, the default), or kept.
  bool reshard_after_forward = true;
  // FSDP2: fully_shard(last block, reshard_after_forward=False) with the other blocks as
  // reshard_after_forward says (torchtitan's default: backward needs the last block first).
  bool keep_last_block_gathered = false;
  // FSDP2: MixedPrecisionPolicy(param_dtype=<the 16-bit dtype of a bf16-pure or fp16-pure
  // precision>, reduce_dtype=float32) over a float32 model: the shards, their gradients and the
  // optimizer state are float32; the gathered parameters and the compute are 16-bit.
  bool fsdp_mixed_precision = false;
  // FSDP2: fully_shard(..., offload_policy=CPUOffloadPolicy()) (pin_memory=True, its default):
  // the shards, their gradients and the optimizer state live in pinned host memory, the
  // optimizer steps on the CPU, each all-gather first copies its shards to the GPU.
  bool fsdp_cpu_offload = false;
  // FSDP1 HYBRID_SHARD / FSDP2 HSDP (fully_shard over a 2-D mesh, replicate x shard): the
  // parameters, gradients and optimizer state are sharded within groups of this many data ranks
  // and replicated across the data / data_shard groups, whose sharded gradients are then
  // all-reduced in place. 0: sharded over every data rank (FULL_SHARD, a 1-D mesh).
  int64_t data_shard = 0;
  // DeepSpeed ZeRO-3's zero_optimization.stage3_* settings, in elements, DeepSpeed's defaults:
  // how far ahead the coordinator gathers, how many gathered elements it lets prefetching
  // reach, how near a parameter's next use must be for it to stay gathered, and the size up
  // to which a parameter is persistent (kept whole on every rank).
  int64_t stage3_prefetch_bucket_size = 50'000'000;
  int64_t stage3_max_live_parameters = 1'000'000'000;
  int64_t stage3_max_reuse_distance = 1'000'000'000;
  int64_t stage3_param_persistence_threshold = 100'000;
  // Pipeline stages: the model's blocks split evenly over them; grad_accum_steps is the number
  // of micro-batches. 1: no pipeline.
  int64_t pipeline = 1;
  PipelineSchedule pipeline_schedule = PipelineSchedule::k1F1B;
  // A stage's sent output stays whole until its backward (torch.distributed.pipelining); false:
  // Megatron's deallocate_output_tensor frees it once sent, keeping a one-element stub.
  bool pipeline_keep_outputs = false;
  // Megatron-LM's interleaved 1F1B (virtual_pipeline_model_parallel_size): each stage holds this
  // many model chunks of blocks/(pipeline x virtual) blocks, chunk c of stage r being virtual
  // stage c x pipeline + r. 1: the non-interleaved schedule.
  int64_t pipeline_virtual_stages = 1;
  // Tensor-parallel ranks (Megatron-LM's tensor_model_parallel_size): the plan's linears and
  // embeddings are sharded over them (engine/passes/tensor_parallel.h). 1: none.
  int64_t tensor = 1;
  // Megatron's sequence parallelism: outside the tensor-parallel linears, each rank holds its
  // share of the sequence.
  bool sequence_parallel = false;
  // Which modules are sharded, and how. Empty: the default plan for the presets' module names.
  std::vector<TensorPlanEntry> tensor_plan;
  TensorParallelLayers tensor_layers = TensorParallelLayers::kMegatron;
  // The default plan's lm_head all-gathers its logits (kColwiseGathered), as vLLM's does: set by
  // serving (engine/report/serving.h), not a request's setting.
  bool gather_lm_head = false;
  // Context-parallel ranks (Megatron-LM's context_parallel_size, TransformerEngine's ring
  // attention): each holds 1/context of every sequence (engine/passes/context_parallel.h).
  int64_t context = 1;
  // Expert-parallel ranks (Megatron-LM's expert_model_parallel_size): each holds
  // experts/expert of every mixture-of-experts layer's experts, and the layers' tokens travel to
  // their experts by all-to-all (engine/passes/expert_parallel.h). The expert-parallel groups
  // are carved out of the data-parallel (and context-parallel) ranks. 1: none.
  int64_t expert = 1;
  // GPUs per node: which process groups NCCL connects within a node (NVLink) and which across
  // nodes (engine/ir/nccl.h).
  int64_t gpus_per_node = 8;
};

constexpr int64_t kMaxTensorParallel = 1024;
constexpr int64_t kMaxExpertParallel = 1024;
// The largest per-core cache a request may name for the CPU runtime (1 GiB).
constexpr int64_t kMaxCpuCacheBytes = int64_t{1} << 30;
constexpr int64_t kMaxGpusPerNode = 1024;
constexpr size_t kMaxTensorPlanEntries = 1024;

// DeepSpeed's default zero_optimization.reduce_bucket_size.
constexpr int64_t kDeepSpeedReduceBucketElements = 500'000'000;

// The most data-parallel ranks a request may name.
constexpr int64_t kMaxDataParallel = int64_t{1} << 20;
constexpr int64_t kMaxPipelineStages = 1024;
// The largest DDP bucket cap a request may name (1 TiB).
constexpr int64_t kMaxBucketCapBytes = int64_t{1} << 40;

struct RunConfig {
  Mode mode = Mode::kTraining;
  int64_t batch_size = 1;        // samples per optimizer step on this device
  int64_t grad_accum_steps = 1;  // micro-batches per step; batch_size must divide evenly
  Precision precision = Precision::kFp32;
  OptimizerConfig optimizer;
  bool zero_grad_set_to_none = true;  // PyTorch's default since 2.0
  CheckpointConfig checkpoint;
  StepKind step = StepKind::kSteadyState;
  // Target device: a catalog name (engine/ir/devices.h), or a bare capacity in bytes; both empty
  // means no device (no fit verdict; the CUDA context of a generic device is used).
  std::string device;
  int64_t device_capacity_bytes = 0;
  // Inference of decoder presets: new tokens generated after the prompt; the KV cache holds
  // prompt + generated tokens.
  int64_t generate_tokens = 0;
  // PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.
  bool expandable_segments = false;
  Runtime runtime = Runtime::kCuda;
  CpuIsa cpu_isa = CpuIsa::kAvx512;  // the CPU runtime only
  // The CPU runtime only: the per-core caches oneDNN sizes convolution blocks by (0: its
  // defaults, 32 KiB and 512 KiB, CpuConvProblem's; engine/rules/cpu_conv_kernels.h).
  int64_t cpu_l1_bytes = 0;
  int64_t cpu_l2_bytes = 0;
  // Training: the loop keeps the model's outputs in a variable, as `outputs = model(**batch);
  // loss = outputs.loss; loss.backward(); optimizer.step()` does (PyTorch's tutorials, Hugging
  // Face's no_trainer examples, nanoGPT): they live through backward and the optimizer step, and
  // a steady-state step starts with the previous step's outputs, released when its forward and
  // loss have made new ones. false: the loop lets them go once the loss exists (Hugging Face's
  // Trainer, whose compute_loss returns the loss alone; Lightning's training_step). Inference
  // ignores it (the server refuses it there).
  bool hold_outputs = true;
  AttentionImpl attention = AttentionImpl::kDefault;
  ModuleLoading module_loading = ModuleLoading::kLazy;  // the CUDA runtime only
  // CUBLAS_WORKSPACE_CONFIG (":SIZE_KIB:COUNT" pairs) as the run sets it; empty: PyTorch's
  // default for the device (CublasWorkspaceBytes). The CUDA runtime only.
  std::string cublas_workspace_config;
  ParallelismConfig parallelism;  // training only
  LoraConfig lora;
  QuantizationConfig quantization;
  ExpertLoad expert_load = ExpertLoad::kDefault;
  ServingConfig serving;  // inference only
  Fp8Config fp8;          // training only

  int64_t micro_batch() const { return batch_size / grad_accum_steps; }
};

// The most tokens one request may generate (config.generate_tokens): far beyond any model's
// context, and small enough that prompt + generated tokens cannot overflow.
constexpr int64_t kMaxGenerateTokens = int64_t{1} << 24;

// Validates field ranges, then ValidateSettingsApply; errors name the field as
// "config.<field>".
Status ValidateRunConfig(const RunConfig& config);

// The ranks FSDP shards over: data_shard under HSDP, else every data rank.
inline int64_t ShardRanks(const ParallelismConfig& p) {
  return p.data_shard > 0 ? p.data_shard : p.data;
}

// config.parallelism's degrees, strategy and the settings that belong to it; Megatron-LM's
// data parallelism's demands on the rest of the run (config_parallel.cc, for ValidateRunConfig).
Status ValidateParallelism(const ParallelismConfig& parallelism);
Status ValidateMegatron(const RunConfig& config);

// config.parallelism.gpus_per_node within [1, kMaxGpusPerNode] (ValidateRunConfig's check, for
// engine/ir/nccl.h too).
Status ValidateGpusPerNode(int64_t gpus_per_node);

// config.quantization's fields (config_finetune.cc, for ValidateRunConfig): each setting only
// with a format that has it, skip names non-empty and bounded; bitsandbytes' formats with a
// floating compute dtype, on the CUDA runtime (its kernels are CUDA's) and no parallelism but
// DDP and ZeRO-1/2; the served formats with config.serving (ValidateServedQuantization,
// config_quantization.cc: group and block sizes in range).
Status ValidateQuantization(const RunConfig& config);
// config.fp8: training on CUDA, one GPU or data parallelism, no adapters or quantized weights.
Status ValidateFp8(const RunConfig& config);
Status ValidateServedQuantization(const RunConfig& config);

// config.serving's fields (config_serving.cc, for ValidateRunConfig): sizes in range, a block
// size vLLM accepts, inference on CUDA with a device to divide, no setting vLLM's engine does not
// take here (generated tokens, data or pipeline parallelism, adapters, 4-bit weights). The batch
// size is EstimateServing's to check (engine/report/serving.h): its profile run has one.
Status ValidateServing(const RunConfig& config);

// config.lora's fields (config_lora.cc, for ValidateRunConfig): a rank in [0, kMaxLoraRank],
// alpha finite, dropout in [0, 1], target modules given (and only with a rank), names non-empty
// and bounded, "all-linear" alone; no tensor or context parallelism (not modelled).
Status ValidateLora(const RunConfig& config);

// Refuses a setting that does not apply to the mode, policy or runtime it comes with, where
// the estimate would ignore it or PyTorch would refuse it: generate_tokens in training;
// keep_grads or the first step in inference; checkpoint scopes without the scopes policy, or
// non_reentrant without a policy; with the cpu-1.13 runtime, expandable segments, a catalog
// device (a GPU), a fused optimizer or a float16 precision (PyTorch 1.13 has no fused optimizer
// for CPU tensors, its CPU autocast refuses float16, and addmm, relu, ... have no float16 CPU
// kernel), or an attention implementation other than eager (1.13 has no
// scaled_dot_product_attention); and data parallelism in inference (each replica of an
// inference job is its own estimate). A bare capacity with the cpu-1.13 runtime is a host memory
// budget, and is accepted.
// The optimizer and checkpoint in inference are refused where the request says they were set
// (server/explicit_settings.h): the engine's defaults cannot tell an explicit AdamW from none.
Status ValidateSettingsApply(const RunConfig& config);

// The attention implementation a step runs: config.attention with kDefault resolved by the
// runtime (kSdpa on CUDA, kEager on cpu-1.13).
AttentionImpl ResolveAttention(const RunConfig& config);

// The dtype of parameters under a precision policy.
DType ParameterDType(Precision precision);
// The autocast dtype, or the parameter dtype when the policy does not autocast.
DType ComputeDType(Precision precision);
bool IsAutocast(Precision precision);

const char* PrecisionName(Precision p);
const char* OptimizerKindName(OptimizerKind k);
const char* OptimizerImplName(OptimizerImpl i);
const char* CheckpointPolicyName(CheckpointPolicy p);
const char* RuntimeName(Runtime r);
const char* CpuIsaName(CpuIsa isa);
const char* AttentionImplName(AttentionImpl a);
const char* ModuleLoadingName(ModuleLoading m);
const char* KvCacheDTypeName(KvCacheDType d);  // "auto", "fp8_e4m3", "fp8_e5m2"
const char* DataShardingName(DataSharding s);
const char* WeightFormatName(WeightFormat f);  // "dense", "bnb-nf4", ..., "w8a8-fp8", "w4a16"
// DeepSpeed's ZeRO stage 1 or 2 (DeepSpeedZeroOptimizer, stage_1_and_2.py).
inline bool IsDeepSpeedZero(DataSharding s) {
  return s == DataSharding::kDeepSpeedZero1 || s == DataSharding::kDeepSpeedZero2;
}
// Any DeepSpeed ZeRO stage (1, 2 or 3).
inline bool IsDeepSpeed(DataSharding s) {
  return IsDeepSpeedZero(s) || s == DataSharding::kDeepSpeedZero3;
}
// Megatron-LM's DistributedDataParallel, with or without its distributed optimizer.
inline bool IsMegatron(DataSharding s) {
  return s == DataSharding::kMegatronDdp || s == DataSharding::kMegatronDistOpt;
}

}  // namespace memest

#endif  // MEMEST_ENGINE_IR_CONFIG_H_
