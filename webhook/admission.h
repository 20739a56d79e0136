// The admission decision of memest-webhook (docs/kubernetes.md): a Kubernetes AdmissionReview of
// a Pod, Job, CronJob, Deployment, StatefulSet, ReplicaSet or DaemonSet whose annotation
// `memest.dev/args` holds memest's plan flags is answered by planning the model over the GPUs
// it asks for (nvidia.com/gpu limits, the GPU type from the node selector
// nvidia.com/gpu.product):
//
//   - fits: allowed, with a warning that says the split;
//   - does not fit: denied (403) with why and the fewest GPUs that would fit;
//   - asks for no GPUs: denied, or, when mutating, the fewest that fit are set as the first
//     container's nvidia.com/gpu limit (a JSONPatch);
//   - no annotation, an operation other than CREATE, or a Pod a controller made: allowed
//     untouched.
//
// The planning itself is a Planner, so that the decision is tested without a server.
#ifndef MEMEST_WEBHOOK_ADMISSION_H_
#define MEMEST_WEBHOOK_ADMISSION_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/ir/status.h"

namespace memest::webhook {

inline constexpr char kArgsAnnotation[] = "memest.dev/args";
inline constexpr char kProductLabel[] = "nvidia.com/gpu.product";
inline constexpr char kGpuResource[] = "nvidia.com/gpu";

struct AdmissionOptions {
  // The memest device of a workload without a nvidia.com/gpu.product node selector.
  std::string default_device = "h100-80gb";
  // GPU feature discovery's product names (NVIDIA-H100-80GB-HBM3) to memest devices, beside the
  // built-in ones (DeviceForProduct).
  std::map<std::string, std::string> products;
  // The most GPUs looked at to say what would fit, or to fill in.
  int64_t max_gpus = 64;
  // memest could not answer: allow (with a warning), or deny.
  bool fail_open = true;
};

// One plan of memest's flags `args` on at most `gpus` of `device`.
struct PlanAnswer {
  enum Kind { kFits, kNoFit, kBadArgs, kFailed } kind = kFailed;
  std::string text;  // the plan as one line (kFits), or why not
  int64_t gpus = 0;  // kFits: the plan's GPUs
};
using Planner = std::function<PlanAnswer(const std::vector<std::string>& args,
                                         const std::string& device, int64_t gpus)>;

// The AdmissionReview (admission.k8s.io/v1) response to `review`, as JSON. INVALID_ARGUMENT when
// `review` is not an AdmissionReview with a request (the HTTP answer is then 400).
StatusOr<std::string> Review(const std::string& review, bool mutate,
                             const AdmissionOptions& options, const Planner& plan);

// The memest device of a GPU feature discovery product name ("NVIDIA-H100-80GB-HBM3" ->
// "h100-80gb"); "" when it is not known.
std::string DeviceForProduct(const std::string& product, const AdmissionOptions& options);

}  // namespace memest::webhook

#endif  // MEMEST_WEBHOOK_ADMISSION_H_
