#include "webhook/admission.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "client/cli/flags.h"
#include "engine/ir/text.h"

namespace memest::webhook {
namespace {

using nlohmann::json;

// j[key], or null when j is not an object or has no such key (const json's operator[] must not
// be asked for a key it lacks).
const json& At(const json& j, const char* key) {
  static const json kNull;
  if (!j.is_object()) return kNull;
  const auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

// The pod template (its metadata and spec) of a workload, by kind; null for kinds the webhook
// does not read.
const json* PodTemplate(const std::string& kind, const json& object) {
  const json* pod = nullptr;
  if (kind == "Pod") {
    pod = &object;
  } else if (kind == "CronJob") {
    pod = &At(At(At(At(object, "spec"), "jobTemplate"), "spec"), "template");
  } else if (kind == "Job" || kind == "Deployment" || kind == "StatefulSet" ||
             kind == "ReplicaSet" || kind == "DaemonSet") {
    pod = &At(At(object, "spec"), "template");
  }
  return pod != nullptr && At(*pod, "spec").is_object() ? pod : nullptr;
}

// "/spec/template/spec" for a Job: where PodSpec's spec is, as a JSON pointer.
std::string PodSpecPath(const std::string& kind) {
  if (kind == "Pod") return "/spec";
  if (kind == "CronJob") return "/spec/jobTemplate/spec/template/spec";
  return "/spec/template/spec";
}

// A quantity of whole GPUs ("2", 2); -1 when it is not one.
int64_t Gpus(const json& quantity) {
  if (quantity.is_number_integer()) {
    const int64_t n = quantity.get<int64_t>();
    return n >= 0 && n <= 999999 ? n : -1;
  }
  if (!quantity.is_string()) return -1;
  const std::string text = quantity.get<std::string>();
  if (text.empty() || text.size() > 6) return -1;
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return -1;
  }
  return std::stoll(text);
}

// The annotation on the workload, or else on its pod template.
std::string Annotation(const json& object, const json& pod) {
  for (const json* metadata : {&At(object, "metadata"), &At(pod, "metadata")}) {
    const json& args = At(At(*metadata, "annotations"), kArgsAnnotation);
    if (args.is_string()) return args.get<std::string>();
  }
  return "";
}

std::string Base64(const std::string& bytes) {
  static const char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v =
        (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    for (int shift : {18, 12, 6, 0}) out += kAlphabet[(v >> shift) & 63];
  }
  if (i + 1 == bytes.size()) {
    const uint32_t v = uint8_t(bytes[i]) << 16;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == bytes.size()) {
    const uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8);
    for (int shift : {18, 12, 6}) out += kAlphabet[(v >> shift) & 63];
    out += "=";
  }
  return out;
}

std::string GpusWord(int64_t n) { return n == 1 ? "1 GPU" : std::to_string(n) + " GPUs"; }

// The decision, before it is written as a response.
struct Decision {
  bool allowed = true;
  std::string message;  // denied: why
  std::vector<std::string> warnings;
  json patch;  // a JSONPatch, or null
};

Decision Decide(const std::string& kind, const json& object, bool mutate,
                const AdmissionOptions& options, const Planner& plan) {
  Decision d;
  const json* pod = PodTemplate(kind, object);
  if (pod == nullptr) return d;
  // A Pod that a controller made (a Job's, a ReplicaSet's) is its owner's: the owner was checked
  // with all its pods' GPUs, which one pod's alone could contradict.
  if (kind == "Pod") {
    const json& owners = At(At(object, "metadata"), "ownerReferences");
    if (owners.is_array()) {
      for (const json& owner : owners) {
        if (At(owner, "controller").is_boolean() && At(owner, "controller").get<bool>()) return d;
      }
    }
  }
  const json& spec = At(*pod, "spec");
  const std::string args_text = Annotation(object, *pod);
  if (args_text.empty()) return d;
  const std::vector<std::string> args = cli::SplitWords(args_text);

  // GPUs: the containers' nvidia.com/gpu limits, times a Job's parallelism.
  int64_t gpus = 0;
  const json& containers = At(spec, "containers");
  if (containers.is_array()) {
    for (const json& container : containers) {
      const json& limit = At(At(At(container, "resources"), "limits"), kGpuResource);
      if (limit.is_null()) continue;
      const int64_t n = Gpus(limit);
      if (n < 0) {
        d.allowed = false;
        d.message = "memest: nvidia.com/gpu: not a whole number of GPUs";
        return d;
      }
      gpus += n;
    }
  }
  // A Job's pods run side by side: its GPUs are each pod's times its parallelism.
  const json& job_spec =
      kind == "CronJob" ? At(At(At(object, "spec"), "jobTemplate"), "spec") : At(object, "spec");
  const json& parallelism = At(job_spec, "parallelism");
  int64_t pods = 1;
  if ((kind == "Job" || kind == "CronJob") && parallelism.is_number_integer()) {
    pods = std::max<int64_t>(1, std::min<int64_t>(parallelism.get<int64_t>(), 1 << 20));
  }
  gpus *= pods;
  std::string device = options.default_device;
  const json& product_label = At(At(spec, "nodeSelector"), kProductLabel);
  if (product_label.is_string()) {
    const std::string product = product_label.get<std::string>();
    device = DeviceForProduct(product, options);
    if (device.empty()) {
      const std::string why = "memest: GPU product " + Quote(product) + " has no memest device";
      if (options.fail_open) {
        d.warnings.push_back(why + "; not checked");
      } else {
        d.allowed = false;
        d.message = why;
      }
      return d;
    }
  }

  const PlanAnswer answer = plan(args, device, gpus > 0 ? gpus : options.max_gpus);
  switch (answer.kind) {
    case PlanAnswer::kFits:
      if (gpus > 0) {
        d.warnings.push_back("memest: fits " + answer.text);
      } else if (mutate && containers.is_array() && !containers.empty()) {
        d.patch = json::array();
        const std::string limits = PodSpecPath(kind) + "/containers/0/resources/limits";
        const json& first = containers[0];
        if (At(first, "resources").is_null()) {
          d.patch.push_back({{"op", "add"},
                             {"path", PodSpecPath(kind) + "/containers/0/resources"},
                             {"value", json::object()}});
        }
        if (At(At(first, "resources"), "limits").is_null()) {
          d.patch.push_back({{"op", "add"}, {"path", limits}, {"value", json::object()}});
        }
        // A Job's pods share the plan's GPUs: each gets its part, rounded up.
        const int64_t per_pod = (answer.gpus + pods - 1) / pods;
        d.patch.push_back({{"op", "add"},
                           {"path", limits + "/nvidia.com~1gpu"},
                           {"value", std::to_string(per_pod)}});
        d.warnings.push_back("memest: set nvidia.com/gpu to " + std::to_string(per_pod) +
                             (pods > 1 ? " a pod, " + std::to_string(pods) + " pods" : "") + ": " +
                             answer.text);
      } else {
        d.allowed = false;
        d.message = "memest: this workload asks for no GPUs; the fewest that fit: " + answer.text;
      }
      return d;
    case PlanAnswer::kNoFit: {
      d.allowed = false;
      if (gpus == 0) {
        d.message =
            "memest: no split over up to " + GpusWord(options.max_gpus) + " of " + device + " fits";
        return d;
      }
      d.message = "memest: does not fit " + std::to_string(gpus) + " x " + device +
                  ": no split of the model over " + GpusWord(gpus) + " fits";
      const PlanAnswer more = plan(args, device, options.max_gpus);
      if (more.kind == PlanAnswer::kFits) {
        d.message += "; the fewest that fit: " + more.text;
      } else if (more.kind == PlanAnswer::kNoFit) {
        d.message += "; nor does any over up to " + GpusWord(options.max_gpus);
      }
      return d;
    }
    case PlanAnswer::kBadArgs:
      d.allowed = false;
      d.message = "memest: " + std::string(kArgsAnnotation) + ": " + answer.text;
      return d;
    case PlanAnswer::kFailed:
      break;
  }
  if (options.fail_open) {
    d.warnings.push_back("memest: not checked: " + answer.text);
  } else {
    d.allowed = false;
    d.message = "memest: could not check this workload: " + answer.text;
  }
  return d;
}

}  // namespace

std::string DeviceForProduct(const std::string& product, const AdmissionOptions& options) {
  const auto configured = options.products.find(product);
  if (configured != options.products.end()) return configured->second;
  std::string p;
  for (char c : product) p += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const auto has = [&p](const char* part) { return p.find(part) != std::string::npos; };
  // Most specific first: "H100-NVL" before "H100", "L40S" before "L40" before "L4".
  if (has("H100") && has("NVL")) return "h100-nvl";
  if (has("H100") && has("PCIE")) return "h100-pcie";
  if (has("H100")) return "h100-80gb";
  if (has("H200")) return "h200-141gb";
  if (has("B200")) return "b200";
  if (has("A100") && has("40GB")) return "a100-40gb";
  if (has("A100")) return "a100-80gb";
  if (has("L40S")) return "l40s";
  if (has("L40")) return "l40";
  if (has("L4")) return "l4";
  if (has("A10G")) return "a10g";
  if (has("T4")) return "t4";
  if (has("V100")) return "v100-32gb";
  if (has("RTX-6000-ADA") || has("RTX 6000 ADA")) return "rtx-6000-ada";
  if (has("A6000")) return "a6000";
  return "";
}

StatusOr<std::string> Review(const std::string& review, bool mutate,
                             const AdmissionOptions& options, const Planner& plan) {
  const json in = json::parse(review, nullptr, /*allow_exceptions=*/false);
  if (in.is_discarded() || !in.is_object()) {
    return InvalidArgument("the body is not JSON: an AdmissionReview is expected");
  }
  if (!At(At(in, "request"), "uid").is_string()) {
    return InvalidArgument("request.uid: an AdmissionReview with a request is expected");
  }
  const json& request = At(in, "request");
  const json& kind = At(At(request, "kind"), "kind");
  Decision d;
  // A workload is checked when it is created: an update (a finalizer removed, a Job suspended)
  // of one admitted while the webhook was away must not be refused.
  const json& operation = At(request, "operation");
  const bool create = !operation.is_string() || operation.get<std::string>() == "CREATE";
  if (create && kind.is_string() && At(request, "object").is_object()) {
    d = Decide(kind.get<std::string>(), At(request, "object"), mutate, options, plan);
  }
  json response = {{"uid", At(request, "uid")}, {"allowed", d.allowed}};
  if (!d.allowed) response["status"] = {{"code", 403}, {"message", d.message}};
  if (!d.warnings.empty()) response["warnings"] = d.warnings;
  if (!d.patch.is_null()) {
    response["patchType"] = "JSONPatch";
    response["patch"] = Base64(d.patch.dump());
  }
  return json{
      {"apiVersion", "admission.k8s.io/v1"}, {"kind", "AdmissionReview"}, {"response", response}}
      .dump();
}

}  // namespace memest::webhook
