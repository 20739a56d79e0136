#include "webhook/planner.h"

#include <CLI/CLI.hpp>
#include <filesystem>
#include <set>
#include <utility>

#include "client/cli/exit_codes.h"
#include "client/cli/flags.h"
#include "client/cli/plan_flags.h"
#include "client/cli/render.h"
#include "engine/ir/text.h"

namespace memest::webhook {
namespace {

// The webhook's own, or where memest runs and what it reads for credentials.
const std::set<std::string> kReserved = {
    "--server", "--local",       "--auth-token-file", "--tls",
    "--tls-ca", "--tls-cert",    "--tls-key",         "--tls-server-name",
    "--json",   "--deadline-ms", "--device",          "--devices",
    "--gpus",   "--max-plans",   "--brief",           "--help",
    "-h"};
// Flags whose value is a file the webhook would read.
const std::set<std::string> kFiles = {"--model", "--hf-config", "--lora-config"};

std::string FlagOf(const std::string& word) { return word.substr(0, word.find('=')); }

// Refuses reserved flags, and files outside `model_dir`.
Status CheckArgs(const std::vector<std::string>& args, const std::string& model_dir) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string flag = FlagOf(args[i]);
    if (kReserved.count(flag)) return InvalidArgument(flag + " is the webhook's to set");
    if (!kFiles.count(flag)) continue;
    const std::string path = args[i].find('=') != std::string::npos
                                 ? args[i].substr(args[i].find('=') + 1)
                                 : (i + 1 < args.size() ? args[i + 1] : "");
    std::error_code path_error, root_error;
    const std::filesystem::path real = std::filesystem::weakly_canonical(path, path_error);
    const std::filesystem::path root = std::filesystem::weakly_canonical(model_dir, root_error);
    const auto [end, _] = std::mismatch(root.begin(), root.end(), real.begin(), real.end());
    if (model_dir.empty() || path.empty() || path_error || root_error || end != root.end()) {
      return InvalidArgument(
          flag + " " + Quote(path) + ": the webhook reads model files only " +
          (model_dir.empty() ? "when started with --model-dir" : "under " + Quote(model_dir)));
    }
  }
  return Status::Ok();
}

}  // namespace

Planner MakePlanner(std::shared_ptr<cli::Backend> backend, std::string model_dir) {
  return [backend, model_dir](const std::vector<std::string>& args, const std::string& device,
                              int64_t gpus) {
    PlanAnswer answer;
    if (Status checked = CheckArgs(args, model_dir); !checked.ok()) {
      answer.kind = PlanAnswer::kBadArgs;
      answer.text = checked.message();
      return answer;
    }
    CLI::App app{"memest.dev/args"};
    cli::PlanFlags flags;
    cli::AddPlanFlags(&app, &flags);
    if (Status parsed = cli::ParseWords(&app, args); !parsed.ok()) {
      answer.kind = PlanAnswer::kBadArgs;
      answer.text = parsed.message();
      return answer;
    }
    flags.model.device = device;
    flags.max_gpus = gpus;
    flags.max_plans = 1;
    StatusOr<v1::PlanRequest> request = cli::BuildPlanRequest(flags);
    if (!request.ok()) {
      answer.kind = PlanAnswer::kBadArgs;
      answer.text = request.status().message();
      return answer;
    }
    bool found = false;
    const cli::CallResult call = backend->Plan(*request, [&](const v1::PlanEvent& event) {
      if (!event.has_plan() || found) return;
      found = true;
      answer.text = cli::PlanSentence(event.plan());
      answer.gpus = event.plan().gpus();
    });
    if (!call.ok()) {
      // A busy server (RESOURCE_EXHAUSTED, as a model past the server's limits is) could not
      // answer; the flags were not at fault.
      const bool busy = call.message.find("the server is busy") != std::string::npos;
      answer.kind = call.exit_code == cli::kExitBadInput && !busy ? PlanAnswer::kBadArgs
                                                                  : PlanAnswer::kFailed;
      answer.text = call.message;
      return answer;
    }
    answer.kind = found ? PlanAnswer::kFits : PlanAnswer::kNoFit;
    if (!found) answer.text = "no plan fits within " + std::to_string(gpus) + " GPUs";
    return answer;
  };
}

}  // namespace memest::webhook
