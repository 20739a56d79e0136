#include "engine/models/op_graph_batch.h"

#include <algorithm>
#include <vector>

namespace memest {
namespace {

std::string Str(int64_t v) { return std::to_string(v); }

}  // namespace

Status CheckUnscaledBatch(const OpGraphSpec& spec, int64_t micro_batch) {
  if (spec.traced_batch > 0) return Status::Ok();
  // The inputs fix the batch (a language model's target may be flattened to [B * T]); the
  // targets only when no input has a batch dim.
  auto batched = [](const TensorSpec& t, TensorRole role) {
    return t.role == role && t.batch_dim >= 0 && t.batch_dim < static_cast<int>(t.shape.size());
  };
  TensorRole role = TensorRole::kInput;
  if (std::none_of(spec.tensors.begin(), spec.tensors.end(),
                   [&](const TensorSpec& t) { return batched(t, TensorRole::kInput); })) {
    role = TensorRole::kTarget;
  }
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    const TensorSpec& t = spec.tensors[i];
    if (!batched(t, role)) continue;
    const int64_t batch = t.shape[t.batch_dim];
    if (batch == micro_batch) continue;
    return InvalidArgument(
        "config.batch_size: the micro-batch is " + Str(micro_batch) + ", but the model is an op "
        "graph written at batch " + Str(batch) + " (model.tensors[" + Str(i) + "] '" + t.name +
        "', shape " + ShapeToString(t.shape) + " along batch_dim " + Str(t.batch_dim) +
        ") and has no traced_batch to rescale it by: run it at micro-batch " + Str(batch) +
        ", or trace the model with memest.trace, which records traced_batch");
  }
  return Status::Ok();
}

StatusOr<Attrs> BatchScaledAttrs(const OpSpec& op, const std::string& field, int64_t traced_batch,
                                 int64_t micro_batch, bool rescale) {
  if (!HasAttr(op.attrs, "batch_dim")) return op.attrs;
  const std::string at = field + ".attrs.batch_dim";
  if (op.kind != "expand" && op.kind != "full") {
    return InvalidArgument(at + ": names the batch dim of expand's or full's shape; " + op.kind +
                           " takes none");
  }
  MEMEST_ASSIGN_OR_RETURN(int64_t dim, IntAttr(op.attrs, "batch_dim", 0, field));
  MEMEST_ASSIGN_OR_RETURN(std::vector<int64_t> shape, IntsAttr(op.attrs, "shape", {}, field));
  if (dim < 0 || dim >= static_cast<int64_t>(shape.size())) {
    return InvalidArgument(at + ": " + Str(dim) + " is not a dim of shape " + ShapeToString(shape));
  }
  if (traced_batch > 0 && shape[dim] != traced_batch) {
    return InvalidArgument(field + ".attrs.shape[" + Str(dim) + "]: the batch dim is " +
                           Str(shape[dim]) + ", but traced_batch is " + Str(traced_batch));
  }
  Attrs attrs = op.attrs;
  if (rescale) {
    shape[dim] = micro_batch;
    attrs["shape"] = shape;
  }
  return attrs;
}

}  // namespace memest
