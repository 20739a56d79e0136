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
  // One varying flag: its list's length and how it sets a configuration's flags.
  struct Axis {
    std::string name;
    size_t size;
    std::function<void(size_t, EstimateFlags*)> set;
    std::function<std::string(size_t)> label;
  };
  std::vector<Axis> axes;
  const EstimateFlags& base = flags.base;
  auto words = [&](const char* name, const std::vector<std::string>& list, bool single_given,
                   std::string EstimateFlags::*field) -> Status {
    if (list.empty()) return Status::Ok();
    if (single_given) {
      return InvalidArgument(std::string("--") + name + "s: give --" + name + " or --" + name +
                             "s, not both");
    }
    axes.push_back({name, list.size(),
                    [&list, field](size_t i, EstimateFlags* f) { f->*field = list[i]; },
                    [&list](size_t i) { return list[i]; }});
    return Status::Ok();
  };
  if (!flags.batches.empty()) {
    if (base.batch) return InvalidArgument("--batches: give --batch or --batches, not both");
    axes.push_back({"batch", flags.batches.size(),
                    [&](size_t i, EstimateFlags* f) { f->batch = flags.batches[i]; },
                    [&](size_t i) { return std::to_string(flags.batches[i]); }});
  }
  if (!flags.devices.empty()) {
    if (base.device) return InvalidArgument("--devices: give --device or --devices, not both");
    axes.push_back({"device", flags.devices.size(),
                    [&](size_t i, EstimateFlags* f) { f->device = flags.devices[i]; },
                    [&](size_t i) { return flags.devices[i]; }});
  }
  MEMEST_RETURN_IF_ERROR(
      words("precision", flags.precisions, !base.precision.empty(), &EstimateFlags::precision));
  MEMEST_RETURN_IF_ERROR(
      words("optimizer", flags.optimizers, !base.optimizer.empty(), &EstimateFlags::optimizer));
  MEMEST_RETURN_IF_ERROR(
      words("checkpoint", flags.checkpoints, !base.checkpoint.empty(), &EstimateFlags::checkpoint));
  int64_t count = 1;
  std::string lists, sizes;  // "--batches x --devices", "300 x 3"
  for (const Axis& a : axes) {
    lists += (lists.empty() ? "--" : " x --") + a.name + (a.name == "batch" ? "es" : "s");
    sizes += (sizes.empty() ? "" : " x ") + std::to_string(a.size);
    const StatusOr<int64_t> more = CheckedMul(count, static_cast<int64_t>(a.size));
    count = more.ok() ? std::min(*more, kMaxSweepConfigs + 1) : kMaxSweepConfigs + 1;
  }
  if (count > kMaxSweepConfigs) {
    return InvalidArgument(lists + ": " + sizes + " values make more than " +
                           std::to_string(kMaxSweepConfigs) +
                           " configurations, more than a sweep takes");
  }
  SweepRequestAndLabels out;
  for (const Axis& a : axes) out.headers.push_back(a.name);
  std::vector<size_t> at(axes.size(), 0);
  for (int64_t n = 0; n < count; ++n) {
    EstimateFlags f = base;
    std::vector<std::string> values;
    for (size_t k = 0; k < axes.size(); ++k) {
      axes[k].set(at[k], &f);
      values.push_back(axes[k].label(at[k]));
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
      if (++at[k] < axes[k].size) break;
      at[k] = 0;
    }
  }
  return out;
}

}  // namespace memest::cli
