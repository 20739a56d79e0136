#include "client/cli/commands.h"

#include <iostream>
#include <memory>

#include "client/cli/backend.h"
#include "client/cli/exit_codes.h"
#include "client/cli/render.h"
#include "server/status_conversion.h"

namespace memest::cli {
namespace {

std::unique_ptr<Backend> MakeBackend(const ConnectionFlags& connection) {
  if (connection.local) return MakeLocalBackend();
  return MakeRemoteBackend(connection.server, connection.deadline_ms, connection.auth_token_file,
                           connection.tls);
}

int Fail(const CallResult& result) {
  std::cerr << "memest: " << result.message << '\n';
  return result.exit_code;
}

// A request the flags could not make (an unknown word, an unreadable model file).
int BadRequest(const Status& status) {
  std::cerr << "memest: " << status.ToString() << '\n';
  return ExitCodeForStatus(ToGrpcStatus(status));
}

}  // namespace

int RunEstimate(const ConnectionFlags& connection, const EstimateFlags& flags) {
  StatusOr<v1::EstimateRequest> request = BuildEstimateRequest(flags);
  if (!request.ok()) return BadRequest(request.status());
  v1::EstimateResponse response;
  const CallResult result = MakeBackend(connection)->Estimate(*request, &response);
  if (!result.ok()) return Fail(result);

  if (connection.json) {
    std::cout << ToJson(response);
  } else {
    RenderEstimate(*request, response, std::cout);
  }
  std::cout.flush();
  return response.has_fit() && !response.fit().fits() ? kExitDoesNotFit : kExitFits;
}

int RunValidate(const ConnectionFlags& connection, const ValidateFlags& flags) {
  StatusOr<v1::ValidateRequest> request = BuildValidateRequest(flags);
  if (!request.ok()) return BadRequest(request.status());
  v1::ValidationResult result;
  // Each stage once, and the replay every tenth of the way.
  int last_stage = -1;
  uint64_t last_tenth = 0;
  auto progress = [&](const v1::ValidateProgress& p) {
    if (flags.quiet) return;
    const uint64_t tenth = p.ops_total() ? p.ops_done() * 10 / p.ops_total() : 0;
    if (p.stage() == last_stage && tenth == last_tenth &&
        p.stage() != v1::ValidateProgress::STAGE_QUEUED) {
      return;
    }
    last_stage = p.stage();
    last_tenth = tenth;
    std::cerr << "memest: " << DescribeProgress(p) << '\n';
  };
  const CallResult call = MakeBackend(connection)->Validate(*request, progress, &result);
  if (!call.ok()) return Fail(call);
  if (connection.json) {
    std::cout << ToJson(result);
  } else {
    RenderValidation(*request, result, std::cout);
  }
  std::cout.flush();
  return kExitFits;
}

int RunPlan(const ConnectionFlags& connection, const PlanFlags& flags) {
  StatusOr<v1::PlanRequest> request = BuildPlanRequest(flags);
  if (!request.ok()) return BadRequest(request.status());
  int64_t plans = 0;
  bool header = false;
  auto on_event = [&](const v1::PlanEvent& e) {
    if (e.has_plan()) ++plans;
    if (connection.json) {  // one JSON object per event, as they arrive
      std::cout << ToJson(e);
      std::cout.flush();
      return;
    }
    if (flags.brief) {
      if (e.has_plan()) std::cout << PlanSentence(e.plan()) << '\n';
      return;
    }
    if (e.has_plan()) {
      if (!header) RenderPlanHeader(std::cout);
      header = true;
      RenderPlan(e.plan(), std::cout);
    } else if (e.has_summary()) {
      RenderPlanSummary(e.summary(), std::cout);
    }
  };
  const CallResult call = MakeBackend(connection)->Plan(*request, on_event);
  if (!call.ok()) return Fail(call);
  if (plans == 0 && !connection.json) {
    std::cout << (flags.brief
                      ? "no plan fits within " +
                            std::to_string(request->max_gpus() > 0 ? request->max_gpus() : 8) +
                            " GPUs"
                      : "no plan fits within the GPU budget (--gpus)")
              << '\n';
  }
  std::cout.flush();
  return plans > 0 ? kExitFits : kExitDoesNotFit;
}

int RunSweep(const ConnectionFlags& connection, const SweepFlags& flags) {
  StatusOr<SweepRequestAndLabels> sweep = BuildSweepRequest(flags);
  if (!sweep.ok()) return BadRequest(sweep.status());
  // The table shows no layer rows: none are sent unless asked for.
  if (!connection.json && !sweep->request.has_max_layer_rows()) {
    sweep->request.set_max_layer_rows(0);
  }
  SweepTable table(sweep->headers);
  bool fits = false, verdicts = false;
  grpc::Status first_refusal;
  auto on_result = [&](const v1::SweepResult& r) {
    if (r.has_estimate()) {
      verdicts |= r.estimate().has_fit();
      fits |= !r.estimate().has_fit() || r.estimate().fit().fits();
    } else if (first_refusal.ok()) {
      first_refusal =
          grpc::Status(static_cast<grpc::StatusCode>(r.error().code()), r.error().message());
    }
    if (connection.json) {  // one JSON object per result, as they arrive
      std::cout << ToJson(r);
      std::cout.flush();
    } else {
      const size_t i = static_cast<size_t>(r.index());
      table.Add(i < sweep->values.size() ? sweep->values[i] : std::vector<std::string>(), r);
    }
  };
  const CallResult call = MakeBackend(connection)->Sweep(sweep->request, on_result);
  if (!call.ok()) return Fail(call);
  if (!connection.json) table.Print(std::cout);
  std::cout.flush();
  if (fits || verdicts) return fits ? kExitFits : kExitDoesNotFit;
  // Nothing answered: every configuration was refused.
  return first_refusal.ok() ? kExitBadInput : ExitCodeForStatus(first_refusal);
}

int RunPresets(const ConnectionFlags& connection) {
  v1::ListPresetsResponse response;
  const CallResult result = MakeBackend(connection)->ListPresets(&response);
  if (!result.ok()) return Fail(result);
  if (connection.json) {
    std::cout << ToJson(response);
  } else {
    RenderPresets(response, std::cout);
  }
  return kExitFits;
}

int RunDevices(const ConnectionFlags& connection) {
  v1::ListDevicesResponse response;
  const CallResult result = MakeBackend(connection)->ListDevices(&response);
  if (!result.ok()) return Fail(result);
  if (connection.json) {
    std::cout << ToJson(response);
  } else {
    RenderDevices(response, std::cout);
  }
  return kExitFits;
}

}  // namespace memest::cli
