// Readable reports of memest's answers, for a terminal.
//
// RenderEstimate prints, in order: a one-line summary of the run; the peak (allocated and
// reserved, with the phase, op and scope where it happens); the breakdown by category at the
// peak; the peak of each phase with the overall peaks marked; the top layers by saved bytes;
// the fit verdict with headroom; advice with savings; notes. Byte counts are in binary units
// (KiB, MiB, GiB).
#ifndef MEMEST_CLIENT_CLI_RENDER_H_
#define MEMEST_CLIENT_CLI_RENDER_H_

#include <ostream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "client/cli/text_table.h"
#include "memest/v1/memest.pb.h"

namespace memest::cli {

// The number of layers RenderEstimate lists.
inline constexpr int kTopLayers = 10;

// `request` supplies the summary line (model, mode, batch); `response` everything else.
void RenderEstimate(const v1::EstimateRequest& request, const v1::EstimateResponse& response,
                    std::ostream& out);
// A validation: predicted against measured, per quantity, category and phase; the slowest ops.
void RenderValidation(const v1::ValidateRequest& request, const v1::ValidationResult& result,
                      std::ostream& out);
// One line for a progress event: "queued: 2 validations ahead", "replaying: 120 / 480 ops".
std::string DescribeProgress(const v1::ValidateProgress& progress);
void RenderPresets(const v1::ListPresetsResponse& response, std::ostream& out);
void RenderDevices(const v1::ListDevicesResponse& response, std::ostream& out);

// The proto's JSON mapping of `message`, indented, with fields at their defaults included (so
// a machine sees every category, even zero ones). Ends with a newline.
std::string ToJson(const google::protobuf::Message& message);

// A pipeline's stages, each with its blocks and peak (nothing without a pipeline);
// RenderEstimate prints it after the phases.
void RenderStages(const v1::EstimateResponse& response, std::ostream& out);

// A served model (config.serving): vLLM's startup budget, the KV cache's pages and what they
// hold, whether it starts; RenderEstimate prints it first, then the profile run's peak.
void RenderServing(const v1::EstimateResponse& response, std::ostream& out);

// Plans, streamed: a header, then a line per plan as it arrives, then the summary.
void RenderPlanHeader(std::ostream& out);
void RenderPlan(const v1::ParallelPlan& plan, std::ostream& out);
void RenderPlanSummary(const v1::PlanSummary& summary, std::ostream& out);
// One plan as one line, for scripts and job-submission hooks (memest plan --brief): "4 x
// h100-80gb: dp x tp x pp 4 x 1 x 1 fsdp2, micro-batch 1 x 4, needs 63.1 GiB a GPU".
std::string PlanSentence(const v1::ParallelPlan& plan);

// A sweep's results as a table, a row added as each arrives (not the whole response kept): the
// configuration's values of the varied flags (`headers`), the peak allocated, reserved, what the
// device needs and whether it fits; under the table each refusal once, with the configurations
// it refused ("[1, 3] NOT_FOUND: ...").
class SweepTable {
 public:
  explicit SweepTable(std::vector<std::string> headers);
  void Add(std::vector<std::string> values, const v1::SweepResult& result);
  void Print(std::ostream& out) const;

 private:
  size_t columns_;
  TextTable table_;
  std::vector<std::pair<std::string, std::string>> refusals_;  // (indices, status)
  std::unordered_map<std::string, size_t> refusal_of_;         // status -> its refusals_ entry
};

// "forward", "optimizer_step", ... as the engine names phases.
std::string PhaseName(v1::Phase phase);

}  // namespace memest::cli

#endif  // MEMEST_CLIENT_CLI_RENDER_H_
