#include "client/cli/sweep_flags.h"

#include <algorithm>
#include <functional>

#include "engine/ir/shape.h"

namespace memest::cli {

void AddSweepFlags(CLI::App* app, SweepFlags* f) {
  AddEstimateFlags(app, &f->base);
  const char* group = "Sweep (comma-separated lists: every combination is estimated)";
  app->add_option("--batches", f->batches, "batch sizes, instead of --batch")
      ->group(group)
      ->delimiter(',')
      ->type_name("N,N");
  app->add_option("--devices", f->devices, "catalog names, instead of --device")
      ->group(group)
      ->delimiter(',')
      ->type_name("NAMES");
  app->add_option("--precisions", f->precisions, "precision words, instead of --precision")
      ->group(group)
      ->delimiter(',')
      ->type_name("WORDS");
  app->add_option("--optimizers", f->optimizers, "optimizer words, instead of --optimizer")
      ->group(group)
      ->delimiter(',')
      ->type_name("WORDS");
  app->add_option("--checkpoints", f->checkpoints, "checkpoint policies, instead of --checkpoint")
      ->group(group)
      ->delimiter(',')
      ->type_name("WORDS");
}

StatusOr<SweepRequestAndLabels> BuildSweepRequest(const SweepFlags& flags) {
  // One varying flag: its column, its values as the table shows them, and how the i-th sets a
  // configuration's flags.
  struct Axis {
    std::string header;
    std::vector<std::string> labels;
    std::function<void(size_t, EstimateFlags*)> set;
  };
  std::vector<Axis> axes;
  std::string lists, sizes;  // "--batches x --devices", "300 x 3"
  const EstimateFlags& base = flags.base;
  auto add = [&](const char* header, const char* single, const char* list, bool single_given,
                 std::vector<std::string> labels,
                 std::function<void(size_t, EstimateFlags*)> set) -> Status {
    if (labels.empty()) return Status::Ok();
    if (single_given) {
      return InvalidArgument(std::string(list) + ": give " + single + " or " + list + ", not both");
    }
    lists += (lists.empty() ? "" : " x ") + std::string(list);
    sizes += (sizes.empty() ? "" : " x ") + std::to_string(labels.size());
    axes.push_back({header, std::move(labels), std::move(set)});
    return Status::Ok();
  };
  std::vector<std::string> batches;
  for (int64_t b : flags.batches) batches.push_back(std::to_string(b));
  MEMEST_RETURN_IF_ERROR(add("batch", "--batch", "--batches", base.batch.has_value(), batches,
                             [&](size_t i, EstimateFlags* f) { f->batch = flags.batches[i]; }));
  MEMEST_RETURN_IF_ERROR(add("device", "--device", "--devices", base.device.has_value(),
                             flags.devices,
                             [&](size_t i, EstimateFlags* f) { f->device = flags.devices[i]; }));
  MEMEST_RETURN_IF_ERROR(
      add("precision", "--precision", "--precisions", !base.precision.empty(), flags.precisions,
          [&](size_t i, EstimateFlags* f) { f->precision = flags.precisions[i]; }));
  MEMEST_RETURN_IF_ERROR(
      add("optimizer", "--optimizer", "--optimizers", !base.optimizer.empty(), flags.optimizers,
          [&](size_t i, EstimateFlags* f) { f->optimizer = flags.optimizers[i]; }));
  MEMEST_RETURN_IF_ERROR(add(
      "checkpoint", "--checkpoint", "--checkpoints", !base.checkpoint.empty(), flags.checkpoints,
      [&](size_t i, EstimateFlags* f) { f->checkpoint = flags.checkpoints[i]; }));
  int64_t count = 1;
  for (const Axis& a : axes) {
    const StatusOr<int64_t> more = CheckedMul(count, static_cast<int64_t>(a.labels.size()));
    count = more.ok() ? std::min(*more, kMaxSweepConfigs + 1) : kMaxSweepConfigs + 1;
  }
  if (count > kMaxSweepConfigs) {
    return InvalidArgument(lists + ": " + sizes + " values make more than " +
                           std::to_string(kMaxSweepConfigs) +
                           " configurations, more than a sweep takes");
  }
  SweepRequestAndLabels out;
  for (const Axis& a : axes) out.headers.push_back(a.header);
  std::vector<size_t> at(axes.size(), 0);
  for (int64_t n = 0; n < count; ++n) {
    EstimateFlags f = base;
    std::vector<std::string> values;
    for (size_t k = 0; k < axes.size(); ++k) {
      axes[k].set(at[k], &f);
      values.push_back(axes[k].labels[at[k]]);
    }
    if (n == 0) {  // the model, read once (a model file, a Hugging Face config)
      MEMEST_ASSIGN_OR_RETURN(v1::EstimateRequest first, BuildEstimateRequest(f));
      *out.request.mutable_model() = first.model();
      out.request.set_skip_advice(first.skip_advice());
      if (first.has_max_layer_rows()) out.request.set_max_layer_rows(first.max_layer_rows());
    }
    MEMEST_ASSIGN_OR_RETURN(*out.request.add_configs(), BuildRunConfig(f, out.request.model()));
    out.values.push_back(std::move(values));
    for (size_t k = axes.size(); k-- > 0;) {  // the last list fastest
      if (++at[k] < axes[k].labels.size()) break;
      at[k] = 0;
    }
  }
  return out;
}

}  // namespace memest::cli
