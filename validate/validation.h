// Validate: replays the step the engine predicted on a real device and reports predicted
// against measured.
//
// The replay walks the schedule of Estimate (every allocation and free, in order) through an
// allocator with PyTorch's caching policy (engine/step/allocator.h) whose segments are real device
// memory; a kernel writes every buffer when it is allocated, and each op runs its kernels at the
// model's shapes (validate/op_work.h) between its allocations and its frees, with the cuDNN
// workspace its convolutions really ask for allocated through the same allocator, as PyTorch
// does. What it measures:
//   - allocated and reserved, per phase and at the peak, by category: the prediction's schedule
//     plus what the libraries really asked for;
//   - the device's own view (cudaMemGetInfo): what this process holds, context included, which
//     is what nvidia-smi shows;
//   - the device's fixed costs (context, cuBLAS and cuDNN handles);
//   - the time of each op's kernels (median of repeats), and their sum: the step's time.
#ifndef MEMEST_VALIDATE_VALIDATION_H_
#define MEMEST_VALIDATE_VALIDATION_H_

#include <functional>
#include <string>
#include <vector>

#include "engine/ir/config.h"
#include "engine/models/model.h"
#include "engine/report/report.h"
#include "validate/device.h"

namespace memest::validate {

struct Progress {
  enum class Stage { kProbing, kPlanning, kReplaying, kFinishing };
  Stage stage = Stage::kProbing;
  int64_t ops_done = 0;   // kReplaying: op contexts replayed so far
  int64_t ops_total = 0;
  std::string message;
};

struct ValidateOptions {
  // When the predicted step does not fit the device's free memory: refuse (false) or
  // validate the largest micro-batch that fits (true), saying so.
  bool scale_batch_to_fit = false;
  int repeats = 3;  // timed runs per kernel, after one warm-up
  int64_t max_ops = 1'000'000;  // graphs with more ops are refused, as Estimate does
  std::function<void(const Progress&)> progress;  // called from the validating thread
  std::function<bool()> cancelled;                // polled between ops; true stops with CANCELLED
};

// One quantity, predicted and measured.
struct Comparison {
  std::string name;
  int64_t predicted_bytes = 0;
  int64_t measured_bytes = 0;
  bool measured = true;  // false where the device could not measure it
  // (measured - predicted) / measured; 0 when both are 0.
  double RelError() const;
};

struct PhaseComparison {
  Phase phase = Phase::kData;
  Comparison allocated, reserved;
  int64_t measured_device_bytes = -1;  // the process's device use at its largest in the phase
};

struct OpRun {
  int op = -1;  // graph op index; -1 for the optimizer step
  std::string kind, scope;
  Phase phase = Phase::kForward;
  bool recompute = false;
  std::vector<WorkKind> work;  // the kernels that ran
  double milliseconds = 0;     // their median times, summed
  int64_t workspace_bytes = 0; // the largest workspace one of them took (cuDNN)
  std::string memory_only;     // why its kernels did not run ("" when they did)
};

struct Validation {
  DeviceProbe device;
  RunConfig config;            // as validated (the batch may have been scaled down)
  bool scaled_down = false;
  std::string scaled_down_note;
  Report estimate;             // the prediction for `config` on this device
  std::vector<Comparison> categories;  // at the peak, every category
  Comparison peak_allocated, peak_reserved;
  Comparison device_total;     // what nvidia-smi shows: reserved + context + handles
  std::vector<PhaseComparison> phases;
  std::vector<OpRun> ops;
  double step_milliseconds = 0;
  int64_t ops_run = 0, ops_memory_only = 0;
  std::vector<std::string> notes;
};

// Validates one step of `model` under `config` on `device`. Errors: the config's errors as
// Estimate gives them; FAILED_PRECONDITION when the step cannot be replayed here (it does not
// fit the free memory: the message says by how much; the CPU runtime; expandable segments);
// RESOURCE_EXHAUSTED when the device runs out during the replay; CANCELLED; a device error.
// Every byte taken from the device is given back before it returns.
StatusOr<Validation> Validate(const ModelSpec& model, const RunConfig& config, Device& device,
                              const ValidateOptions& options);

}  // namespace memest::validate

#endif  // MEMEST_VALIDATE_VALIDATION_H_
