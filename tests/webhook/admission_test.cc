// memest-webhook's decisions (webhook/admission.h) on AdmissionReview documents as the Kubernetes
// API server sends them: with a planner that answers as told, and with the real one (memest's
// plan flags, planned in this process).
#include "webhook/admission.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "webhook/planner.h"

namespace memest::webhook {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A Job's AdmissionReview: `gpus` nvidia.com/gpu on its one container ("" for none), `args` the
// annotation ("" for none), `product` its node selector ("" for none).
json JobReview(const std::string& gpus, const std::string& args, const std::string& product = "",
               int parallelism = 0) {
  json container = {{"name", "trainer"}, {"image", "trainer:1"}};
  if (!gpus.empty()) container["resources"] = {{"limits", {{"nvidia.com/gpu", gpus}}}};
  json pod = {{"containers", {container}}, {"restartPolicy", "Never"}};
  if (!product.empty()) pod["nodeSelector"] = {{"nvidia.com/gpu.product", product}};
  json job = {{"apiVersion", "batch/v1"},
              {"kind", "Job"},
              {"metadata", {{"name", "train"}, {"namespace", "ml"}}},
              {"spec", {{"template", {{"spec", pod}}}}}};
  if (!args.empty()) job["metadata"]["annotations"] = {{"memest.dev/args", args}};
  if (parallelism > 0) job["spec"]["parallelism"] = parallelism;
  return {{"apiVersion", "admission.k8s.io/v1"},
          {"kind", "AdmissionReview"},
          {"request",
           {{"uid", "705ab4f5-6393-11e8-b7cc-42010a800002"},
            {"kind", {{"group", "batch"}, {"version", "v1"}, {"kind", "Job"}}},
            {"operation", "CREATE"},
            {"object", job}}}};
}

json Answer(const json& review, bool mutate, const Planner& plan, AdmissionOptions options = {}) {
  const StatusOr<std::string> out = Review(review.dump(), mutate, options, plan);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  const json response = json::parse(*out);
  EXPECT_EQ(response["apiVersion"], "admission.k8s.io/v1");
  EXPECT_EQ(response["kind"], "AdmissionReview");
  EXPECT_EQ(response["response"]["uid"], review["request"]["uid"]);
  return response["response"];
}

std::string Base64Decode(const std::string& in) {
  const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  int bits = 0, value = 0;
  for (char c : in) {
    if (c == '=') break;
    value = (value << 6) | static_cast<int>(alphabet.find(c));
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((value >> bits) & 0xff);
    }
  }
  return out;
}

// Records the calls; answers "fits" from `fits_from` GPUs up.
struct FakePlanner {
  int64_t fits_from = 2;
  PlanAnswer::Kind otherwise = PlanAnswer::kNoFit;
  std::vector<std::string> calls;
  Planner planner() {
    return [this](const std::vector<std::string>& args, const std::string& device, int64_t gpus) {
      std::string call = device + "/" + std::to_string(gpus) + ":";
      for (const std::string& a : args) call += " " + a;
      calls.push_back(call);
      PlanAnswer answer;
      if (gpus >= fits_from) {
        answer.kind = PlanAnswer::kFits;
        answer.gpus = fits_from;
        answer.text = std::to_string(fits_from) + " x " + device + ": a split";
      } else {
        answer.kind = otherwise;
        answer.text = "no plan fits";
      }
      return answer;
    };
  }
};

TEST(AdmissionTest, AWorkloadThatFitsIsAllowedWithItsSplit) {
  FakePlanner fake;
  const json r = Answer(JobReview("4", "--preset llama-7b --batch 16", "NVIDIA-H100-80GB-HBM3"),
                        false, fake.planner());
  EXPECT_TRUE(r["allowed"]);
  EXPECT_THAT(r["warnings"][0].get<std::string>(), HasSubstr("memest: fits 2 x h100-80gb"));
  EXPECT_THAT(fake.calls, ElementsAre("h100-80gb/4: --preset llama-7b --batch 16"));
}

TEST(AdmissionTest, OneThatDoesNotIsDeniedWithTheFewestThatFit) {
  FakePlanner fake;
  AdmissionOptions options;
  options.max_gpus = 32;
  const json r = Answer(JobReview("1", "--preset llama-7b", "NVIDIA-A100-SXM4-40GB"), false,
                        fake.planner(), options);
  EXPECT_FALSE(r["allowed"]);
  EXPECT_EQ(r["status"]["code"], 403);
  EXPECT_EQ(r["status"]["message"],
            "memest: does not fit 1 x a100-40gb: no split of the model over 1 GPU fits; the "
            "fewest that fit: 2 x a100-40gb: a split");
  EXPECT_THAT(fake.calls,
              ElementsAre("a100-40gb/1: --preset llama-7b", "a100-40gb/32: --preset llama-7b"));
}

TEST(AdmissionTest, AJobsParallelismMultipliesItsGpus) {
  FakePlanner fake;
  Answer(JobReview("8", "--preset llama-70b", "", 4), false, fake.planner());
  EXPECT_THAT(fake.calls, ElementsAre("h100-80gb/32: --preset llama-70b"));
}

// A Job's pods carry its annotation when it is on the pod template; each pod alone is not
// checked (the Job was, with all of them).
TEST(AdmissionTest, APodAControllerMadeIsItsOwners) {
  FakePlanner fake;
  json review = JobReview("8", "--preset llama-70b");
  json pod = review["request"]["object"]["spec"]["template"];
  pod["apiVersion"] = "v1";
  pod["kind"] = "Pod";
  pod["metadata"] = {
      {"name", "train-x7k2p"},
      {"annotations", {{"memest.dev/args", "--preset llama-70b"}}},
      {"ownerReferences",
       {{{"apiVersion", "batch/v1"}, {"kind", "Job"}, {"name", "train"}, {"controller", true}}}}};
  review["request"]["kind"] = {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}};
  review["request"]["object"] = pod;
  EXPECT_TRUE(Answer(review, false, fake.planner())["allowed"]);
  EXPECT_TRUE(fake.calls.empty());
  review["request"]["object"]["metadata"].erase("ownerReferences");  // a bare Pod is checked
  EXPECT_TRUE(Answer(review, false, fake.planner())["allowed"]);
  EXPECT_THAT(fake.calls, ElementsAre("h100-80gb/8: --preset llama-70b"));
}

TEST(AdmissionTest, OnlyCreationIsChecked) {
  FakePlanner fake;
  json review = JobReview("1", "--preset llama-7b");
  review["request"]["operation"] = "UPDATE";  // a finalizer removed, say
  EXPECT_TRUE(Answer(review, false, fake.planner())["allowed"]);
  EXPECT_TRUE(fake.calls.empty());
}

// Filling in a Job of 4 pods: each pod gets its part of the plan's GPUs, rounded up.
TEST(AdmissionTest, AJobsPodsShareTheGpusFilledIn) {
  FakePlanner fake;
  fake.fits_from = 6;
  const json r = Answer(JobReview("", "--preset llama-70b", "", 4), true, fake.planner());
  const json patch = json::parse(Base64Decode(r["patch"].get<std::string>()));
  EXPECT_EQ(patch.back()["value"], "2");
  EXPECT_THAT(r["warnings"][0].get<std::string>(),
              HasSubstr("set nvidia.com/gpu to 2 a pod, 4 pods"));
}

TEST(AdmissionTest, WithoutTheAnnotationNothingIsAsked) {
  FakePlanner fake;
  const json r = Answer(JobReview("1", ""), false, fake.planner());
  EXPECT_TRUE(r["allowed"]);
  EXPECT_FALSE(r.contains("warnings"));
  EXPECT_TRUE(fake.calls.empty());
}

TEST(AdmissionTest, NoGpusIsDeniedWhenValidatingAndFilledInWhenMutating) {
  FakePlanner fake;
  const json denied = Answer(JobReview("", "--preset llama-7b"), false, fake.planner());
  EXPECT_FALSE(denied["allowed"]);
  EXPECT_THAT(denied["status"]["message"].get<std::string>(),
              HasSubstr("asks for no GPUs; the fewest that fit: 2 x h100-80gb"));

  const json filled = Answer(JobReview("", "--preset llama-7b"), true, fake.planner());
  EXPECT_TRUE(filled["allowed"]);
  EXPECT_EQ(filled["patchType"], "JSONPatch");
  const json patch = json::parse(Base64Decode(filled["patch"].get<std::string>()));
  EXPECT_EQ(patch, json::parse(R"([
    {"op": "add", "path": "/spec/template/spec/containers/0/resources", "value": {}},
    {"op": "add", "path": "/spec/template/spec/containers/0/resources/limits", "value": {}},
    {"op": "add", "path": "/spec/template/spec/containers/0/resources/limits/nvidia.com~1gpu",
     "value": "2"}])"));
}

TEST(AdmissionTest, WhenMemestCannotAnswerFailOpenAllowsAndFailClosedDenies) {
  FakePlanner fake;
  fake.fits_from = 1000;
  fake.otherwise = PlanAnswer::kFailed;
  const json open = Answer(JobReview("2", "--preset llama-7b"), false, fake.planner());
  EXPECT_TRUE(open["allowed"]);
  EXPECT_THAT(open["warnings"][0].get<std::string>(), HasSubstr("memest: not checked"));
  AdmissionOptions closed;
  closed.fail_open = false;
  const json shut = Answer(JobReview("2", "--preset llama-7b"), false, fake.planner(), closed);
  EXPECT_FALSE(shut["allowed"]);
}

TEST(AdmissionTest, BadQuantitiesProductsAndReviews) {
  FakePlanner fake;
  EXPECT_FALSE(Answer(JobReview("two", "--preset llama-7b"), false, fake.planner())["allowed"]);
  const json unknown =
      Answer(JobReview("1", "--preset llama-7b", "Quantum-Abacus-9000"), false, fake.planner());
  EXPECT_TRUE(unknown["allowed"]);
  EXPECT_THAT(unknown["warnings"][0].get<std::string>(), HasSubstr("has no memest device"));
  AdmissionOptions options;
  for (const char* bad : {"not json", "[]", "{}", R"({"request": {}})", R"({"request": 7})"}) {
    const StatusOr<std::string> out = Review(bad, false, options, fake.planner());
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  // A kind the webhook does not read, or an object without a pod template: allowed untouched.
  json service = JobReview("1", "--preset llama-7b");
  service["request"]["kind"]["kind"] = "Service";
  EXPECT_TRUE(Answer(service, false, fake.planner())["allowed"]);
  json empty = JobReview("1", "--preset llama-7b");
  empty["request"]["object"]["spec"] = json::object();
  EXPECT_TRUE(Answer(empty, false, fake.planner())["allowed"]);
  EXPECT_TRUE(fake.calls.empty());
}

TEST(AdmissionTest, ProductNamesOfGpuFeatureDiscovery) {
  AdmissionOptions options;
  options.products["Custom-Board"] = "l40s";
  EXPECT_EQ(DeviceForProduct("NVIDIA-H100-80GB-HBM3", options), "h100-80gb");
  EXPECT_EQ(DeviceForProduct("NVIDIA-H100-NVL", options), "h100-nvl");
  EXPECT_EQ(DeviceForProduct("NVIDIA-H100-PCIe", options), "h100-pcie");
  EXPECT_EQ(DeviceForProduct("NVIDIA-H200", options), "h200-141gb");
  EXPECT_EQ(DeviceForProduct("NVIDIA-A100-SXM4-80GB", options), "a100-80gb");
  EXPECT_EQ(DeviceForProduct("NVIDIA-A100-PCIE-40GB", options), "a100-40gb");
  EXPECT_EQ(DeviceForProduct("NVIDIA-L40S", options), "l40s");
  EXPECT_EQ(DeviceForProduct("NVIDIA-L4", options), "l4");
  EXPECT_EQ(DeviceForProduct("Tesla-T4", options), "t4");
  EXPECT_EQ(DeviceForProduct("NVIDIA-A10G", options), "a10g");
  EXPECT_EQ(DeviceForProduct("Custom-Board", options), "l40s");
  EXPECT_EQ(DeviceForProduct("Quantum-Abacus-9000", options), "");
}

// The real planner, in this process: memest's plan flags as `memest plan` reads them.
TEST(AdmissionTest, TheRealPlannerPlansAndRefusesTheWebhooksOwnFlags) {
  const Planner plan = MakePlanner(cli::MakeLocalBackend(), "");
  const std::vector<std::string> llama = {"--preset", "llama-7b", "--seq",       "2048",
                                          "--batch",  "16",       "--precision", "bf16"};
  const PlanAnswer one = plan(llama, "h100-80gb", 1);
  EXPECT_EQ(one.kind, PlanAnswer::kNoFit);
  const PlanAnswer eight = plan(llama, "h100-80gb", 8);
  ASSERT_EQ(eight.kind, PlanAnswer::kFits) << eight.text;
  EXPECT_EQ(eight.gpus, 2);
  EXPECT_THAT(eight.text, HasSubstr("2 x h100-80gb: dp x tp x pp"));

  const PlanAnswer server = plan({"--preset", "llama-7b", "--server", "10.0.0.1:1"}, "l4", 8);
  EXPECT_EQ(server.kind, PlanAnswer::kBadArgs);
  EXPECT_THAT(server.text, HasSubstr("--server is the webhook's to set"));
  for (const char* flag : {"--hf-config", "--model", "--lora-config"}) {
    const PlanAnswer file = plan({"--preset", "llama-7b", flag, "/etc/passwd"}, "l4", 8);
    EXPECT_EQ(file.kind, PlanAnswer::kBadArgs) << flag;
    EXPECT_THAT(file.text, HasSubstr("reads model files only when started with --model-dir"));
  }
  const PlanAnswer unknown = plan({"--preset", "llama-7b", "--frobnicate"}, "l4", 8);
  EXPECT_EQ(unknown.kind, PlanAnswer::kBadArgs);
  const PlanAnswer negative = plan({"--preset", "llama-7b", "--batch=-4"}, "l4", 8);
  EXPECT_EQ(negative.kind, PlanAnswer::kBadArgs);
  EXPECT_THAT(negative.text, HasSubstr("batch"));
}

// A server that answers "busy" could not check the workload: not the flags' fault.
class BusyBackend : public cli::Backend {
 public:
  cli::CallResult Estimate(const v1::EstimateRequest&, v1::EstimateResponse*) override {
    return Busy();
  }
  cli::CallResult ListPresets(v1::ListPresetsResponse*) override { return Busy(); }
  cli::CallResult ListDevices(v1::ListDevicesResponse*) override { return Busy(); }
  cli::CallResult Validate(const v1::ValidateRequest&,
                           const std::function<void(const v1::ValidateProgress&)>&,
                           v1::ValidationResult*) override {
    return Busy();
  }
  cli::CallResult Plan(const v1::PlanRequest&,
                       const std::function<void(const v1::PlanEvent&)>&) override {
    return Busy();
  }
  cli::CallResult Sweep(const v1::SweepRequest&,
                        const std::function<void(const v1::SweepResult&)>&) override {
    return Busy();
  }

 private:
  static cli::CallResult Busy() {
    return {cli::kExitBadInput,
            "RESOURCE_EXHAUSTED: the server is busy: estimates and plans running 2, waiting 16"};
  }
};

TEST(AdmissionTest, ABusyServerIsNoAnswerNotBadFlags) {
  const Planner plan = MakePlanner(std::make_shared<BusyBackend>(), "");
  EXPECT_EQ(plan({"--preset", "llama-7b"}, "h100-80gb", 8).kind, PlanAnswer::kFailed);
}

}  // namespace
}  // namespace memest::webhook
