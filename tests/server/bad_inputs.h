// The catalogue of bad inputs (issue 13): requests that must be refused, each with the gRPC code
// it must get and the field its message must name.
//
// A row is a text-format memest.v1.EstimateRequest (google::protobuf::TextFormat), optionally
// edited by a function for what text cannot say plainly (a value the proto's enum does not
// define, a long string). bad_inputs_test.cc runs every row through the service's own path
// (memest::HandleEstimate: size checks, proto -> engine conversion, the engine, the one status
// mapping) and checks the code and that the message contains `field`. Advice is skipped: it
// runs only after an estimate succeeded, so no refusal depends on it.
//
// The rows live in one file per part of the request: bad_model_inputs.cc (presets, layer lists,
// op graphs), bad_config_inputs.cc (the run configuration and its combinations) and
// bad_size_inputs.cc (byte counts that cannot be represented, attributes past their bounds,
// models that would expand past the op limit).
#ifndef MEMEST_TESTS_SERVER_BAD_INPUTS_H_
#define MEMEST_TESTS_SERVER_BAD_INPUTS_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "memest/v1/memest.pb.h"

namespace memest::testing {

struct BadInput {
  std::string name;     // the test's name: letters, digits and underscores
  std::string request;  // text format of memest.v1.EstimateRequest
  grpc::StatusCode code;
  std::string field;  // what the message must contain: the field path, in the user's terms
  std::function<void(v1::EstimateRequest*)> edit = nullptr;  // applied after parsing
};

// gtest prints a row by its name.
inline void PrintTo(const BadInput& row, std::ostream* os) { *os << row.name; }

std::vector<BadInput> BadModelInputs();
std::vector<BadInput> BadConfigInputs();
std::vector<BadInput> BadSizeInputs();
std::vector<BadInput> BadHfConfigInputs();
std::vector<BadInput> BadServingInputs();
std::vector<BadInput> BadPrecisionInputs();

// Small models to build rows on, as text-format EstimateRequest fields (no config).
// GPT-2 small cut to 2 blocks of seq 32: a decoder with a KV cache in inference.
extern const char* const kGpt2;
// The mlp preset cut small: 2 hidden blocks, no attention, no KV cache.
extern const char* const kMlp;
// A layer list: input [8], one linear layer to 4 features.
extern const char* const kLinearLayers;
// An op graph: x [2, 8] -> linear(w [4, 8]) in scope "fc" -> sum, the loss; no blocks.
extern const char* const kLinearOps;
// A config that is fine for every model above.
extern const char* const kConfig;

}  // namespace memest::testing

#endif  // MEMEST_TESTS_SERVER_BAD_INPUTS_H_
