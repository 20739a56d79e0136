// The layer-model front end: ExpandLayer turns one LayerSpec of a sequential model
// (engine/models/model.h) into ops, through the layer helpers of engine/models/layers.h,
// checking its attributes and naming every bad field as model.layers[i].attrs.<name>.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "engine/ir/text.h"
#include "engine/models/layers.h"

namespace memest {

namespace {

struct KindAttrs {
  const char* kind;
  std::vector<std::string> attrs;
};

const std::vector<KindAttrs>& KindTable() {
  static const auto* table = new std::vector<KindAttrs>{
      {"adaptive_avg_pool2d", {"output_size"}},
      {"attention", {"heads", "kv_heads", "causal", "dropout", "bias", "scale_qk"}},
      {"avg_pool2d", {"kernel_size", "stride", "padding"}},
      {"batch_norm", {"affine"}},
      {"conv1d",
       {"out_channels", "in_channels", "kernel_size", "stride", "padding", "dilation", "groups",
        "bias"}},
      {"conv2d",
       {"out_channels", "in_channels", "kernel_size", "stride", "padding", "dilation", "groups",
        "bias"}},
      {"dropout", {"p"}},
      {"embedding", {"num_embeddings", "embedding_dim"}},
      {"flatten", {"start_dim", "end_dim"}},
      {"gelu", {"approximate"}},
      {"group_norm", {"num_groups", "affine"}},
      {"layer_norm", {"affine"}},
      {"linear", {"out_features", "in_features", "bias"}},
      {"max_pool2d", {"kernel_size", "stride", "padding"}},
      {"mlp", {"hidden", "out_features", "activation", "bias", "dropout"}},
      {"relu", {"inplace"}},
      {"rms_norm", {"upcast"}},
      {"sigmoid", {}},
      {"silu", {}},
      {"softmax", {"dim"}},
      {"swish", {}},
      {"tanh", {}},
      {"transformer_block", {"heads", "style", "ffn", "kv_heads", "causal", "dropout"}},
  };
  return *table;
}

std::string Join(const std::vector<std::string>& items) {
  std::string s;
  for (const std::string& item : items) s += (s.empty() ? "" : ", ") + item;
  return s;
}

// Reads the attributes of one layer; the first error sticks and names the attribute.
class AttrReader {
 public:
  AttrReader(const Attrs& attrs, const std::string& field) : attrs_(attrs), field_(field) {}

  // Sizes, counts and window geometry of a layer are at most 2^31 - 1 (no PyTorch kernel takes
  // more), which keeps the products the layers form of them within 64 bits.
  static constexpr int64_t kMaxValue = (int64_t{1} << 31) - 1;

  const Status& status() const { return status_; }
  std::string Field(std::string_view name) const { return field_ + ".attrs." + std::string(name); }
  void Error(std::string_view name, const std::string& message) {
    if (status_.ok()) status_ = InvalidArgument(Field(name) + ": " + message);
  }

  int64_t AttrInt(std::string_view name, int64_t fallback) {
    StatusOr<int64_t> v = IntAttr(attrs_, name, fallback, field_);
    if (!v.ok()) {
      if (status_.ok()) status_ = v.status();
      return fallback;
    }
    return *v;
  }
  // A positive integer; required when `fallback` is 0.
  int64_t Positive(std::string_view name, int64_t fallback = 0) {
    if (fallback == 0 && !HasAttr(attrs_, name)) {
      Error(name, "required");
      return 1;
    }
    int64_t v = AttrInt(name, fallback);
    if (v <= 0) {
      Error(name, "must be positive, got " + std::to_string(v));
      return 1;
    }
    return AtMostMax(name, v, 1);
  }
  int64_t NonNegative(std::string_view name, int64_t fallback) {
    int64_t v = AttrInt(name, fallback);
    if (v < 0) {
      Error(name, "must be non-negative, got " + std::to_string(v));
      return 0;
    }
    return AtMostMax(name, v, 0);
  }
  bool Flag(std::string_view name, bool fallback) {
    int64_t v = AttrInt(name, fallback ? 1 : 0);
    if (v != 0 && v != 1) Error(name, "must be 0 or 1, got " + std::to_string(v));
    return v == 1;
  }
  int64_t AtMostMax(std::string_view name, int64_t v, int64_t fallback) {
    if (v <= kMaxValue) return v;
    Error(name, "must be at most " + std::to_string(kMaxValue) + ", got " + std::to_string(v));
    return fallback;
  }
  double Probability(std::string_view name, double fallback) {
    StatusOr<double> v = FloatAttr(attrs_, name, fallback, field_);
    if (!v.ok()) {
      if (status_.ok()) status_ = v.status();
      return fallback;
    }
    if (*v < 0.0 || *v >= 1.0) {
      Error(name, "must be in [0, 1), got " + std::to_string(*v));
      return fallback;
    }
    return *v;
  }
  std::string OneOf(std::string_view name, const std::string& fallback,
                    const std::vector<std::string>& allowed) {
    StatusOr<std::string> v = StringAttr(attrs_, name, fallback, field_);
    if (!v.ok()) {
      if (status_.ok()) status_ = v.status();
      return fallback;
    }
    for (const std::string& a : allowed) {
      if (*v == a) return *v;
    }
    Error(name, "must be one of " + Join(allowed) + ", got " + Quote(*v));
    return fallback;
  }

 private:
  const Attrs& attrs_;
  const std::string& field_;
  Status status_;
};

// Validates a dim attribute against `rank` and returns it normalized.
int64_t DimAttr(AttrReader& r, std::string_view name, int64_t fallback, size_t rank) {
  const int64_t dim = r.AttrInt(name, fallback);
  const int64_t n = static_cast<int64_t>(rank);
  if (dim < -n || dim >= n) {
    r.Error(name, "out of range for an input of rank " + std::to_string(rank) + ", got " +
                      std::to_string(dim));
    return 0;
  }
  return dim < 0 ? dim + n : dim;
}

Activation ParseActivation(const std::string& name) {
  if (name == "relu") return Activation::kRelu;
  if (name == "gelu_tanh") return Activation::kGeluTanh;
  if (name == "silu") return Activation::kSilu;
  if (name == "swish") return Activation::kSwish;
  return Activation::kGelu;
}

// The layers whose expansion takes a few lines; each returns the output or an error.
StatusOr<int> ExpandConv(GraphBuilder& b, int x, const LayerSpec& spec, const LayerContext& c,
                         const std::string& field, AttrReader& r) {
  const size_t spatial = spec.kind == "conv2d" ? 2 : 1;
  const Shape& in = b.shape(x);
  ConvOptions o;
  o.out_channels = r.Positive("out_channels");
  o.kernel_size = r.Positive("kernel_size");
  o.stride = r.Positive("stride", 1);
  o.padding = r.NonNegative("padding", 0);
  o.dilation = r.Positive("dilation", 1);
  o.groups = r.Positive("groups", 1);
  o.bias = r.Flag("bias", true);
  const int64_t in_channels = r.AttrInt("in_channels", 0);
  MEMEST_RETURN_IF_ERROR(r.status());
  if (in.size() != 2 + spatial) {
    return InvalidArgument(field + ": " + spec.kind + " expects an input " +
                           (spatial == 2 ? "[N, C, H, W]" : "[N, C, L]") + ", got shape " +
                           ShapeToString(in));
  }
  if (in_channels != 0 && in_channels != in[1]) {
    return InvalidArgument(r.Field("in_channels") + ": must match the input's channels " +
                           std::to_string(in[1]) + ", got " + std::to_string(in_channels));
  }
  if (in[1] % o.groups != 0 || o.out_channels % o.groups != 0) {
    return InvalidArgument(r.Field("groups") + ": must divide the input's " +
                           std::to_string(in[1]) + " channels and out_channels " +
                           std::to_string(o.out_channels) + ", got " + std::to_string(o.groups));
  }
  for (size_t i = 2; i < in.size(); ++i) {
    if (in[i] + 2 * o.padding < o.dilation * (o.kernel_size - 1) + 1) {
      return InvalidArgument(r.Field("kernel_size") + ": " + std::to_string(o.kernel_size) +
                             " (dilated) is larger than the padded input " + ShapeToString(in));
    }
  }
  return spatial == 2 ? Conv2d(b, c, "", x, o) : Conv1d(b, c, "", x, o);
}

StatusOr<int> ExpandPool(GraphBuilder& b, int x, const LayerSpec& spec, const std::string& field,
                         AttrReader& r) {
  const Shape& in = b.shape(x);
  const int64_t kernel = r.Positive("kernel_size");
  const int64_t stride = r.Positive("stride", kernel);
  const int64_t padding = r.NonNegative("padding", 0);
  MEMEST_RETURN_IF_ERROR(r.status());
  if (in.size() != 4) {
    return InvalidArgument(field + ": " + spec.kind + " expects an input [N, C, H, W], got shape " +
                           ShapeToString(in));
  }
  if (2 * padding > kernel) {
    return InvalidArgument(r.Field("padding") + ": must be at most half the kernel size " +
                           std::to_string(kernel) + ", got " + std::to_string(padding));
  }
  if (in[2] + 2 * padding < kernel || in[3] + 2 * padding < kernel) {
    return InvalidArgument(r.Field("kernel_size") + ": " + std::to_string(kernel) +
                           " is larger than the padded input " + ShapeToString(in));
  }
  Attrs attrs = {
      {"kernel_size", AttrInt(kernel)}, {"stride", AttrInt(stride)}, {"padding", AttrInt(padding)}};
  std::vector<int> outs = b.Add(spec.kind, {x}, std::move(attrs));
  return outs.empty() ? -1 : outs[0];
}

StatusOr<int> ExpandAttention(GraphBuilder& b, int x, const LayerSpec& spec, const LayerContext& c,
                              const std::string& field, AttrReader& r) {
  const Shape& in = b.shape(x);
  const bool block = spec.kind == "transformer_block";
  const int64_t heads = r.Positive("heads");
  const std::string style = block ? r.OneOf("style", "gpt2", {"gpt2", "llama"}) : "";
  const int64_t kv_heads = r.Positive("kv_heads", heads);
  const bool causal = r.Flag("causal", block);
  const double dropout = r.Probability("dropout", 0.0);
  MEMEST_RETURN_IF_ERROR(r.status());
  if (in.size() != 3) {
    return InvalidArgument(field + ": " + spec.kind +
                           " expects an input [N, T, d_model], got shape " + ShapeToString(in));
  }
  const int64_t d = in[2];
  if (d % heads != 0) {
    return InvalidArgument(r.Field("heads") + ": must divide d_model " + std::to_string(d) +
                           ", got " + std::to_string(heads));
  }
  if (heads % kv_heads != 0 || (style == "gpt2" && kv_heads != heads)) {
    return InvalidArgument(r.Field("kv_heads") + ": must divide heads " + std::to_string(heads) +
                           (style == "gpt2" ? " and equal it in the gpt2 style" : "") + ", got " +
                           std::to_string(kv_heads));
  }
  if (!block) {
    AttentionOptions o;
    o.heads = heads;
    o.kv_heads = kv_heads;
    o.causal = causal;
    o.attn_dropout = dropout;
    o.bias = r.Flag("bias", true);
    o.scale = r.Flag("scale_qk", false) ? AttentionScale::kScaleQK : AttentionScale::kDivideScores;
    MEMEST_RETURN_IF_ERROR(r.status());
    return Attention(b, c, "", x, o);
  }
  BlockOptions o;
  o.style = style == "llama" ? BlockStyle::kLlama : BlockStyle::kGpt2;
  o.heads = heads;
  o.kv_heads = kv_heads;
  o.causal = causal;
  o.dropout = dropout;
  // Llama's default: int(8d/3) rounded up to a multiple of 256 (11008 for d = 4096).
  const int64_t llama_ffn = (8 * d / 3 + 255) / 256 * 256;
  o.ffn = r.Positive("ffn", o.style == BlockStyle::kLlama ? llama_ffn : 4 * d);
  MEMEST_RETURN_IF_ERROR(r.status());
  return TransformerBlock(b, c, "", x, o);
}

StatusOr<int> ExpandSimple(GraphBuilder& b, int x, const LayerSpec& spec, const LayerContext& c,
                           const std::string& field, AttrReader& r) {
  const std::string& kind = spec.kind;
  const Shape& in = b.shape(x);
  auto need_rank = [&](size_t lo, const char* what) -> Status {
    if (in.size() >= lo) return Status::Ok();
    return InvalidArgument(field + ": " + kind + " expects an input " + what + ", got shape " +
                           ShapeToString(in));
  };
  if (kind == "linear") {
    const int64_t out = r.Positive("out_features");
    const bool bias = r.Flag("bias", true);
    const int64_t in_features = r.AttrInt("in_features", 0);
    MEMEST_RETURN_IF_ERROR(r.status());
    MEMEST_RETURN_IF_ERROR(need_rank(1, "[.., in_features]"));
    if (in_features != 0 && in_features != in.back()) {
      return InvalidArgument(r.Field("in_features") + ": must match the input's last dim " +
                             std::to_string(in.back()) + ", got " + std::to_string(in_features));
    }
    return Linear(b, c, "", x, out, bias);
  }
  if (kind == "mlp") {
    MlpOptions o;
    o.hidden = r.Positive("hidden");
    o.out_features = r.Positive("out_features", in.empty() ? 1 : std::max<int64_t>(in.back(), 1));
    o.activation = ParseActivation(
        r.OneOf("activation", "gelu", {"relu", "gelu", "gelu_tanh", "silu", "swish"}));
    o.bias = r.Flag("bias", true);
    o.dropout = r.Probability("dropout", 0.0);
    MEMEST_RETURN_IF_ERROR(r.status());
    MEMEST_RETURN_IF_ERROR(need_rank(1, "[.., features]"));
    return Mlp(b, c, "", x, o);
  }
  if (kind == "layer_norm" || kind == "rms_norm") {
    const bool flag = kind == "layer_norm" ? r.Flag("affine", true) : r.Flag("upcast", false);
    MEMEST_RETURN_IF_ERROR(r.status());
    MEMEST_RETURN_IF_ERROR(need_rank(1, "[.., features]"));
    return kind == "layer_norm" ? LayerNorm(b, c, "", x, flag) : RmsNorm(b, c, "", x, flag);
  }
  if (kind == "batch_norm" || kind == "group_norm") {
    const int64_t groups = kind == "group_norm" ? r.Positive("num_groups") : 1;
    const bool affine = r.Flag("affine", true);
    MEMEST_RETURN_IF_ERROR(r.status());
    MEMEST_RETURN_IF_ERROR(need_rank(2, "[N, C, ...]"));
    if (kind == "batch_norm") return BatchNorm(b, c, "", x, affine);
    if (in[1] % groups != 0) {
      return InvalidArgument(r.Field("num_groups") + ": must divide the input's " +
                             std::to_string(in[1]) + " channels, got " + std::to_string(groups));
    }
    return GroupNorm(b, c, "", x, groups, affine);
  }
  if (kind == "relu") {
    const bool inplace = r.Flag("inplace", false);
    MEMEST_RETURN_IF_ERROR(r.status());
    return Activate(b, x, inplace ? Activation::kReluInplace : Activation::kRelu);
  }
  if (kind == "gelu") {
    const std::string approx = r.OneOf("approximate", "none", {"none", "tanh"});
    MEMEST_RETURN_IF_ERROR(r.status());
    return Activate(b, x, approx == "tanh" ? Activation::kGeluTanh : Activation::kGelu);
  }
  if (kind == "silu") return Activate(b, x, Activation::kSilu);
  if (kind == "swish") return Activate(b, x, Activation::kSwish);
  if (kind == "sigmoid") return Activate(b, x, Activation::kSigmoid);
  if (kind == "tanh") return Activate(b, x, Activation::kTanh);
  if (kind == "softmax") {
    const int64_t dim = DimAttr(r, "dim", -1, in.size());
    MEMEST_RETURN_IF_ERROR(r.status());
    return b.Add1("softmax", {x}, {{"dim", AttrInt(dim)}});
  }
  if (kind == "dropout") {
    const double p = r.Probability("p", 0.5);
    MEMEST_RETURN_IF_ERROR(r.status());
    return Dropout(b, c, x, p);
  }
  if (kind == "adaptive_avg_pool2d") {
    const int64_t size = r.Positive("output_size", 1);
    MEMEST_RETURN_IF_ERROR(r.status());
    if (in.size() != 4) {
      return InvalidArgument(field +
                             ": adaptive_avg_pool2d expects an input [N, C, H, W], got shape " +
                             ShapeToString(in));
    }
    return b.Add1("adaptive_avg_pool2d", {x}, {{"output_size", AttrInts({size, size})}});
  }
  if (kind == "flatten") {
    const int64_t start = DimAttr(r, "start_dim", 1, in.size());
    const int64_t end = DimAttr(r, "end_dim", -1, in.size());
    MEMEST_RETURN_IF_ERROR(r.status());
    if (start > end) {
      return InvalidArgument(r.Field("start_dim") + ": must not come after end_dim");
    }
    return b.Add1("flatten", {x}, {{"start_dim", AttrInt(start)}, {"end_dim", AttrInt(end)}});
  }
  if (kind == "embedding") {
    const int64_t num = r.Positive("num_embeddings");
    const int64_t dim = r.Positive("embedding_dim");
    MEMEST_RETURN_IF_ERROR(r.status());
    if (IsFloating(b.tensor(x).dtype)) {
      return InvalidArgument(field +
                             ": embedding expects integer indices (set "
                             "model.input_dtype to int64), got " +
                             std::string(DTypeName(b.tensor(x).dtype)));
    }
    return Embedding(b, c, "", x, num, dim);
  }
  return Internal(field + ".kind: " + Quote(kind) + " has no expansion");
}

}  // namespace

const std::vector<std::string>& LayerKinds() {
  static const auto* kinds = [] {
    auto* v = new std::vector<std::string>();
    for (const KindAttrs& k : KindTable()) v->push_back(k.kind);
    return v;
  }();
  return *kinds;
}

StatusOr<int> ExpandLayer(GraphBuilder& b, int x, const LayerSpec& spec, const LayerContext& c,
                          const std::string& field) {
  if (!b.ok()) return b.status();
  if (x < 0) return Internal(field + ": no input tensor");
  const KindAttrs* info = nullptr;
  for (const KindAttrs& k : KindTable()) {
    if (spec.kind == k.kind) info = &k;
  }
  if (info == nullptr) {
    return InvalidArgument(field + ".kind: unknown layer kind " + Quote(spec.kind) +
                           "; known kinds: " + Join(LayerKinds()));
  }
  for (const auto& [name, value] : spec.attrs) {
    bool known = false;
    for (const std::string& a : info->attrs) known |= (a == name);
    if (!known) {
      return InvalidArgument(
          field + ".attrs." + Escape(name) + ": not an attribute of " + spec.kind +
          (info->attrs.empty() ? " (it takes none)" : "; known: " + Join(info->attrs)));
    }
    // A shape too large to count in bytes names the attribute its size came from.
    if (const auto* i = std::get_if<int64_t>(&value)) b.NameSize(*i, field + ".attrs." + name);
  }
  AttrReader r(spec.attrs, field);
  StatusOr<int> y = [&]() -> StatusOr<int> {
    if (spec.kind == "conv1d" || spec.kind == "conv2d") return ExpandConv(b, x, spec, c, field, r);
    if (spec.kind == "max_pool2d" || spec.kind == "avg_pool2d") {
      return ExpandPool(b, x, spec, field, r);
    }
    if (spec.kind == "attention" || spec.kind == "transformer_block") {
      return ExpandAttention(b, x, spec, c, field, r);
    }
    return ExpandSimple(b, x, spec, c, field, r);
  }();
  if (!y.ok()) return y;
  if (!b.ok()) return b.status();
  if (*y < 0) return Internal(field + ": layer produced no output");
  return y;
}

}  // namespace memest
