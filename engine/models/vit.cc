// ViTForImageClassification (engine/models/encoders.h), as transformers' modeling_vit.py runs it.
#include <string>

#include "engine/models/encoders.h"
#include "engine/models/repeat_blocks.h"

namespace memest {

int64_t VitTokens(const VitSpec& s) {
  if (s.patch <= 0 || s.patch > s.image) return 0;
  const int64_t grid = s.image / s.patch;  // ViTPatchEmbeddings: (H // p) * (W // p) patches
  return grid * grid + 1;  // at most (2^24)^2 + 1: image is a size
}

Status BuildVitModel(GraphBuilder& b, const BuildContext& ctx, const VitSpec& s,
                     const FieldOf& field) {
  const auto str = [](int64_t v) { return std::to_string(v); };
  if (s.patch > s.image) {
    return InvalidArgument(field("patch") + ": must be at most the image size " + str(s.image) +
                           " (ViTPatchEmbeddings tiles the image), got " + str(s.patch));
  }
  if (s.d_model % s.heads != 0) {
    return InvalidArgument(field("heads") + ": must divide the hidden size " + str(s.d_model) +
                           ", got " + str(s.heads));
  }
  const LayerContext c = LayerContextOf(ctx);
  const int64_t n = ctx.micro_batch;
  // The float32 pixels must be a tensor: named here rather than as the input's size.
  StatusOr<int64_t> pixels = CheckedMul(s.image, s.image);
  if (pixels.ok()) pixels = CheckedMul(*pixels, s.channels);
  if (pixels.ok()) pixels = CheckedMul(*pixels, n);
  if (pixels.ok()) pixels = CheckedMul(*pixels, 4);
  if (!pixels.ok() || *pixels > kMaxTensorBytes) {
    return InvalidArgument(field("image") + ": " + str(n) + " images of " + str(s.channels) +
                           " x " + str(s.image) + " x " + str(s.image) + " float32 pixels are more "
                           "than " + str(kMaxTensorBytes) + " bytes");
  }
  const int64_t tokens = VitTokens(s);
  // The image processor's float32 pixels; ViTModel.forward casts them to the parameters' dtype
  // (pixel_values.to(expected_dtype): a copy when they are 16-bit).
  int x = b.Input("pixel_values", {n, s.channels, s.image, s.image}, DType::kFloat32, 0);
  if (c.param_dtype != DType::kFloat32) {
    x = b.Add1("to", {x}, {{"dtype", std::string(DTypeName(c.param_dtype))}});
  }
  {
    ScopeGuard vit(b, "vit");
    {
      ScopeGuard emb(b, "embeddings");
      const int cls_token = b.Parameter("cls_token", {1, 1, s.d_model}, c.param_dtype);
      const int positions = b.Parameter("position_embeddings", {1, tokens, s.d_model}, c.param_dtype);
      {
        // ViTPatchEmbeddings: projection(pixel_values).flatten(2).transpose(1, 2)
        ScopeGuard patches(b, "patch_embeddings");
        x = Conv2d(b, c, "projection", x, ConvOptions{s.d_model, s.patch, s.patch, 0, 1, 1, true});
        x = b.Add1("flatten", {x}, {{"start_dim", AttrInt(2)}, {"end_dim", AttrInt(-1)}});
        x = b.Add1("transpose", {x}, {{"dim0", AttrInt(1)}, {"dim1", AttrInt(2)}});
      }
      const int cls = b.Add1("expand", {cls_token}, {{"shape", AttrInts({n, -1, -1})}});
      x = b.Add1("cat", {cls, x}, {{"dim", AttrInt(1)}});
      x = b.Add1("add", {x, positions});
      x = Dropout(b, c, x, s.hidden_dropout);
    }
    const int embedding_output = x;  // ViTModel.forward's local, until it returns
    AttentionOptions a;
    a.heads = s.heads;
    a.projection = AttentionProjection::kSeparate;
    a.names = {"attention.query", "attention.key", "attention.value", "output.dense"};
    a.scale = AttentionScale::kDivideScores;
    a.bias = s.qkv_bias;
    a.out_bias = true;
    a.attn_dropout = s.attn_dropout;
    a.resid_dropout = s.hidden_dropout;  // ViTSelfOutput's dropout
    a.hold_locals = true;                // ViTSelfAttention's locals, ViTLayer's argument
    a.hold_scores = true;
    auto layer = [&](int64_t, int x) {
      int h = LayerNorm(b, c, "layernorm_before", x);
      h = Attention(b, c, "attention", h, a);
      const int attention_output = h;  // ViTLayer.forward's local, until it returns
      x = b.Add1("add", {h, x});
      h = LayerNorm(b, c, "layernorm_after", x);
      h = Linear(b, c, "intermediate.dense", h, s.ffn);
      {
        ScopeGuard act(b, "intermediate.intermediate_act_fn");
        h = Activate(b, h, s.activation);
      }
      h = Linear(b, c, "output.dense", h, s.d_model);
      h = Dropout(b, c, h, s.hidden_dropout);
      const int input = x;  // ViTEncoder's hidden_states: rebound once the layer returns
      x = b.Add1("add", {h, x});
      b.HoldUntilLastOp(input);
      b.HoldUntilLastOp(attention_output);
      return x;
    };
    x = RepeatBlocks(b, "encoder.layer.", s.layers, x, layer, AllAlike);
    x = LayerNorm(b, c, "layernorm", x);
    b.HoldUntilLastOp(embedding_output);
  }
  // classifier(sequence_output[:, 0, :]): a select, recorded as memest.trace records it
  x = b.Add1("slice", {x}, {{"dim", AttrInt(1)}, {"start", AttrInt(0)}, {"end", AttrInt(1)}});
  x = b.Add1("squeeze", {x}, {{"dim", AttrInt(1)}});
  const int logits = Linear(b, c, "classifier", x, s.classes);
  if (ctx.mode == Mode::kTraining) CrossEntropyLoss(b, logits, /*upcast=*/false);
  return b.status();
}

}  // namespace memest
