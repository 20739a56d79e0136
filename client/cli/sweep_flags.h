// The flags of `memest sweep` (the model and the run as for estimate, plus lists of values to
// try) and the SweepRequest they make: every combination of the lists, each an estimate.
#ifndef MEMEST_CLIENT_CLI_SWEEP_FLAGS_H_
#define MEMEST_CLIENT_CLI_SWEEP_FLAGS_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "client/cli/flags.h"
#include "engine/ir/status.h"
#include "memest/v1/memest.pb.h"

namespace memest::cli {

struct SweepFlags {
  EstimateFlags base;  // the model, and the run every configuration shares
  std::vector<int64_t> batches;
  std::vector<std::string> devices, precisions, optimizers, checkpoints;
};

// The most configurations one `memest sweep` makes (the server's default limit).
constexpr int64_t kMaxSweepConfigs = 65'536;

void AddSweepFlags(CLI::App* app, SweepFlags* flags);

struct SweepRequestAndLabels {
  v1::SweepRequest request;
  std::vector<std::string> headers;              // the flags whose lists vary ("batch", ...)
  std::vector<std::vector<std::string>> values;  // per configuration, its value of each
};

// Every combination of the lists, the first list outermost (batches, devices, precisions,
// optimizers, checkpoints); a flag without a list keeps the base's value. Refuses a list beside
// its single flag (--batches with --batch), an unknown word (as the single flag refuses it:
// "--precision: unknown value ..."), and more than kMaxSweepConfigs combinations (naming the
// lists and their lengths).
StatusOr<SweepRequestAndLabels> BuildSweepRequest(const SweepFlags& flags);

}  // namespace memest::cli

#endif  // MEMEST_CLIENT_CLI_SWEEP_FLAGS_H_
