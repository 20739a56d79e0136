// The Estimate fuzz target: one serialized memest.v1.EstimateRequest through the service's own
// handler (HandleEstimate: size check, conversion, engine, conversion back) and the gRPC status
// mapping, without a network, followed by the checks every answer must pass; then the same
// request as a Sweep, which must give the same answer.
//
// It is linked into the libFuzzer binary (fuzz/estimate_fuzzer.cc, built by scripts/fuzz.sh
// with ASan and UBSan) and into the replay test (tests/fuzz), which runs every committed corpus
// and regression input through it with the ordinary compiler.
#ifndef MEMEST_FUZZ_ESTIMATE_TARGET_H_
#define MEMEST_FUZZ_ESTIMATE_TARGET_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/ir/status.h"
#include "memest/v1/memest.pb.h"
#include "server/estimator_service.h"

namespace memest::fuzz {

// Runs one input. Bytes that do not parse as an EstimateRequest are what gRPC refuses before
// any handler runs: they pass. Returns "" when the input went through as it should, or a
// sentence naming the check the answer broke (see CheckEstimate, CheckSweepAgrees).
std::string FuzzEstimateOnce(const uint8_t* data, size_t size);

// The same request as a Sweep (HandleSweep) of its configuration twice, the second estimated
// with the graph the first built: each result must be Estimate's answer (`response`), or its
// refusal (`status`); the sweep may be refused as a whole only with Estimate's refusal.
std::string CheckSweepAgrees(const v1::EstimateRequest& request, const ServiceOptions& options,
                             const Status& status, const v1::EstimateResponse& response);

// The checks on one answer. A refusal has a message and is not INTERNAL (INTERNAL is "a bug in
// memest"). An answer keeps the proto's promises: the peak's categories add up to its allocated
// bytes (exactly on the CPU runtime; at most, under the caching allocator, where a block can
// be larger than the request it serves); nothing allocated exceeds what is reserved, overall and
// per phase; no phase peaks above the overall peak; the micro-batch times the accumulation steps is
// the batch; `fit` is there exactly when a device was named and its required, headroom and fits
// agree; the advice after the diagnosis is biggest saving first. Returns "" or what broke.
std::string CheckEstimate(const v1::EstimateRequest& request, const Status& status,
                          const v1::EstimateResponse& response);

// Words for the mutator, from the engine's own tables: op kinds, layer kinds, presets and their
// parameters, devices, dtypes, and the layer models' losses.
std::vector<std::string> EstimateDictionary();

}  // namespace memest::fuzz

#endif  // MEMEST_FUZZ_ESTIMATE_TARGET_H_
