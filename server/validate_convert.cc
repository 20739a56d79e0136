#include "server/validate_convert.h"

namespace memest {
namespace {

uint64_t Unsigned(int64_t v) { return v < 0 ? 0 : static_cast<uint64_t>(v); }

void ComparisonToProto(const validate::Comparison& c, v1::Comparison* out) {
  out->set_name(c.name);
  out->set_predicted_bytes(Unsigned(c.predicted_bytes));
  out->set_measured_bytes(c.measured ? Unsigned(c.measured_bytes) : 0);
  out->set_rel_error(c.measured ? c.RelError() : 0.0);
  out->set_measured(c.measured);
}

}  // namespace

StatusOr<ValidateInput> ValidateInputFromProto(const v1::ValidateRequest& request,
                                               int64_t max_ops) {
  ValidateInput in;
  MEMEST_ASSIGN_OR_RETURN(in.model, ModelFromProto(request.model()));
  MEMEST_ASSIGN_OR_RETURN(in.config, RunConfigFromProto(request.config()));
  MEMEST_RETURN_IF_ERROR(ApplyModelHints(in.model, request.config(), &in.config));
  const int repeats = request.repeats() == 0 ? 3 : request.repeats();
  if (repeats < 1 || repeats > 100) {
    return InvalidArgument("repeats: must be 1 to 100 (0 means 3), got " +
                           std::to_string(request.repeats()));
  }
  in.options.repeats = repeats;
  in.options.scale_batch_to_fit = request.scale_batch_to_fit();
  in.options.max_ops = max_ops;
  return in;
}

void ValidationToProto(const validate::Validation& v, v1::ValidationResult* out) {
  out->Clear();
  v1::MeasuredDevice* d = out->mutable_device();
  d->set_name(v.device.name);
  d->set_ordinal(v.device.ordinal);
  d->set_compute_capability(v.device.compute_capability);
  d->set_driver_version(v.device.driver_version);
  d->set_runtime_version(v.device.runtime_version);
  d->set_total_bytes(Unsigned(v.device.total_bytes));
  d->set_free_bytes(Unsigned(v.device.free_bytes));
  d->set_context_bytes(v.device.context_bytes);
  d->set_cublas_handle_bytes(v.device.cublas_handle_bytes);
  d->set_cudnn_handle_bytes(v.device.cudnn_handle_bytes);
  for (const std::string& n : v.device.notes) d->add_notes(n);
  out->set_batch_size(Unsigned(v.config.batch_size));
  out->set_scaled_down(v.scaled_down);
  out->set_scaled_down_note(v.scaled_down_note);
  ReportToProto(v.estimate, out->mutable_estimate());
  for (const validate::Comparison& c : v.categories) ComparisonToProto(c, out->add_categories());
  ComparisonToProto(v.peak_allocated, out->mutable_peak_allocated());
  ComparisonToProto(v.peak_reserved, out->mutable_peak_reserved());
  ComparisonToProto(v.device_total, out->mutable_device_total());
  for (const validate::PhaseComparison& p : v.phases) {
    v1::PhaseComparison* pc = out->add_phases();
    pc->set_phase(PhaseToProto(p.phase));
    ComparisonToProto(p.allocated, pc->mutable_allocated());
    ComparisonToProto(p.reserved, pc->mutable_reserved());
    pc->set_measured_device_bytes(p.measured_device_bytes);
  }
  for (const validate::OpRun& r : v.ops) {
    v1::OpTiming* t = out->add_ops();
    t->set_op(r.op);
    t->set_kind(r.kind);
    t->set_scope(r.scope);
    t->set_phase(PhaseToProto(r.phase));
    t->set_recompute(r.recompute);
    for (validate::WorkKind k : r.work) t->add_kernels(validate::WorkKindName(k));
    t->set_milliseconds(r.milliseconds);
    t->set_workspace_bytes(Unsigned(r.workspace_bytes));
    t->set_memory_only(r.memory_only);
  }
  out->set_step_milliseconds(v.step_milliseconds);
  out->set_ops_run(Unsigned(v.ops_run));
  out->set_ops_memory_only(Unsigned(v.ops_memory_only));
  for (const std::string& n : v.notes) out->add_notes(n);
}

void ProgressToProto(const validate::Progress& p, v1::ValidateProgress* out) {
  using S = validate::Progress::Stage;
  switch (p.stage) {
    case S::kProbing:
      out->set_stage(v1::ValidateProgress::STAGE_PROBING);
      break;
    case S::kPlanning:
      out->set_stage(v1::ValidateProgress::STAGE_PLANNING);
      break;
    case S::kReplaying:
      out->set_stage(v1::ValidateProgress::STAGE_REPLAYING);
      break;
    case S::kFinishing:
      out->set_stage(v1::ValidateProgress::STAGE_FINISHING);
      break;
  }
  out->set_ops_done(Unsigned(p.ops_done));
  out->set_ops_total(Unsigned(p.ops_total));
  out->set_message(p.message);
}

}  // namespace memest
