// The parallel parts of an estimate for a terminal (client/cli/render.h): a pipeline's stages.
#include <ostream>
#include <string>

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

}  // namespace memest::cli
