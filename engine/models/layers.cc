#include "engine/models/layers.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "engine/models/layers_internal.h"

namespace memest {

using namespace layers_internal;  // NOLINT: the helpers every layer uses

int Linear(GraphBuilder& b, const LayerContext& c, std::string_view name, int x,
           int64_t out_features, bool bias) {
  if (!b.ok() || x < 0) return -1;
  const int64_t in = LastDim(b, x);
  ModuleScope scope(b, name);
  std::vector<int> inputs = {x, b.Parameter("weight", {out_features, in}, c.param_dtype)};
  if (bias) inputs.push_back(b.Parameter("bias", {out_features}, c.param_dtype));
  return b.Add1("linear", std::move(inputs));
}

int TiedLinear(GraphBuilder& b, std::string_view name, int x, int weight) {
  if (!b.ok() || x < 0) return -1;
  ModuleScope scope(b, name);
  return b.Add1("linear", {x, weight});
}

int HfConv1D(GraphBuilder& b, const LayerContext& c, std::string_view name, int x,
             int64_t out_features) {
  if (!b.ok() || x < 0) return -1;
  Shape out_shape = b.shape(x);
  const int64_t in = out_shape.empty() ? 0 : out_shape.back();
  if (!out_shape.empty()) out_shape.back() = out_features;
  ModuleScope scope(b, name);
  // HF Conv1D.forward: size_out = x.size()[:-1] + (nf,)
  //   x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight); x.view(size_out)
  int weight = b.Parameter("weight", {in, out_features}, c.param_dtype);
  int bias = b.Parameter("bias", {out_features}, c.param_dtype);
  int flat = b.Add1("view", {x}, {{"shape", Ints({-1, in})}});
  int y = b.Add1("addmm", {bias, flat, weight});
  return b.Add1("view", {y}, {{"shape", Ints(out_shape)}});
}

namespace {

int Conv(GraphBuilder& b, const LayerContext& c, std::string_view name, int x, const ConvOptions& o,
         int spatial_dims) {
  if (!ExpectRank(b, x, 2 + spatial_dims, spatial_dims == 2 ? "conv2d" : "conv1d")) return -1;
  const int64_t in = b.shape(x)[1];
  const int64_t groups = o.groups > 0 ? o.groups : 1;
  ModuleScope scope(b, name);
  Shape w_shape = {o.out_channels, in / groups};
  for (int i = 0; i < spatial_dims; ++i) w_shape.push_back(o.kernel_size);
  std::vector<int> inputs = {x, b.Parameter("weight", w_shape, c.param_dtype)};
  if (o.bias) inputs.push_back(b.Parameter("bias", {o.out_channels}, c.param_dtype));
  return b.Add1(spatial_dims == 2 ? "conv2d" : "conv1d", std::move(inputs),
                {{"stride", Int(o.stride)},
                 {"padding", Int(o.padding)},
                 {"dilation", Int(o.dilation)},
                 {"groups", Int(groups)}});
}

}  // namespace

int Conv2d(GraphBuilder& b, const LayerContext& c, std::string_view name, int x,
           const ConvOptions& options) {
  return Conv(b, c, name, x, options, 2);
}

int Conv1d(GraphBuilder& b, const LayerContext& c, std::string_view name, int x,
           const ConvOptions& options) {
  return Conv(b, c, name, x, options, 1);
}

int LayerNorm(GraphBuilder& b, const LayerContext& c, std::string_view name, int x, bool affine) {
  if (!b.ok() || x < 0) return -1;
  const int64_t dim = LastDim(b, x);
  ModuleScope scope(b, name);
  std::vector<int> inputs = {x};
  if (affine) {
    inputs.push_back(b.Parameter("weight", {dim}, c.param_dtype));
    inputs.push_back(b.Parameter("bias", {dim}, c.param_dtype));
  }
  return b.Add1("layer_norm", std::move(inputs), {{"normalized_ndim", Int(1)}});
}

int RmsNorm(GraphBuilder& b, const LayerContext& c, std::string_view name, int x, bool upcast) {
  if (!b.ok() || x < 0) return -1;
  const int64_t dim = LastDim(b, x);
  ModuleScope scope(b, name);
  int weight = b.Parameter("weight", {dim}, c.param_dtype);
  return b.Add1("rms_norm", {x, weight}, {{"upcast", Int(upcast ? 1 : 0)}});
}

int GemmaRmsNorm(GraphBuilder& b, const LayerContext& c, std::string_view name, int x) {
  if (!b.ok() || x < 0) return -1;
  const int64_t dim = LastDim(b, x);
  const std::string dtype(DTypeName(b.tensor(x).dtype));
  ModuleScope scope(b, name);
  int weight = b.Parameter("weight", {dim}, c.param_dtype);
  // output = self._norm(x.float()); output * (1.0 + self.weight.float()); .type_as(x), with
  // _norm(x) = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps).
  int xf = b.Add1("to", {x}, {{"dtype", std::string("float32")}});
  int sq = b.Add1("pow", {xf}, {{"exponent", Float(2.0)}});
  int mean = b.Add1("mean", {sq}, {{"dim", Ints({-1})}, {"keepdim", Int(1)}});
  int rstd = b.Add1("rsqrt", {b.Add1("add", {mean}, {{"scalar", Float(1e-6)}})});
  int normed = b.Add1("mul", {xf, rstd});
  int wf = b.Add1("to", {weight}, {{"dtype", std::string("float32")}});
  int scaled = b.Add1("mul", {normed, b.Add1("add", {wf}, {{"scalar", Float(1.0)}})});
  return b.Add1("to", {scaled}, {{"dtype", dtype}});
}

int BatchNorm(GraphBuilder& b, const LayerContext& c, std::string_view name, int x, bool affine) {
  if (!b.ok() || x < 0) return -1;
  const Shape& s = b.shape(x);
  if (s.size() < 2) {
    b.Fail(
        InvalidArgument("batch_norm: expects an input [N, C, ...], got shape " + ShapeToString(s)));
    return -1;
  }
  const int64_t channels = s[1];
  ModuleScope scope(b, name);
  int weight = affine ? b.Parameter("weight", {channels}, c.param_dtype) : -1;
  int bias = affine ? b.Parameter("bias", {channels}, c.param_dtype) : -1;
  int mean = b.Buffer("running_mean", {channels}, c.param_dtype);
  int var = b.Buffer("running_var", {channels}, c.param_dtype);
  b.Buffer("num_batches_tracked", {}, DType::kInt64);
  if (!affine) return b.Add1("batch_norm", {x});  // no running stats without weight slots
  return b.Add1("batch_norm", {x, weight, bias, mean, var});
}

int GroupNorm(GraphBuilder& b, const LayerContext& c, std::string_view name, int x,
              int64_t num_groups, bool affine) {
  if (!b.ok() || x < 0) return -1;
  const Shape& s = b.shape(x);
  const int64_t channels = s.size() >= 2 ? s[1] : 0;
  ModuleScope scope(b, name);
  std::vector<int> inputs = {x};
  if (affine) {
    inputs.push_back(b.Parameter("weight", {channels}, c.param_dtype));
    inputs.push_back(b.Parameter("bias", {channels}, c.param_dtype));
  }
  return b.Add1("group_norm", std::move(inputs), {{"num_groups", Int(num_groups)}});
}

int Dropout(GraphBuilder& b, const LayerContext& c, int x, double p) {
  if (!b.ok() || x < 0) return -1;
  if (!c.training() || p == 0.0) return x;
  return b.Add1("dropout", {x}, {{"p", Float(p)}});
}

int Activate(GraphBuilder& b, int x, Activation act) {
  if (!b.ok() || x < 0) return -1;
  switch (act) {
    case Activation::kRelu:
      return b.Add1("relu", {x});
    case Activation::kReluInplace:
      return b.Add1("relu", {x}, {{"inplace", Int(1)}});
    case Activation::kGelu:
      return b.Add1("gelu", {x});
    case Activation::kGeluTanh:
      return b.Add1("gelu", {x}, {{"approximate", std::string("tanh")}});
    case Activation::kGeluNew: {
      // 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) *
      //                                  (input + 0.044715 * torch.pow(input, 3.0))))
      // evaluated left to right as Python does.
      int half = b.Add1("mul", {x}, {{"scalar", Float(0.5)}});
      int cube = b.Add1("pow", {x}, {{"exponent", Float(3.0)}});
      int scaled = b.Add1("mul", {cube}, {{"scalar", Float(0.044715)}});
      int inner = b.Add1("add", {x, scaled});
      int arg = b.Add1("mul", {inner}, {{"scalar", Float(std::sqrt(2.0 / kPi))}});
      int th = b.Add1("tanh", {arg});
      int one_plus = b.Add1("add", {th}, {{"scalar", Float(1.0)}});
      return b.Add1("mul", {half, one_plus});
    }
    case Activation::kSilu:
      return b.Add1("silu", {x});
    case Activation::kSwish: {
      int s = b.Add1("sigmoid", {x});
      return b.Add1("mul", {x, s});
    }
    case Activation::kSigmoid:
      return b.Add1("sigmoid", {x});
    case Activation::kTanh:
      return b.Add1("tanh", {x});
  }
  return -1;
}

int Mlp(GraphBuilder& b, const LayerContext& c, std::string_view name, int x, const MlpOptions& o) {
  if (!b.ok() || x < 0) return -1;
  const int64_t out = o.out_features > 0 ? o.out_features : LastDim(b, x);
  ModuleScope scope(b, name);
  int h = Linear(b, c, "fc1", x, o.hidden, o.bias);
  {
    ModuleScope act(b, "act");
    h = Activate(b, h, o.activation);
  }
  h = Linear(b, c, "fc2", h, out, o.bias);
  return Dropout(b, c, h, o.dropout);
}

int CrossEntropyLoss(GraphBuilder& b, int logits, bool upcast) {
  if (!b.ok() || logits < 0) return -1;
  const Shape shape = b.shape(logits);
  Shape target_shape(shape.begin(), shape.end() - 1);
  b.BeginLoss();
  int labels = b.Target("labels", target_shape, DType::kInt64, 0);
  if (upcast) logits = b.Add1("to", {logits}, {{"dtype", std::string("float32")}});
  if (shape.size() != 2) {
    logits = b.Add1("view", {logits}, {{"shape", AttrInts({-1, shape.back()})}});
    labels = b.Add1("view", {labels}, {{"shape", AttrInts({-1})}});
  }
  const int loss = b.Add1("cross_entropy", {logits, labels});
  b.SetLoss(loss);
  return loss;
}

int Embedding(GraphBuilder& b, const LayerContext& c, std::string_view name, int ids,
              int64_t num_embeddings, int64_t embedding_dim, int* weight_out) {
  if (!b.ok() || ids < 0) return -1;
  ModuleScope scope(b, name);
  int weight = b.Parameter("weight", {num_embeddings, embedding_dim}, c.param_dtype);
  if (weight_out != nullptr) *weight_out = weight;
  return b.Add1("embedding", {weight, ids});
}

}  // namespace memest
