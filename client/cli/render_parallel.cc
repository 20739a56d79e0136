// The parallel parts of an estimate for a terminal (client/cli/render.h): a pipeline's stages;
// and plans, a line each as they arrive.
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "client/cli/render.h"
#include "client/cli/text_table.h"
#include "client/cli/units.h"

namespace memest::cli {

void RenderStages(const v1::EstimateResponse& response, std::ostream& out) {
  if (!response.has_pipeline()) return;
  const v1::PipelineStages& p = response.pipeline();
  out << "Pipeline stages (" << p.stages() << " stages, " << p.micro_batches()
      << " micro-batches); this estimate is stage " << p.worst_stage() << ":\n";
  using Align = TextTable::Align;
  TextTable table({{"stage"},
                   {"blocks"},
                   {"parameters", Align::kRight},
                   {"allocated", Align::kRight},
                   {"reserved", Align::kRight},
                   {"peak in"},
                   {""}});
  for (const v1::PipelineStage& s : p.per_stage()) {
    table.AddRow({std::to_string(s.stage()),
                  std::to_string(s.first_block()) + "-" + std::to_string(s.last_block()),
                  FormatCount(static_cast<int64_t>(s.parameter_count())),
                  FormatBytes(static_cast<int64_t>(s.peak_allocated_bytes())),
                  FormatBytes(static_cast<int64_t>(s.peak_reserved_bytes())),
                  PhaseName(s.peak_phase()), s.stage() == p.worst_stage() ? "<- the most" : ""});
  }
  table.Print(out);
  out << '\n';
}

namespace {

// The data-parallel strategy, with Megatron's expert-parallel ranks ("megatron-distopt ep8").
std::string StrategyName(const v1::Parallelism& p) {
  const std::string ep = p.expert() > 1 ? " ep" + std::to_string(p.expert()) : "";
  switch (p.data_parallel()) {
    case v1::DATA_PARALLEL_DDP:
      return "ddp";
    case v1::DATA_PARALLEL_ZERO1:
      return "zero1";
    case v1::DATA_PARALLEL_DEEPSPEED_ZERO2:
      return "deepspeed-zero2";
    case v1::DATA_PARALLEL_DEEPSPEED_ZERO1:
      return "deepspeed-zero1";
    case v1::DATA_PARALLEL_DEEPSPEED_ZERO3:
      return "deepspeed-zero3";
    case v1::DATA_PARALLEL_FSDP1:
      return "fsdp1";
    case v1::DATA_PARALLEL_FSDP2:
      return "fsdp2";
    case v1::DATA_PARALLEL_MEGATRON_DDP:
      return "megatron-ddp" + ep;
    case v1::DATA_PARALLEL_MEGATRON_DISTOPT:
      return "megatron-distopt" + ep;
    default:
      return "-";
  }
}

// The strategy, its hybrid sharding (hsdp S: shard groups of S data ranks) and its offload:
// +opt (offload_optimizer), +opt+param, +cpu (FSDP's).
std::string Strategy(const v1::Parallelism& p) {
  std::string s = StrategyName(p);
  if (p.data_shard() > 0) s += " hsdp" + std::to_string(p.data_shard());
  if (p.offload_optimizer()) s += "+opt";
  if (p.offload_param()) s += "+param";
  if (p.fsdp_cpu_offload()) s += "+cpu";
  return s;
}

std::string Percent(double fraction) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.0f%%", fraction * 100);
  return buf;
}

constexpr const char* kPlanLine =
    "%5s  %-12s %-14s %-26s %-12s %-12s %10s %10s %9s %7s %10s %10s\n";

void PrintLine(std::ostream& out, const std::vector<std::string>& cols) {
  char buf[512];
  std::snprintf(buf, sizeof buf, kPlanLine, cols[0].c_str(), cols[1].c_str(), cols[2].c_str(),
                cols[3].c_str(), cols[4].c_str(), cols[5].c_str(), cols[6].c_str(), cols[7].c_str(),
                cols[8].c_str(), cols[9].c_str(), cols[10].c_str(), cols[11].c_str());
  out << buf;
}

}  // namespace

void RenderPlanHeader(std::ostream& out) {
  PrintLine(out, {"gpus", "device", "dp x tp x pp", "strategy", "micro-batch", "checkpoint",
                  "needs", "headroom", "recompute", "bubble", "sent/step", "host"});
}

// "2 x 1 x 4v2 cp4": data x tensor x pipeline degrees; "v2" is 2 model chunks a stage
// (interleaved 1F1B), "cp4" context parallelism.
std::string Degrees(const v1::Parallelism& par) {
  const int64_t pipeline = par.pipeline() == 0 ? 1 : par.pipeline();
  const int64_t tensor = par.tensor() == 0 ? 1 : par.tensor();
  const std::string chunks =
      (par.pipeline_virtual_stages() > 1 ? "v" + std::to_string(par.pipeline_virtual_stages())
                                         : "") +
      (par.context() > 1 ? " cp" + std::to_string(par.context()) : "");
  return std::to_string(par.data()) + " x " + std::to_string(tensor) + " x " +
         std::to_string(pipeline) + chunks;
}

void RenderPlan(const v1::ParallelPlan& p, std::ostream& out) {
  const v1::Parallelism& par = p.parallelism();
  PrintLine(out,
            {std::to_string(p.gpus()), p.device(), Degrees(par), Strategy(par),
             std::to_string(p.micro_batch()) + " x " + std::to_string(p.grad_accum_steps()),
             p.checkpoint() == v1::CHECKPOINT_POLICY_EVERY_BLOCK ? "every-block" : "none",
             FormatBytes(static_cast<int64_t>(p.required_bytes())), FormatBytes(p.headroom_bytes()),
             Percent(p.recompute_fraction()), Percent(p.bubble_fraction()),
             FormatBytes(static_cast<int64_t>(p.communicated_bytes_per_step())),
             p.host_bytes() > 0 ? FormatBytes(static_cast<int64_t>(p.host_bytes())) : "-"});
  out.flush();
}

std::string PlanSentence(const v1::ParallelPlan& p) {
  const v1::Parallelism& par = p.parallelism();
  std::string s = std::to_string(p.gpus()) + " x " + p.device() + ": dp x tp x pp " + Degrees(par);
  if (Strategy(par) != "-") s += " " + Strategy(par);
  s += ", micro-batch " + std::to_string(p.micro_batch()) + " x " +
       std::to_string(p.grad_accum_steps());
  if (p.checkpoint() == v1::CHECKPOINT_POLICY_EVERY_BLOCK) s += ", checkpoint every block";
  s += ", needs " + FormatBytes(static_cast<int64_t>(p.required_bytes())) + " a GPU";
  if (p.host_bytes() > 0) {
    s += " and " + FormatBytes(static_cast<int64_t>(p.host_bytes())) + " of host memory";
  }
  return s;
}

void RenderPlanSummary(const v1::PlanSummary& s, std::ostream& out) {
  out << "\n" << s.plans() << " plans from " << s.estimates() << " estimates";
  if (s.skipped_gpu_counts() > 0) {
    out << "; " << s.skipped_gpu_counts()
        << " (GPU type, count) pairs ruled out by the model states alone";
  }
  out << ". micro-batch is micro-batch x accumulation (a pipeline's micro-batches) per "
         "data-parallel rank; tp runs Megatron's linears (DTensor's with --tensor-layers dtensor) "
         "with sequence parallelism; pp \"4v2\" is "
         "4 stages of 2 model chunks (interleaved 1F1B); needs is the "
         "worst rank's reserved memory, CUDA context and NCCL buffers.\n";
}

}  // namespace memest::cli
