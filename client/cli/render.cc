#include "client/cli/render.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

#include "client/cli/text_table.h"
#include "client/cli/units.h"
#include "engine/ir/text.h"

namespace memest::cli {
namespace {

using Align = TextTable::Align;

// The categories of MemoryByCategory, in the proto's order.
struct CategoryField {
  const char* name;
  uint64_t (v1::MemoryByCategory::*bytes)() const;
};

const CategoryField kCategories[] = {
    {"parameters", &v1::MemoryByCategory::parameters},
    {"gradients", &v1::MemoryByCategory::gradients},
    {"optimizer_state", &v1::MemoryByCategory::optimizer_state},
    {"master_and_casts", &v1::MemoryByCategory::master_and_casts},
    {"activations", &v1::MemoryByCategory::activations},
    {"temporaries", &v1::MemoryByCategory::temporaries},
    {"inputs", &v1::MemoryByCategory::inputs},
    {"kv_cache", &v1::MemoryByCategory::kv_cache},
    {"workspace", &v1::MemoryByCategory::workspace},
    {"communication", &v1::MemoryByCategory::communication},
    {"allocator_overhead", &v1::MemoryByCategory::allocator_overhead},
    {"cuda_context", &v1::MemoryByCategory::cuda_context},
    {"nccl", &v1::MemoryByCategory::nccl},
};

int64_t Signed(uint64_t bytes) { return static_cast<int64_t>(bytes); }

// The width prose is wrapped to.
constexpr size_t kLineWidth = 100;

// Writes `text` word-wrapped to kLineWidth: the first line after `first_prefix`, the rest
// after `prefix` (a hanging indent of the same width).
void PrintWrapped(const std::string& first_prefix, const std::string& text, std::ostream& out) {
  const std::string prefix(first_prefix.size(), ' ');
  std::string line = first_prefix;
  size_t pos = 0;
  bool line_has_word = false;
  while (pos < text.size()) {
    const size_t space = text.find(' ', pos);
    const size_t end = space == std::string::npos ? text.size() : space;
    const std::string word = text.substr(pos, end - pos);
    pos = end + 1;
    if (word.empty()) continue;
    if (line_has_word && line.size() + 1 + word.size() > kLineWidth) {
      out << line << '\n';
      line = prefix;
      line_has_word = false;
    }
    if (line_has_word) line += ' ';
    line += word;
    line_has_word = true;
  }
  out << line << '\n';
}

std::string Where(const v1::Peak& peak) {
  std::string where = PhaseName(peak.phase());
  if (!peak.op().empty()) where += ", op " + peak.op();
  if (!peak.scope().empty()) where += " in " + peak.scope();
  if (peak.micro_batch() > 0) where += ", micro-batch " + std::to_string(peak.micro_batch());
  if (peak.recompute()) where += " (recomputation)";
  return where;
}

std::string DescribeModel(const v1::Model& model) {
  switch (model.source_case()) {
    case v1::Model::kPreset: {
      std::string text = model.preset().name();
      std::vector<std::pair<std::string, int64_t>> params(model.preset().params().begin(),
                                                          model.preset().params().end());
      std::sort(params.begin(), params.end());
      for (const auto& [name, value] : params) {
        text += " " + name + "=" + std::to_string(value);
      }
      return text;
    }
    case v1::Model::kLayers:
      return "layer model (" + std::to_string(model.layers().layers_size()) + " layers)";
    case v1::Model::kOps:
      return "op graph (" + std::to_string(model.ops().ops_size()) + " ops)";
    case v1::Model::kHfConfig: {
      const auto& fields = model.hf_config().config().fields();
      const auto type = fields.find("model_type");
      const std::string name = type != fields.end() && type->second.has_string_value()
                                   ? Escape(type->second.string_value())
                                   : "hf";
      return name + " config seq=" + std::to_string(model.hf_config().seq());
    }
    default:
      return "model";
  }
}

void RenderSummary(const v1::EstimateRequest& request, const v1::EstimateResponse& response,
                   std::ostream& out) {
  const v1::RunConfig& config = request.config();
  const bool inference = config.mode() == v1::MODE_INFERENCE;
  out << DescribeModel(request.model()) << ": " << (inference ? "inference" : "training")
      << ", batch " << config.batch_size();
  if (response.micro_batch() != 0 && Signed(response.micro_batch()) != config.batch_size()) {
    out << " (micro-batch " << response.micro_batch() << ")";
  }
  out << ", " << FormatCount(Signed(response.parameter_count())) << " parameters";
  if (!inference && response.trainable_parameter_count() != response.parameter_count()) {
    out << " (" << FormatCount(Signed(response.trainable_parameter_count())) << " trainable)";
  }
  out << ", " << response.op_count() << " ops\n\n";
}

void RenderPeak(const v1::EstimateResponse& response, std::ostream& out) {
  const v1::Peak& peak = response.peak();
  out << "Peak: " << FormatBytes(Signed(peak.allocated_bytes())) << " allocated, "
      << FormatBytes(Signed(response.peak_reserved_bytes())) << " reserved\n"
      << "  peak allocated during " << Where(peak) << "\n\n";
}

void RenderBreakdown(const v1::EstimateResponse& response, std::ostream& out) {
  const v1::MemoryByCategory& breakdown = response.breakdown();
  int64_t total = 0;
  for (const CategoryField& c : kCategories) total += Signed((breakdown.*c.bytes)());
  out << "Memory at the peak, by category:\n";
  TextTable table({{"category"}, {"bytes", Align::kRight}, {"share", Align::kRight}});
  for (const CategoryField& c : kCategories) {
    const int64_t bytes = Signed((breakdown.*c.bytes)());
    table.AddRow({c.name, FormatBytes(bytes), FormatPercent(bytes, total)});
  }
  table.AddRule();
  table.AddRow({"total (as nvidia-smi)", FormatBytes(total), FormatPercent(total, total)});
  if (const int64_t host = Signed(response.data_parallel().host_bytes()); host > 0) {
    table.AddRow({"host memory (CPU, offloaded)", FormatBytes(host), ""});
  }
  table.Print(out);
  out << '\n';
}

void RenderPhases(const v1::EstimateResponse& response, std::ostream& out) {
  if (response.phases_size() == 0) return;
  // The rows holding the overall peaks: the largest allocated (preferring the row that is the
  // overall peak's phase, should phases repeat per micro-batch) and the largest reserved.
  int allocated_peak = 0;
  int reserved_peak = 0;
  for (int i = 1; i < response.phases_size(); ++i) {
    const v1::Peak& phase = response.phases(i);
    const v1::Peak& best = response.phases(allocated_peak);
    if (phase.allocated_bytes() > best.allocated_bytes() ||
        (phase.allocated_bytes() == best.allocated_bytes() &&
         phase.phase() == response.peak().phase() && best.phase() != response.peak().phase())) {
      allocated_peak = i;
    }
    if (phase.reserved_bytes() > response.phases(reserved_peak).reserved_bytes()) {
      reserved_peak = i;
    }
  }
  out << "Peaks by phase:\n";
  TextTable table({{"phase"},
                   {"allocated", Align::kRight},
                   {"reserved", Align::kRight},
                   {"op @ scope"},
                   {"peak"}});
  for (int i = 0; i < response.phases_size(); ++i) {
    const v1::Peak& phase = response.phases(i);
    std::string where = phase.op();
    if (!phase.scope().empty()) where += (where.empty() ? "" : " @ ") + phase.scope();
    if (phase.recompute()) where += " (recompute)";
    if (phase.micro_batch() > 0) {
      where += (where.empty() ? "" : " ") + std::string("[micro-batch ") +
               std::to_string(phase.micro_batch()) + "]";
    }
    std::string mark;
    if (i == allocated_peak) mark = "<- allocated";
    if (i == reserved_peak) mark += mark.empty() ? "<- reserved" : ", reserved";
    table.AddRow({PhaseName(phase.phase()), FormatBytes(Signed(phase.allocated_bytes())),
                  FormatBytes(Signed(phase.reserved_bytes())), where, mark});
  }
  table.Print(out);
  out << '\n';
}

void RenderLayers(const v1::EstimateResponse& response, std::ostream& out) {
  if (response.layers_size() == 0) return;
  std::vector<const v1::LayerRow*> rows;
  for (const v1::LayerRow& row : response.layers()) rows.push_back(&row);
  std::stable_sort(rows.begin(), rows.end(), [](const v1::LayerRow* a, const v1::LayerRow* b) {
    return a->saved_bytes() > b->saved_bytes();
  });
  const int shown = std::min<int>(kTopLayers, static_cast<int>(rows.size()));
  out << "Top " << shown << " of " << rows.size() << " layers by saved bytes:\n";
  TextTable table({{"scope"},
                   {"saved", Align::kRight},
                   {"outputs", Align::kRight},
                   {"temporaries", Align::kRight},
                   {"parameters", Align::kRight}});
  for (int i = 0; i < shown; ++i) {
    const v1::LayerRow& row = *rows[i];
    table.AddRow({row.scope().empty() ? "(top level)" : row.scope(),
                  FormatBytes(Signed(row.saved_bytes())), FormatBytes(Signed(row.output_bytes())),
                  FormatBytes(Signed(row.temporary_bytes())),
                  FormatBytes(Signed(row.parameter_bytes()))});
  }
  table.Print(out);
  out << '\n';
}

void RenderFit(const v1::EstimateResponse& response, std::ostream& out) {
  if (!response.has_fit()) {
    out << "Fit: no device given (--device NAME or --capacity BYTES)\n";
    return;
  }
  const v1::DeviceFit& fit = response.fit();
  out << "Fit: " << (fit.fits() ? "FITS" : "DOES NOT FIT") << " on " << fit.device() << " ("
      << FormatBytes(Signed(fit.capacity_bytes())) << "): needs "
      << FormatBytes(Signed(fit.required_bytes())) << ", ";
  if (fit.headroom_bytes() >= 0) {
    out << "headroom " << FormatBytes(fit.headroom_bytes()) << " ("
        << FormatPercent(fit.headroom_bytes(), Signed(fit.capacity_bytes())) << " free)\n";
  } else {
    out << "short by " << FormatBytes(-fit.headroom_bytes()) << "\n";
  }
}

void RenderAdvice(const v1::EstimateResponse& response, std::ostream& out) {
  if (response.advice_size() == 0) return;
  out << "\nAdvice:\n";
  for (const v1::Advice& advice : response.advice()) {
    std::string text = advice.message();
    if (advice.saving_bytes() > 0) {
      text += " (saves " + FormatBytes(Signed(advice.saving_bytes())) + ")";
    }
    if (!advice.scope().empty()) text += " [" + advice.scope() + "]";
    PrintWrapped("  - ", text, out);
  }
}

void RenderNotes(const v1::EstimateResponse& response, std::ostream& out) {
  if (response.notes_size() == 0) return;
  out << "\nNotes:\n";
  for (const std::string& note : response.notes()) PrintWrapped("  - ", note, out);
}

}  // namespace

std::string PhaseName(v1::Phase phase) {
  switch (phase) {
    case v1::PHASE_DATA: return "data";
    case v1::PHASE_FORWARD: return "forward";
    case v1::PHASE_LOSS: return "loss";
    case v1::PHASE_BACKWARD: return "backward";
    case v1::PHASE_OPTIMIZER_STEP: return "optimizer_step";
    default: return "unspecified";
  }
}

void RenderEstimate(const v1::EstimateRequest& request, const v1::EstimateResponse& response,
                    std::ostream& out) {
  if (response.has_serving()) {
    RenderServing(response, out);
    RenderPeak(response, out);
    RenderBreakdown(response, out);
    RenderNotes(response, out);
    return;
  }
  RenderSummary(request, response, out);
  RenderPeak(response, out);
  RenderBreakdown(response, out);
  RenderPhases(response, out);
  RenderStages(response, out);
  RenderLayers(response, out);
  RenderFit(response, out);
  RenderAdvice(response, out);
  RenderNotes(response, out);
}

namespace {

std::string SignedPercent(double rel) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%+.2f%%", rel * 100.0);
  return buf;
}

void AddComparison(TextTable& t, const v1::Comparison& c) {
  t.AddRow({c.name(), FormatBytes(Signed(c.predicted_bytes())),
            c.measured() ? FormatBytes(Signed(c.measured_bytes())) : "not measured",
            c.measured() ? SignedPercent(c.rel_error()) : "-"});
}

}  // namespace

std::string DescribeProgress(const v1::ValidateProgress& p) {
  switch (p.stage()) {
    case v1::ValidateProgress::STAGE_QUEUED:
      return "queued: " + p.message();
    case v1::ValidateProgress::STAGE_REPLAYING:
      if (p.ops_total() > 0) {
        return "replaying: " + std::to_string(p.ops_done()) + " / " + std::to_string(p.ops_total()) +
               " ops (" + p.message() + ")";
      }
      return p.message();
    default:
      return p.message();
  }
}

void RenderValidation(const v1::ValidateRequest& request, const v1::ValidationResult& r,
                      std::ostream& out) {
  const v1::MeasuredDevice& d = r.device();
  out << DescribeModel(request.model()) << ": batch " << r.batch_size() << " validated on "
      << d.name() << " (device " << d.ordinal() << ", sm_" << d.compute_capability() << ", "
      << FormatBytes(Signed(d.total_bytes())) << ")\n";
  if (r.scaled_down()) PrintWrapped("  scaled down: ", r.scaled_down_note(), out);
  out << '\n';

  TextTable t({{"quantity"}, {"predicted", Align::kRight}, {"measured", Align::kRight},
               {"error", Align::kRight}});
  AddComparison(t, r.peak_allocated());
  AddComparison(t, r.peak_reserved());
  AddComparison(t, r.device_total());
  t.AddRule();
  for (const v1::Comparison& c : r.categories()) {
    if (c.predicted_bytes() == 0 && c.measured_bytes() == 0) continue;
    AddComparison(t, c);
  }
  t.Print(out);
  out << '\n';

  TextTable phases({{"phase"}, {"allocated (pred / meas)", Align::kRight},
                    {"reserved (pred / meas)", Align::kRight}, {"device", Align::kRight}});
  for (const v1::PhaseComparison& p : r.phases()) {
    phases.AddRow({PhaseName(p.phase()),
                   FormatBytes(Signed(p.allocated().predicted_bytes())) + " / " +
                       FormatBytes(Signed(p.allocated().measured_bytes())),
                   FormatBytes(Signed(p.reserved().predicted_bytes())) + " / " +
                       FormatBytes(Signed(p.reserved().measured_bytes())),
                   p.measured_device_bytes() < 0 ? "-" : FormatBytes(p.measured_device_bytes())});
  }
  phases.Print(out);
  out << '\n';

  std::vector<const v1::OpTiming*> ops;
  for (const v1::OpTiming& op : r.ops()) ops.push_back(&op);
  std::sort(ops.begin(), ops.end(), [](const v1::OpTiming* a, const v1::OpTiming* b) {
    return a->milliseconds() > b->milliseconds();
  });
  char step[64];
  std::snprintf(step, sizeof(step), "%.3f ms", r.step_milliseconds());
  out << "Kernel time of the step: " << step << " (" << r.ops_run() << " ops ran, "
      << r.ops_memory_only() << " as memory only)\n";
  TextTable slow({{"op"}, {"phase"}, {"scope"}, {"ms", Align::kRight}, {"workspace", Align::kRight}});
  for (size_t i = 0; i < ops.size() && i < 10; ++i) {
    char ms[32];
    std::snprintf(ms, sizeof(ms), "%.3f", ops[i]->milliseconds());
    slow.AddRow({ops[i]->kind(), PhaseName(ops[i]->phase()) + (ops[i]->recompute() ? " (recompute)" : ""),
                 ops[i]->scope(), ms,
                 ops[i]->workspace_bytes() ? FormatBytes(Signed(ops[i]->workspace_bytes())) : ""});
  }
  slow.Print(out);
  if (r.notes_size() > 0) out << '\n';
  for (const std::string& n : r.notes()) PrintWrapped("note: ", n, out);
}

void RenderPresets(const v1::ListPresetsResponse& response, std::ostream& out) {
  for (const v1::PresetInfo& preset : response.presets()) {
    out << preset.name() << "  (" << preset.family() << ")\n";
    PrintWrapped("  ", preset.description(), out);
    if (preset.params_size() > 0) {
      TextTable table({{"param"}, {"default", Align::kRight}, {"meaning"}}, 4);
      for (const v1::PresetParam& param : preset.params()) {
        table.AddRow({param.name(), std::to_string(param.default_value()), param.description()});
      }
      table.Print(out);
    }
    out << '\n';
  }
}

void RenderDevices(const v1::ListDevicesResponse& response, std::ostream& out) {
  TextTable table({{"name"},
                   {"capacity", Align::kRight},
                   {"cuda context", Align::kRight},
                   {"cublas workspace", Align::kRight},
                   {"sm", Align::kRight},
                   {"description"}},
                  0);
  for (const v1::DeviceInfo& device : response.devices()) {
    table.AddRow({device.name(), FormatBytes(Signed(device.capacity_bytes())),
                  FormatBytes(Signed(device.cuda_context_bytes())),
                  FormatBytes(Signed(device.cublas_workspace_bytes())),
                  std::to_string(device.compute_capability()), device.description()});
  }
  table.Print(out);
}

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  std::string json;
  // Printing a valid message cannot fail.
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  if (json.empty() || json.back() != '\n') json += '\n';
  return json;
}

}  // namespace memest::cli
