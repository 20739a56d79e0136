// Conversion between the wire contract (proto/memest/v1/memest.proto) and the engine's types.
//
// Requests go proto -> engine. The conversion refuses only what the engine's types cannot
// represent: an unset oneof (model source, attribute value), an enum value the proto does not
// define, a non-finite float, a dtype name PyTorch does not know, a capacity beyond 2^62, a
// name longer than engine/ir/text.h's kMaxNameBytes (refused before it is copied; the engine's
// front ends refuse it too), and a setting the request makes explicitly where it does not
// apply (server/explicit_settings.h: an optimizer or checkpointing in inference, an empty
// device name). Every other check (positive sizes, known op kinds, tensor references, ...) is
// the engine's, so the service, the CLI and the Python client all get the same messages. Errors
// name fields as the engine does: "model.layers[3].attrs.out_features",
// "model.tensors[2].dtype", "config.optimizer.weight_decay".
//
// Results go engine -> proto and cannot fail.
#ifndef MEMEST_SERVER_CONVERT_H_
#define MEMEST_SERVER_CONVERT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/estimator.h"
#include "engine/ir/config.h"
#include "engine/ir/devices.h"
#include "engine/ir/status.h"
#include "engine/models/model.h"
#include "engine/models/presets.h"
#include "engine/plan/planner.h"
#include "engine/report/report.h"
#include "memest/v1/memest.pb.h"

namespace memest {

// The model, or INVALID_ARGUMENT naming the field ("model: no model source set", ...).
StatusOr<ModelSpec> ModelFromProto(const v1::Model& model);

// model.hf_config (convert_hf.cc): the config.json's Struct as the engine reads it.
StatusOr<HfConfigSpec> HfConfigFromProto(const v1::HfConfig& hf);

// What a Hugging Face config says about running its model (engine/models/hf_config.h,
// HfConfigRunHints), applied where the request leaves it unset, on the CUDA runtime: its
// torch_dtype (or dtype) as the precision (bfloat16 -> BF16_PURE, float16 -> FP16_PURE, float32
// -> FP32: what from_pretrained loads with dtype="auto", transformers 5's default), and its
// attn_implementation. Nothing for other models or the CPU runtime. Each setting applied is said
// in `notes` (when not null), for the reply.
Status ApplyModelHints(const ModelSpec& model, const v1::RunConfig& proto, RunConfig* run,
                       std::vector<std::string>* notes = nullptr);

// The run configuration, or INVALID_ARGUMENT naming the field under "config.". Ranges (a
// positive batch size, ...) and settings the engine can judge from values alone are left to
// ValidateRunConfig, which Estimate() runs; CheckExplicitSettings runs here.
StatusOr<RunConfig> RunConfigFromProto(const v1::RunConfig& config);

// config.parallelism: DATA_PARALLEL_UNSPECIFIED is DDP with more than one rank (or with a DDP
// setting), none otherwise; bucket_cap_mb becomes bytes as DDP computes them.
StatusOr<ParallelismConfig> ParallelismFromProto(const v1::Parallelism& parallelism);
// config.serving (convert_serving.cc): a set message asks for serving, with an unset batch size
// (the engine then estimates one of 1, which it requires); the ranges are ValidateServing's.
StatusOr<ServingConfig> ServingFromProto(const v1::RunConfig& config);
void ServingToProto(const ServingReport& serving, v1::ServingReport* out);
// With config.serving and no precision: vLLM's dtype "auto" (config/model.py,
// _resolve_auto_dtype, 0.19): the config's torch_dtype, float32 (or none: a preset) downcast to
// bfloat16 on a GPU of sm_80 or later and float16 before it, bfloat16 to float16 before sm_80.
// Says so in `notes`.
Status ApplyServingDtype(const ModelSpec& model, const v1::RunConfig& proto, RunConfig* run,
                         std::vector<std::string>* notes);

// config.lora (convert_lora.cc): a set message needs a rank; the ranges are ValidateLora's.
StatusOr<LoraConfig> LoraFromProto(const v1::Lora& lora);
// config.quantization (convert_lora.cc): a set message needs a format.
StatusOr<QuantizationConfig> QuantizationFromProto(const v1::Quantization& quantization);
void DataParallelToProto(const DataParallelReport& report, v1::DataParallelRanks* out);
void PipelineToProto(const PipelineReport& report, v1::PipelineStages* out);

// A Plan request as the planner takes it (convert_plan.cc): max_gpus 8 and max_plans 20 when
// unset; the run converted as Estimate's; and one plan as the reply carries it.
StatusOr<PlanQuery> PlanQueryFromProto(const v1::PlanRequest& request,
                                       int64_t max_ops = EstimateOptions{}.max_ops);
void PlanToProto(const Plan& plan, v1::ParallelPlan* out);

// RunConfigFromProto, then ApplyModelHints and ApplyServingDtype for `model`: the run as
// Estimate() takes it for that model, with what the hints decided in `notes`.
StatusOr<RunConfig> RunConfigForModel(const ModelSpec& model, const v1::RunConfig& proto,
                                      std::vector<std::string>* notes);

// Everything Estimate() takes, converted from one request.
struct EstimateInput {
  ModelSpec model;
  RunConfig config;
  EstimateOptions options;
  std::vector<std::string> notes;  // for the reply: what the conversion decided (ApplyModelHints)
};

// ModelFromProto and RunConfigForModel together; options.advice = !skip_advice and
// options.max_ops = `max_ops`.
StatusOr<EstimateInput> EstimateInputFromProto(const v1::EstimateRequest& request,
                                               int64_t max_ops = EstimateOptions{}.max_ops);

// Engine -> proto. `out` is overwritten (cleared first).
void ReportToProto(const Report& report, v1::EstimateResponse* out);
void PresetInfoToProto(const PresetInfo& preset, v1::PresetInfo* out);
void DeviceInfoToProto(const DeviceInfo& device, v1::DeviceInfo* out);

// The whole catalogs, as ListPresets / ListDevices return them.
void PresetsToProto(const std::vector<PresetInfo>& presets, v1::ListPresetsResponse* out);
void DevicesToProto(const std::vector<DeviceInfo>& devices, v1::ListDevicesResponse* out);

// Enum conversions, for clients that print or accept names. Each *FromProto refuses a value
// the proto does not define with INVALID_ARGUMENT naming `field`; UNSPECIFIED maps to the
// engine default.
StatusOr<Mode> ModeFromProto(int value, const std::string& field);
StatusOr<Precision> PrecisionFromProto(int value, const std::string& field);
StatusOr<OptimizerKind> OptimizerKindFromProto(int value, const std::string& field);
StatusOr<OptimizerImpl> OptimizerImplFromProto(int value, const std::string& field);
StatusOr<CheckpointPolicy> CheckpointPolicyFromProto(int value, const std::string& field);
StatusOr<StepKind> StepKindFromProto(int value, const std::string& field);
StatusOr<TensorRole> TensorRoleFromProto(int value, const std::string& field);
v1::Phase PhaseToProto(Phase phase);

}  // namespace memest

#endif  // MEMEST_SERVER_CONVERT_H_
