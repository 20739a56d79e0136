// The preset registry. Each preset is a family builder (GPT-2, Llama, BERT, ViT, ResNet, the
// diffusion UNet down-path, a plain MLP) and the defaults of its parameters. The builders write
// what the PyTorch / Hugging Face module runs, op by op, under its module names, so reports and
// checkpoint scopes read like the model's own state_dict.
#include "engine/models/presets.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "engine/ir/text.h"
#include "engine/models/decoders.h"
#include "engine/models/encoders.h"
#include "engine/models/layers.h"
#include "engine/models/op_count.h"
#include "engine/models/repeat_blocks.h"

namespace memest {
namespace {

using Values = std::map<std::string, int64_t>;
using BuildFn = Status (*)(GraphBuilder& b, const BuildContext& ctx, const Values& v);

struct Preset {
  PresetInfo info;
  BuildFn build;
};

std::string Str(int64_t v) { return std::to_string(v); }

std::string ParamField(const std::string& name) { return "model.preset.params." + name; }

// "<param>: must divide <what> <n>, got <v>" style errors.
Status ParamError(const std::string& name, const std::string& message) {
  return InvalidArgument(ParamField(name) + ": " + message);
}

LayerContext Layers(const BuildContext& ctx) { return LayerContextOf(ctx); }
bool Training(const BuildContext& ctx) { return ctx.mode == Mode::kTraining; }

// ---------------------------------------------------------------------------------------------
// Decoders (engine/models/decoders.h): GPT-2 and Llama-2.

std::string PresetField(const char* name) { return ParamField(name); }

// The decoders run as their Hugging Face configs set them: with use_cache.
BuildContext Cached(const BuildContext& ctx) {
  BuildContext cached = ctx;
  cached.use_cache = true;
  return cached;
}

Status BuildGpt2(GraphBuilder& b, const BuildContext& ctx, const Values& v) {
  Gpt2Spec s;
  s.seq = v.at("seq");
  s.layers = v.at("layers");
  s.d_model = v.at("d_model");
  s.heads = v.at("heads");
  s.vocab = v.at("vocab");
  // n_positions is 1024 for every GPT-2; a longer sequence grows the position table.
  s.positions = std::max<int64_t>(1024, s.seq);
  return BuildGpt2Model(b, Cached(ctx), s, PresetField);
}

Status BuildLlama(GraphBuilder& b, const BuildContext& ctx, const Values& v) {
  LlamaSpec s;
  s.seq = v.at("seq");
  s.layers = v.at("layers");
  s.d_model = v.at("d_model");
  s.heads = v.at("heads");
  s.kv_heads = v.at("kv_heads");
  s.ffn = v.at("ffn");
  s.vocab = v.at("vocab");
  return BuildLlamaModel(b, Cached(ctx), s, PresetField);
}

// ---------------------------------------------------------------------------------------------
// Encoders: BERT (HF BertForMaskedLM) and ViT-B/16 (torchvision vit_b_16).

Status BuildBert(GraphBuilder& b, const BuildContext& ctx, const Values& v) {
  BertSpec s;  // BERT base's other fields (engine/models/encoders.h)
  s.seq = v.at("seq");
  s.layers = v.at("layers");
  s.d_model = v.at("d_model");
  s.heads = v.at("heads");
  s.vocab = v.at("vocab");
  if (s.d_model > std::numeric_limits<int64_t>::max() / 4) {
    return ParamError("d_model", "too large for its 4 * d_model FFN, got " + Str(s.d_model));
  }
  s.ffn = 4 * s.d_model;
  return BuildBertModel(b, ctx, s, PresetField);
}

Status BuildVit(GraphBuilder& b, const BuildContext& ctx, const Values& v) {
  const int64_t image = v.at("image"), patch = v.at("patch"), layers = v.at("layers");
  const int64_t d = v.at("d_model"), heads = v.at("heads"), classes = v.at("classes");
  if (image % patch != 0) {
    return ParamError("patch", "must divide image " + Str(image) + ", got " + Str(patch));
  }
  if (d % heads != 0)
    return ParamError("heads", "must divide d_model " + Str(d) + ", got " + Str(heads));
  const LayerContext c = Layers(ctx);
  const int64_t n = ctx.micro_batch;
  const int64_t grid = image / patch;
  const int64_t tokens = grid * grid + 1;
  int x = b.Input("images", {n, 3, image, image}, ctx.param_dtype, 0);
  // _process_input: conv_proj, reshape(n, d, g*g), permute(0, 2, 1).
  ConvOptions proj{d, patch, patch, 0, 1, 1, true};
  x = Conv2d(b, c, "conv_proj", x, proj);
  x = b.Add1("reshape", {x}, {{"shape", AttrInts({n, d, grid * grid})}});
  x = b.Add1("permute", {x}, {{"dims", AttrInts({0, 2, 1})}});
  int cls_token = b.Parameter("class_token", {1, 1, d}, c.param_dtype);
  int cls = b.Add1("expand", {cls_token}, {{"shape", AttrInts({n, -1, -1})}});
  x = b.Add1("cat", {cls, x}, {{"dim", AttrInt(1)}});
  {
    ScopeGuard encoder(b, "encoder");
    int pos = b.Parameter("pos_embedding", {1, tokens, d}, c.param_dtype);
    x = b.Add1("add", {x, pos});  // dropout(p=0.0) is the identity
    AttentionOptions a;
    a.heads = heads;
    a.projection = AttentionProjection::kFusedLinear;
    a.scale = AttentionScale::kDivideScores;
    auto layer = [&](int64_t, int x) {
      int h = LayerNorm(b, c, "ln_1", x);
      h = Attention(b, c, "self_attention", h, a);
      x = b.Add1("add", {h, x});
      h = LayerNorm(b, c, "ln_2", x);
      {
        ScopeGuard mlp(b, "mlp");
        h = Linear(b, c, "0", h, 4 * d);
        {
          ScopeGuard act(b, "1");
          h = Activate(b, h, Activation::kGelu);
        }
        h = Linear(b, c, "3", h, d);
      }
      return b.Add1("add", {x, h});
    };
    x = RepeatBlocks(b, "layers.encoder_layer_", layers, x, layer, AllAlike);
    x = LayerNorm(b, c, "ln", x);
  }
  // x[:, 0]: the class token.
  x = b.Add1("slice", {x}, {{"dim", AttrInt(1)}, {"start", AttrInt(0)}, {"end", AttrInt(1)}});
  x = b.Add1("squeeze", {x}, {{"dim", AttrInt(1)}});
  int logits = Linear(b, c, "heads.head", x, classes);
  if (Training(ctx)) CrossEntropyLoss(b, logits, /*upcast=*/false);
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Convolutional: torchvision ResNet-18/50 and the diffusion UNet down-path of seed 001.

int ConvBn(GraphBuilder& b, const LayerContext& c, int x, const std::string& index, int64_t out,
           int64_t kernel, int64_t stride, bool relu) {
  x = Conv2d(b, c, "conv" + index, x, ConvOptions{out, kernel, stride, kernel / 2, 1, 1, false});
  x = BatchNorm(b, c, "bn" + index, x);
  if (!relu) return x;
  ScopeGuard scope(b, "relu");
  return Activate(b, x, Activation::kReluInplace);
}

// torchvision BasicBlock (expansion 1) or Bottleneck (expansion 4, stride on the 3x3 conv).
int ResidualBlock(GraphBuilder& b, const LayerContext& c, int x, int64_t planes, int64_t stride,
                  bool bottleneck) {
  if (!b.ok() || x < 0) return -1;
  const int64_t in = b.shape(x)[1];
  const int64_t out_channels = bottleneck ? planes * 4 : planes;
  int identity = x;
  int out = -1;
  if (bottleneck) {
    out = ConvBn(b, c, x, "1", planes, 1, 1, true);
    out = ConvBn(b, c, out, "2", planes, 3, stride, true);
    out = ConvBn(b, c, out, "3", out_channels, 1, 1, false);
  } else {
    out = ConvBn(b, c, x, "1", planes, 3, stride, true);
    out = ConvBn(b, c, out, "2", planes, 3, 1, false);
  }
  if (stride != 1 || in != out_channels) {
    ScopeGuard downsample(b, "downsample");
    identity = Conv2d(b, c, "0", x, ConvOptions{out_channels, 1, stride, 0, 1, 1, false});
    identity = BatchNorm(b, c, "1", identity);
  }
  out = b.Add1("add_", {out, identity});  // out += identity
  ScopeGuard scope(b, "relu");
  return Activate(b, out, Activation::kReluInplace);
}

Status BuildResnet(GraphBuilder& b, const BuildContext& ctx, const Values& v, bool bottleneck,
                   const std::vector<int64_t>& depths) {
  const int64_t image = v.at("image"), classes = v.at("classes");
  if (image < 32) return ParamError("image", "must be at least 32, got " + Str(image));
  const LayerContext c = Layers(ctx);
  int x = b.Input("images", {ctx.micro_batch, 3, image, image}, ctx.param_dtype, 0);
  x = Conv2d(b, c, "conv1", x, ConvOptions{64, 7, 2, 3, 1, 1, false});
  x = BatchNorm(b, c, "bn1", x);
  {
    ScopeGuard relu(b, "relu");
    x = Activate(b, x, Activation::kReluInplace);
  }
  {
    ScopeGuard pool(b, "maxpool");
    std::vector<int> outs =
        b.Add("max_pool2d", {x},
              {{"kernel_size", AttrInt(3)}, {"stride", AttrInt(2)}, {"padding", AttrInt(1)}});
    x = outs.empty() ? -1 : outs[0];
  }
  for (size_t stage = 0; stage < depths.size(); ++stage) {
    const int64_t planes = int64_t{64} << stage;
    for (int64_t i = 0; i < depths[stage]; ++i) {
      ScopeGuard block(b, "layer" + Str(stage + 1) + "." + Str(i));
      b.MarkBlock();
      x = ResidualBlock(b, c, x, planes, (stage > 0 && i == 0) ? 2 : 1, bottleneck);
    }
  }
  {
    ScopeGuard pool(b, "avgpool");
    x = b.Add1("adaptive_avg_pool2d", {x}, {{"output_size", AttrInts({1, 1})}});
  }
  x = b.Add1("flatten", {x}, {{"start_dim", AttrInt(1)}, {"end_dim", AttrInt(-1)}});
  int logits = Linear(b, c, "fc", x, classes);
  if (Training(ctx)) CrossEntropyLoss(b, logits, /*upcast=*/false);
  return Status::Ok();
}

Status BuildResnet18(GraphBuilder& b, const BuildContext& ctx, const Values& v) {
  return BuildResnet(b, ctx, v, false, {2, 2, 2, 2});
}
Status BuildResnet50(GraphBuilder& b, const BuildContext& ctx, const Values& v) {
  return BuildResnet(b, ctx, v, true, {3, 4, 6, 3});
}

// ResidualConvBlock: conv1 = (Conv2d 3x3, BatchNorm2d, GELU), conv2 the same; with
// `residual`, out = (x1 + x2) / 1.414 (the init_conv of the ContextUnet, channels differ).
int ResidualConvBlock(GraphBuilder& b, const LayerContext& c, std::string_view name, int x,
                      int64_t out, bool residual) {
  ScopeGuard scope(b, name);
  int x1 = -1;
  {
    ScopeGuard conv(b, "conv1");
    x1 = Conv2d(b, c, "0", x, ConvOptions{out, 3, 1, 1, 1, 1, true});
    x1 = BatchNorm(b, c, "1", x1);
    ScopeGuard act(b, "2");
    x1 = Activate(b, x1, Activation::kGelu);
  }
  int x2 = -1;
  {
    ScopeGuard conv(b, "conv2");
    x2 = Conv2d(b, c, "0", x1, ConvOptions{out, 3, 1, 1, 1, 1, true});
    x2 = BatchNorm(b, c, "1", x2);
    ScopeGuard act(b, "2");
    x2 = Activate(b, x2, Activation::kGelu);
  }
  if (!residual) return x2;
  int sum = b.Add1("add", {x1, x2});
  return b.Add1("div", {sum}, {{"scalar", AttrFloat(1.414)}});
}

Status BuildUnetDown(GraphBuilder& b, const BuildContext& ctx, const Values& v) {
  const int64_t image = v.at("image"), channels = v.at("channels"), levels = v.at("levels");
  if (levels > 16 || image % (int64_t{1} << levels) != 0) {
    return ParamError("image", "must be divisible by 2^levels = " +
                                   Str(int64_t{1} << std::min<int64_t>(levels, 62)) + ", got " +
                                   Str(image));
  }
  const LayerContext c = Layers(ctx);
  int x = b.Input("x", {ctx.micro_batch, 3, image, image}, ctx.param_dtype, 0);
  {
    ScopeGuard block(b, "init_conv");
    b.MarkBlock();
    x = ResidualConvBlock(b, c, "", x, channels, /*residual=*/true);
  }
  int64_t ch = channels;
  for (int64_t level = 1; level <= levels; ++level) {
    ScopeGuard block(b, "down" + Str(level));
    b.MarkBlock();
    ScopeGuard model(b, "model");
    x = ResidualConvBlock(b, c, "0", x, 2 * ch, false);
    x = ResidualConvBlock(b, c, "1", x, 2 * ch, false);
    ScopeGuard pool(b, "2");
    std::vector<int> outs = b.Add("max_pool2d", {x}, {{"kernel_size", AttrInt(2)}});
    x = outs.empty() ? -1 : outs[0];
    ch *= 2;
  }
  if (Training(ctx) && b.ok() && x >= 0) {
    b.BeginLoss();
    int target = b.Target("target", b.shape(x), ctx.param_dtype, 0);
    b.SetLoss(b.Add1("mse_loss", {x, target}));
  }
  return Status::Ok();
}

// A plain MLP: `layers` hidden Linear+ReLU blocks of `width`, then a Linear to `classes`.
Status BuildMlp(GraphBuilder& b, const BuildContext& ctx, const Values& v) {
  const int64_t layers = v.at("layers"), width = v.at("width");
  const int64_t input = v.at("input"), classes = v.at("classes");
  const LayerContext c = Layers(ctx);
  int x = b.Input("x", {ctx.micro_batch, input}, ctx.param_dtype, 0);
  auto layer = [&](int64_t, int x) {
    x = Linear(b, c, "fc", x, width);
    ScopeGuard act(b, "act");
    return Activate(b, x, Activation::kRelu);
  };
  x = RepeatBlocks(b, "layers.", layers, x, layer, AllAlike);
  int logits = Linear(b, c, "head", x, classes);
  if (Training(ctx)) CrossEntropyLoss(b, logits, /*upcast=*/false);
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// The registry.

std::vector<PresetParam> Gpt2Params(int64_t layers, int64_t d, int64_t heads) {
  return {{"seq", 1024, "sequence length in tokens (n_positions grows beyond 1024)"},
          {"layers", layers, "transformer blocks"},
          {"d_model", d, "hidden size"},
          {"heads", heads, "attention heads"},
          {"vocab", 50257, "vocabulary size"}};
}

std::vector<PresetParam> LlamaParams(int64_t layers, int64_t d, int64_t heads, int64_t kv,
                                     int64_t ffn) {
  return {{"seq", 4096, "sequence length in tokens (Llama-2's context)"},
          {"layers", layers, "decoder layers"},
          {"d_model", d, "hidden size"},
          {"heads", heads, "attention heads"},
          {"kv_heads", kv, "key/value heads (grouped-query attention when fewer than heads)"},
          {"ffn", ffn, "MLP intermediate size"},
          {"vocab", 32000, "vocabulary size"}};
}

std::string Gpt2Description(const char* size, int64_t params) {
  return std::string("GPT-2 ") + size + " (HF GPT2LMHeadModel): " + Str(params) +
         " parameters with the lm_head tied to wte; pre-LN blocks, gelu_new MLP, "
         "dropout 0.1; training ends in cross_entropy over the vocabulary, the forward "
         "returning every layer's keys and values (use_cache, as its config sets it); inference "
         "keeps the prompt's keys and values (views of c_attn's output) and room for the "
         "generated tokens, and computes the last position's logits";
}

std::string LlamaDescription(const char* size, int64_t params) {
  return std::string("Llama-2 ") + size +
         " (HF LlamaForCausalLM): " + Str(params) +
         " parameters, untied lm_head; RMSNorm, rotary, grouped-query attention, "
         "SwiGLU MLP; training ends in cross_entropy over the vocabulary, the forward returning "
         "every layer's keys and values (use_cache, as its config sets it); inference keeps a KV "
         "cache of seq + generated tokens (the prompt's from its forward) and computes the last "
         "position's logits";
}

const std::vector<Preset>& Registry() {
  static const auto* registry = new std::vector<Preset>{
      {{"gpt2-small", "gpt2", Gpt2Description("small", 124439808), Gpt2Params(12, 768, 12)},
       BuildGpt2},
      {{"gpt2-medium", "gpt2", Gpt2Description("medium", 354823168), Gpt2Params(24, 1024, 16)},
       BuildGpt2},
      {{"gpt2-large", "gpt2", Gpt2Description("large", 774030080), Gpt2Params(36, 1280, 20)},
       BuildGpt2},
      {{"gpt2-xl", "gpt2", Gpt2Description("XL", 1557611200), Gpt2Params(48, 1600, 25)}, BuildGpt2},
      {{"llama-7b", "llama", LlamaDescription("7B", 6738415616),
        LlamaParams(32, 4096, 32, 32, 11008)},
       BuildLlama},
      {{"llama-13b", "llama", LlamaDescription("13B", 13015864320),
        LlamaParams(40, 5120, 40, 40, 13824)},
       BuildLlama},
      {{"llama-70b", "llama", LlamaDescription("70B", 68976648192),
        LlamaParams(80, 8192, 64, 8, 28672)},
       BuildLlama},
      {{"bert-base",
        "bert",
        "BERT base uncased with its masked-LM head (HF BertForMaskedLM): 109,514,298 "
        "parameters = BertModel's 109,482,240 without the pooler (590,592) plus "
        "cls.predictions (transform dense 590,592 + LayerNorm 1,536 + decoder bias 30,522; the "
        "decoder weight is tied to the word embeddings); post-LN, GELU, dropout 0.1; training "
        "ends in cross_entropy over the vocabulary at every position",
        {{"seq", 512, "sequence length in tokens (at most 512)"},
         {"layers", 12, "encoder layers"},
         {"d_model", 768, "hidden size"},
         {"heads", 12, "attention heads"},
         {"vocab", 30522, "vocabulary size"}}},
       BuildBert},
      {{"vit-b16",
        "vit",
        "ViT-B/16 (torchvision vit_b_16): 86,567,656 parameters; 16x16 patch conv, class token, "
        "12 pre-LN encoder layers, head to 1000 classes; training "
        "ends in cross_entropy over the classes",
        {{"image", 224, "image height and width in pixels"},
         {"patch", 16, "patch size"},
         {"layers", 12, "encoder layers"},
         {"d_model", 768, "hidden size"},
         {"heads", 12, "attention heads"},
         {"classes", 1000, "classes of the head"}}},
       BuildVit},
      {{"resnet18",
        "resnet",
        "ResNet-18 (torchvision): 11,689,512 parameters; BasicBlocks [2, 2, 2, 2], BatchNorm, "
        "in-place ReLU; training ends in cross_entropy over the classes",
        {{"image", 224, "image height and width in pixels"},
         {"classes", 1000, "classes of the fc head"}}},
       BuildResnet18},
      {{"resnet50",
        "resnet",
        "ResNet-50 (torchvision): 25,557,032 parameters; Bottlenecks [3, 4, 6, 3], BatchNorm, "
        "in-place ReLU; training ends in cross_entropy over the classes",
        {{"image", 224, "image height and width in pixels"},
         {"classes", 1000, "classes of the fc head"}}},
       BuildResnet50},
      {{"unet-down",
        "unet",
        "The down-path of the avatar diffusion UNet of seed 001, as we read that write-up (it "
        "gives the shapes, not the code): [B,3,64,64] -> init_conv ResidualConvBlock(3,128) "
        "[B,128,64,64] -> down1 [B,256,32,32] -> down2 [B,512,16,16] -> down3 [B,1024,8,8]. "
        "A ResidualConvBlock is two (Conv2d 3x3, BatchNorm2d, GELU), init_conv adds its two "
        "halves and divides by 1.414; each down level (UnetDown) is two ResidualConvBlocks "
        "doubling the channels and MaxPool2d(2), as in the DeepLearning.AI ContextUnet. "
        "Training ends in mse_loss against a target shaped like the output, standing in for "
        "the rest of the UNet",
        {{"image", 64, "image height and width in pixels"},
         {"channels", 128, "channels of init_conv (doubled at each level)"},
         {"levels", 3, "down levels"}}},
       BuildUnetDown},
      {{"mlp",
        "mlp",
        "A plain MLP: `layers` blocks of Linear(width) + ReLU, then Linear(classes); training "
        "ends in cross_entropy over the classes",
        {{"layers", 3, "hidden Linear+ReLU blocks"},
         {"width", 1024, "hidden width"},
         {"input", 784, "input features"},
         {"classes", 10, "output classes"}}},
       BuildMlp},
  };
  return *registry;
}

// Largest accepted value of any preset parameter: larger ones would only build graphs past
// every limit (and risk overflowing products of parameters).
constexpr int64_t kMaxParamValue = int64_t{1} << 24;

// The preset's graph. `set` are the parameters the request set: a shape too large to count in
// bytes names the one its size came from (GraphBuilder::NameSize).
StatusOr<Graph> Build(const Preset& preset, const BuildContext& context, const Values& values,
                      const std::map<std::string, int64_t>& set) {
  GraphBuilder b;
  ConfigureBuilder(context, b);
  b.NameSize(context.micro_batch, "config.batch_size");
  for (const auto& [name, value] : set) b.NameSize(value, ParamField(name));
  if (context.autocast != DType::kFloat32) b.EnableAutocast(context.autocast);
  MEMEST_RETURN_IF_ERROR(preset.build(b, context, values));
  return b.Finish(context.max_ops);
}

// A deep preset is refused by its op count before it is built, naming the parameter.
Status CheckOpCount(const Preset& preset, const BuildContext& context, const Values& values) {
  const auto layers = values.find("layers");
  if (layers == values.end()) return Status::Ok();
  return CheckLayeredOpCount(
      layers->second, ParamField("layers"), preset.info.name, context,
      [&](int64_t n, const BuildContext& counting) {
        Values shallow = values;
        shallow["layers"] = n;
        return Build(preset, counting, shallow, {});
      });
}

}  // namespace

const std::vector<PresetInfo>& ListPresets() {
  static const auto* infos = [] {
    auto* v = new std::vector<PresetInfo>();
    for (const Preset& p : Registry()) v->push_back(p.info);
    return v;
  }();
  return *infos;
}

StatusOr<Graph> BuildPreset(const PresetSpec& spec, const BuildContext& context) {
  const Preset* preset = nullptr;
  std::string names;
  for (const Preset& p : Registry()) {
    if (p.info.name == spec.name) preset = &p;
    names += (names.empty() ? "" : ", ") + p.info.name;
  }
  if (preset == nullptr) {
    return NotFound("model.preset.name: unknown preset " + Quote(spec.name) + "; known: " + names);
  }
  Values values;
  for (const PresetParam& p : preset->info.params) values[p.name] = p.default_value;
  for (const auto& [name, value] : spec.params) {
    auto it = values.find(name);
    if (it == values.end()) {
      std::string known;
      for (const PresetParam& p : preset->info.params)
        known += (known.empty() ? "" : ", ") + p.name;
      return ParamError(Escape(name), "unknown parameter of " + spec.name + "; known: " + known);
    }
    if (value <= 0 || value > kMaxParamValue) {
      return ParamError(
          name, value <= 0 ? "must be positive, got " + Str(value)
                           : "must be at most " + Str(kMaxParamValue) + ", got " + Str(value));
    }
    it->second = value;
  }
  MEMEST_RETURN_IF_ERROR(ValidateBuildContext(context));
  MEMEST_RETURN_IF_ERROR(CheckOpCount(*preset, context, values));
  return Build(*preset, context, values, spec.params);
}

}  // namespace memest
