// Validate's conversions: the request into the engine's model and config, the result and its
// progress into the wire messages. Kept apart from convert.h because only the validation
// worker and the Validate handler need them.
#ifndef MEMEST_SERVER_VALIDATE_CONVERT_H_
#define MEMEST_SERVER_VALIDATE_CONVERT_H_

#include "memest/v1/memest.pb.h"
#include "server/convert.h"
#include "validate/validation.h"

namespace memest {

struct ValidateInput {
  ModelSpec model;
  RunConfig config;
  validate::ValidateOptions options;  // scale_batch_to_fit and repeats; no callbacks
};

// The model and config as Estimate converts them; repeats 0 means 3, and must be 1..100;
// options.max_ops = `max_ops`.
StatusOr<ValidateInput> ValidateInputFromProto(const v1::ValidateRequest& request,
                                               int64_t max_ops = EstimateOptions{}.max_ops);

void ValidationToProto(const validate::Validation& v, v1::ValidationResult* out);
void ProgressToProto(const validate::Progress& p, v1::ValidateProgress* out);

}  // namespace memest

#endif  // MEMEST_SERVER_VALIDATE_CONVERT_H_
