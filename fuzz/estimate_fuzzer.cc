// libFuzzer entry points for the Estimate target (fuzz/estimate_target.h), structure-aware: the
// custom mutator parses the input as an EstimateRequest (an empty one when it does not parse),
// changes it with ProtoMutator and serializes it again; one time in eight it leaves the
// structure alone and lets libFuzzer mutate the raw bytes, which is what exercises the parser.
// Built only by scripts/fuzz.sh (CMake option MEMEST_FUZZ, clang, ASan + UBSan).
//
// MEMEST_FUZZ_CHECKS=0 in the environment turns off the checks of the answer (CheckEstimate):
// then only crashes, sanitizer reports, timeouts and out-of-memory count. That hunts those while
// a known broken check is not fixed yet, and minimizes a sanitizer finding without the
// minimizer sliding to an input that breaks a check instead.
#include <google/protobuf/stubs/logging.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fuzz/estimate_target.h"
#include "fuzz/proto_mutator.h"
#include "memest/v1/memest.pb.h"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

// False when MEMEST_FUZZ_CHECKS=0: broken checks of the answer do not count.
bool check_answers = true;

const memest::fuzz::MutatorOptions& Options() {
  static const auto* options = [] {
    auto* o = new memest::fuzz::MutatorOptions;
    o->dictionary = memest::fuzz::EstimateDictionary();
    return o;
  }();
  return *options;
}

// The request `data` holds, or an empty one.
memest::v1::EstimateRequest Parse(const uint8_t* data, size_t size) {
  memest::v1::EstimateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) request.Clear();
  return request;
}

// Writes `request` to `out` when it fits in `max_size`; returns its size, or 0.
size_t Write(const memest::v1::EstimateRequest& request, uint8_t* out, size_t max_size) {
  std::string bytes;
  if (!request.SerializeToString(&bytes) || bytes.size() > max_size) return 0;
  std::memcpy(out, bytes.data(), bytes.size());
  return bytes.size();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // Serializing a string that is not UTF-8 logs an error each time: keep the output readable.
  google::protobuf::SetLogHandler(nullptr);
  const char* env = std::getenv("MEMEST_FUZZ_CHECKS");
  check_answers = env == nullptr || std::string(env) != "0";
  if (!check_answers) {
    std::fprintf(stderr, "memest fuzz: MEMEST_FUZZ_CHECKS=0: answers are not checked\n");
  }
  Options();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string broken = memest::fuzz::FuzzEstimateOnce(data, size);
  if (check_answers && !broken.empty()) {
    std::fprintf(stderr, "memest fuzz: check failed: %s\n", broken.c_str());
    std::abort();
  }
  return 0;
}

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  memest::fuzz::ProtoMutator mutator(seed, Options());
  if (mutator.rng()() % 8 == 0) return LLVMFuzzerMutate(data, size, max_size);
  const memest::v1::EstimateRequest original = Parse(data, size);
  for (int attempt = 0; attempt < 4; ++attempt) {
    memest::v1::EstimateRequest request = original;
    // Mostly one change, sometimes a few stacked.
    const int changes = 1 + static_cast<int>(mutator.rng()() % 4 == 0 ? mutator.rng()() % 4 : 0);
    for (int i = 0; i < changes; ++i) mutator.Mutate(&request);
    if (const size_t written = Write(request, data, max_size); written > 0) return written;
  }
  return LLVMFuzzerMutate(data, size, max_size);
}

extern "C" size_t LLVMFuzzerCustomCrossOver(const uint8_t* data1, size_t size1,
                                            const uint8_t* data2, size_t size2, uint8_t* out,
                                            size_t max_out_size, unsigned int seed) {
  memest::fuzz::ProtoMutator mutator(seed, Options());
  memest::v1::EstimateRequest into = Parse(data1, size1);
  mutator.CrossOver(Parse(data2, size2), &into);
  return Write(into, out, max_out_size);
}
