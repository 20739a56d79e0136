// The flags of `memest`, and the request they describe.
//
// Flags are declared on a CLI11 app (AddEstimateFlags, AddConnectionFlags) into plain structs;
// BuildEstimateRequest turns the struct into a memest.v1.EstimateRequest, validating only what
// the flags themselves can get wrong (unknown enum words, a malformed k=v, an unreadable model
// file). Ranges (a negative batch, an unknown preset) are the engine's to check, so the local
// and remote paths give the same message naming the field.
#ifndef MEMEST_CLIENT_CLI_FLAGS_H_
#define MEMEST_CLIENT_CLI_FLAGS_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "client/cli/backend.h"
#include "client/cli/lora_flags.h"
#include "client/cli/parallel_flags.h"
#include "client/cli/serving_flags.h"
#include "engine/ir/status.h"
#include "memest/v1/memest.pb.h"

namespace memest::cli {

// Where requests go and how the answer is printed; shared by every subcommand.
struct ConnectionFlags {
  std::string server = "127.0.0.1:50051";
  bool local = false;  // run the engine in-process instead of calling a server
  bool json = false;   // print the proto's JSON mapping of the response
  int64_t deadline_ms = 30000;
  std::string auth_token_file;  // the server's bearer token (memest-server --auth-token-file)
  ClientTls tls;                // --tls, --tls-ca, --tls-cert, --tls-key, --tls-server-name
};

struct EstimateFlags {
  // The model: a preset (with parameters), a model file or a Hugging Face config.
  std::string preset;
  std::vector<std::string> params;  // "k=v", repeated
  std::optional<int64_t> seq;       // shortcut for --param seq=N
  std::string model_file;           // JSON: the proto JSON mapping of memest.v1.Model
  std::string hf_config;            // a Hugging Face config.json (model.hf_config)

  // The run.
  std::optional<int64_t> batch;
  std::optional<int64_t> grad_accum;
  std::string mode;       // training | inference
  std::string precision;  // fp32 | fp16 | bf16 | bf16-pure | fp16-pure
  std::string fp8;        // delayed | current: TransformerEngine's fp8 training
  std::optional<int64_t> fp8_amax_history;
  std::string optimizer;       // sgd | momentum | adam | adamw | ...
  std::string optimizer_impl;  // for-loop | foreach | fused
  std::optional<double> weight_decay;
  bool keep_grads = false;  // zero_grad(set_to_none=False)
  std::string checkpoint;   // none | every-block | every-k | sqrt | attention | scopes
  std::optional<int64_t> checkpoint_k;
  std::vector<std::string> checkpoint_scopes;
  bool non_reentrant = false;  // torch.utils.checkpoint(use_reentrant=False)
  bool first_step = false;
  std::optional<std::string> device;  // catalog name; given empty, the engine refuses it
  std::string capacity;               // bytes or "80GiB"
  std::optional<int64_t> generate_tokens;
  bool expandable_segments = false;
  bool hold_outputs = false;            // the loop keeps the model's outputs (the default)
  bool no_hold_outputs = false;         // the loop lets them go once the loss exists
  std::string runtime;                  // cuda | cpu-1.13
  std::string cpu_isa;                  // avx512 | avx2 (cpu-1.13 only)
  std::optional<int64_t> cpu_l1_cache;  // bytes (cpu-1.13 only)
  std::optional<int64_t> cpu_l2_cache;
  std::string attention;            // eager | sdpa | flash | mem-efficient | cudnn (HF names too)
  std::string cuda_module_loading;  // lazy | eager
  std::string cublas_workspace_config;  // CUBLAS_WORKSPACE_CONFIG
  std::string expert_load;              // worst | balanced
  ParallelismFlags parallel;
  LoraFlags lora;
  ServingFlags serving;
  bool no_advice = false;
  std::optional<int64_t> max_layer_rows;  // --layer-rows N: the N layers that hold the most
};

struct ValidateFlags {
  EstimateFlags model;  // the model and the run, as for estimate
  bool scale_batch_to_fit = false;
  int repeats = 0;     // 0: the server's default (3)
  bool quiet = false;  // no progress on stderr
};

void AddConnectionFlags(CLI::App* app, ConnectionFlags* flags);

// A line of flags as a user types them (a Slurm comment, a Kubernetes annotation, a corpus
// line), split at whitespace.
std::vector<std::string> SplitWords(const std::string& text);
// Parses `words` into `app`'s options: INVALID_ARGUMENT with CLI11's message for flags it
// refuses (unknown, malformed, --help).
Status ParseWords(CLI::App* app, const std::vector<std::string>& words);
void AddValidateFlags(CLI::App* app, ValidateFlags* flags);
StatusOr<v1::ValidateRequest> BuildValidateRequest(const ValidateFlags& flags);
void AddEstimateFlags(CLI::App* app, EstimateFlags* flags);

// The request the flags describe. Errors (INVALID_ARGUMENT) name the flag, e.g.
// "--precision: unknown value \"fp8\"; expected one of fp32, fp16, bf16, bf16-pure, fp16-pure".
StatusOr<v1::EstimateRequest> BuildEstimateRequest(const EstimateFlags& flags);
// The request's run configuration alone, for `model` (BuildEstimateRequest's model of the same
// flags): what a sweep builds for each of its configurations.
StatusOr<v1::RunConfig> BuildRunConfig(const EstimateFlags& flags, const v1::Model& model);

// Reads a model file: JSON in the proto JSON mapping of memest.v1.Model (field names in
// lowerCamelCase or as in the .proto). Errors name the file.
StatusOr<v1::Model> ReadModelFile(const std::string& path);

// A Hugging Face config.json (or a model directory's), for model.hf_config.config; errors name
// "--hf-config <path>".
StatusOr<google::protobuf::Struct> ReadHfConfigFile(const std::string& path);

// A file holding one JSON object, or a directory's `file_in_directory`; errors name
// "<flag_name> <path>".
StatusOr<google::protobuf::Struct> ReadJsonObjectFile(const std::string& path,
                                                      const std::string& flag_name,
                                                      const std::string& file_in_directory);

}  // namespace memest::cli

#endif  // MEMEST_CLIENT_CLI_FLAGS_H_
