#include "engine/models/presets.h"

#include <gtest/gtest.h>

#include "tests/engine/test_graphs.h"

#include <set>
#include <string>
#include <vector>

namespace memest {
namespace {

BuildContext Context(int64_t micro_batch, Mode mode = Mode::kTraining,
                     DType dtype = DType::kFloat32) {
  return enginetest::MakeContext(micro_batch, mode, dtype);
}

StatusOr<Graph> Build(const std::string& name, std::map<std::string, int64_t> params = {},
                      const BuildContext& context = Context(2)) {
  return BuildPreset(PresetSpec{name, std::move(params)}, context);
}

// Parameter counts, derived by hand from the modules' shapes (and equal to what
// sum(p.numel() for p in model.parameters()) prints for the HF / torchvision model):
//   gpt2 (tied head): V*d + 1024*d + L*(12*d^2 + 13*d) + 2*d, V = 50257; per block: ln_1, ln_2
//     4d; c_attn d*3d + 3d; attn.c_proj d^2 + d; mlp.c_fc d*4d + 4d; mlp.c_proj 4d*d + d.
//   llama (untied): 2*V*d + L*(2*d^2 + 2*d*kv*hd + 3*d*ffn + 2*d) + d, V = 32000.
//   bert-base MLM: BertModel 109,482,240 - pooler (768^2 + 768) + cls.predictions transform
//     (768^2 + 768) + LayerNorm 1,536 + decoder bias 30,522 = 109,514,298.
//   resnet18 / resnet50 / vit_b_16: torchvision's published counts.
//   unet-down: ResidualConvBlock(i, o) = (9*i*o + o) + 2*o + (9*o*o + o) + 2*o;
//     init (3, 128) = 151,680; (128, 256) = 886,272; (256, 256) = 1,181,184;
//     (256, 512) = 3,542,016; (512, 512) = 4,721,664; (512, 1024) = 14,161,920;
//     (1024, 1024) = 18,880,512; total 43,525,248.
//   mlp (3 x 1024, input 784, 10 classes): 784*1024+1024 + 2*(1024^2+1024) + 1024*10+10
//     = 803,840 + 2,099,200 + 10,250 = 2,913,290.
struct CountCase {
  std::string name;
  std::map<std::string, int64_t> params;
  int64_t parameters;
};

class ParameterCountTest : public testing::TestWithParam<CountCase> {};

TEST_P(ParameterCountTest, IsExact) {
  const CountCase& c = GetParam();
  // The count does not depend on the sequence length; a short one keeps the test fast.
  std::map<std::string, int64_t> params = c.params;
  StatusOr<Graph> g = Build(c.name, params, Context(1));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->ParameterCount(), c.parameters);
  EXPECT_EQ(g->TrainableParameterCount(), c.parameters);
}

INSTANTIATE_TEST_SUITE_P(
    Presets, ParameterCountTest,
    testing::Values(CountCase{"gpt2-small", {{"seq", 64}}, 124'439'808},
                    CountCase{"gpt2-medium", {{"seq", 64}}, 354'823'168},
                    CountCase{"gpt2-large", {{"seq", 64}}, 774'030'080},
                    CountCase{"gpt2-xl", {{"seq", 64}}, 1'557'611'200},
                    CountCase{"llama-7b", {{"seq", 64}}, 6'738'415'616},
                    CountCase{"llama-13b", {{"seq", 64}}, 13'015'864'320},
                    CountCase{"llama-70b", {{"seq", 64}}, 68'976'648'192},
                    CountCase{"bert-base", {{"seq", 64}}, 109'514'298},
                    CountCase{"resnet18", {}, 11'689'512}, CountCase{"resnet50", {}, 25'557'032},
                    CountCase{"vit-b16", {}, 86'567'656}, CountCase{"unet-down", {}, 43'525'248},
                    CountCase{"mlp", {}, 2'913'290},
                    // gpt2-small with 2 of its 12 blocks: minus 10 * 7,087,872.
                    CountCase{"gpt2-small", {{"seq", 64}, {"layers", 2}}, 53'561'088}),
    [](const testing::TestParamInfo<CountCase>& info) {
      std::string s = info.param.name + (info.param.params.count("layers") ? "_2_layers" : "");
      for (char& ch : s) {
        if (ch == '-') ch = '_';
      }
      return s;
    });

TEST(PresetsTest, EveryPresetBuildsForTrainingAndInference) {
  for (const PresetInfo& info : ListPresets()) {
    SCOPED_TRACE(info.name);
    std::map<std::string, int64_t> params;
    for (const PresetParam& p : info.params) {
      if (p.name == "seq") params["seq"] = 32;
      if (p.name == "image" && info.family != "unet") params["image"] = 64;
    }
    StatusOr<Graph> train = Build(info.name, params, Context(2));
    ASSERT_TRUE(train.ok()) << train.status().ToString();
    ASSERT_GE(train->loss, 0);
    EXPECT_TRUE(train->tensors[train->loss].shape.empty());
    EXPECT_GE(train->loss_begin, 0);
    EXPECT_LT(train->loss_begin, static_cast<int>(train->ops.size()));
    EXPECT_FALSE(train->blocks.empty());
    StatusOr<Graph> infer = Build(info.name, params, Context(2, Mode::kInference));
    ASSERT_TRUE(infer.ok()) << infer.status().ToString();
    EXPECT_EQ(infer->loss, -1);
    EXPECT_EQ(infer->ParameterCount(), train->ParameterCount());
    // Inference has no dropout: model.eval() makes it the identity.
    for (const Op& op : infer->ops) EXPECT_NE(op.kind, "dropout");
  }
}

TEST(PresetsTest, ListsEveryPresetOnceWithDefaults) {
  const std::vector<std::string> want = {
      "gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl",  "llama-7b",  "llama-13b", "llama-70b",
      "bert-base",  "vit-b16",     "resnet18",   "resnet50", "unet-down", "mlp"};
  std::vector<std::string> got;
  for (const PresetInfo& p : ListPresets()) {
    got.push_back(p.name);
    EXPECT_FALSE(p.family.empty());
    EXPECT_FALSE(p.description.empty());
    for (const PresetParam& q : p.params) EXPECT_GT(q.default_value, 0) << p.name << q.name;
  }
  EXPECT_EQ(got, want);
}

// Blocks: one per repeated module, in order, named after the PyTorch module path.
struct BlockCase {
  std::string name;
  size_t count;
  std::string first;
  std::string last;
};

TEST(PresetsTest, MarksRepeatedBlocks) {
  const std::vector<BlockCase> cases = {
      {"gpt2-small", 12, "transformer.h.0", "transformer.h.11"},
      {"gpt2-medium", 24, "transformer.h.0", "transformer.h.23"},
      {"llama-7b", 32, "model.layers.0", "model.layers.31"},
      {"bert-base", 12, "bert.encoder.layer.0", "bert.encoder.layer.11"},
      {"vit-b16", 12, "encoder.layers.encoder_layer_0", "encoder.layers.encoder_layer_11"},
      {"resnet18", 8, "layer1.0", "layer4.1"},   // [2, 2, 2, 2]
      {"resnet50", 16, "layer1.0", "layer4.2"},  // [3, 4, 6, 3]
      {"unet-down", 4, "init_conv", "down3"},
      {"mlp", 3, "layers.0", "layers.2"},
  };
  for (const BlockCase& c : cases) {
    SCOPED_TRACE(c.name);
    std::map<std::string, int64_t> params;
    if (c.name != "resnet18" && c.name != "resnet50" && c.name != "vit-b16" &&
        c.name != "unet-down" && c.name != "mlp") {
      params["seq"] = 16;
    }
    StatusOr<Graph> g = Build(c.name, params, Context(1));
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    ASSERT_EQ(g->blocks.size(), c.count);
    EXPECT_EQ(g->blocks.front(), c.first);
    EXPECT_EQ(g->blocks.back(), c.last);
    // Every block has ops, and blocks do not nest.
    for (size_t i = 0; i < g->blocks.size(); ++i) {
      int ops = 0;
      for (const Op& op : g->ops) ops += ScopeWithin(op.scope, g->blocks[i]) ? 1 : 0;
      EXPECT_GT(ops, 0) << g->blocks[i];
      if (i > 0) {
        EXPECT_FALSE(ScopeWithin(g->blocks[i], g->blocks[i - 1]));
      }
    }
  }
}

TEST(PresetsTest, AttentionCoreIsItsOwnScope) {
  StatusOr<Graph> g = Build("gpt2-small", {{"seq", 16}, {"layers", 4}});
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  std::multiset<std::string> core_kinds;
  for (const Op& op : g->ops) {
    if (op.scope == "transformer.h.3.attn.core") core_kinds.insert(op.kind);
  }
  // q @ k^T, / sqrt(hd), masked_fill, softmax, dropout, @ v (and k's transpose, the mask slices).
  EXPECT_EQ(core_kinds.count("matmul"), 2u);
  EXPECT_EQ(core_kinds.count("div"), 1u);
  EXPECT_EQ(core_kinds.count("masked_fill"), 1u);
  EXPECT_EQ(core_kinds.count("softmax"), 1u);
  EXPECT_EQ(core_kinds.count("dropout"), 1u);
}

// HF GPT2Attention._attn: softmax(w).type(value.dtype), then dropout. Under autocast softmax
// returns float32, so dropout (and its mask and output) runs in the values' bfloat16.
TEST(PresetsTest, Gpt2CastsAttentionProbabilitiesBackBeforeDropout) {
  BuildContext ctx = Context(2);
  ctx.autocast = DType::kBFloat16;
  StatusOr<Graph> g = Build("gpt2-small", {{"seq", 16}, {"layers", 1}}, ctx);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  std::vector<const Op*> core;
  for (const Op& op : g->ops) {
    if (op.scope == "transformer.h.0.attn.core") core.push_back(&op);
  }
  size_t s = 0;
  while (s < core.size() && core[s]->kind != "softmax") ++s;
  ASSERT_LT(s + 2, core.size());
  EXPECT_EQ(g->tensors[core[s]->outputs[0]].dtype, DType::kFloat32);
  EXPECT_EQ(core[s + 1]->kind, "to");
  EXPECT_EQ(g->tensors[core[s + 1]->outputs[0]].dtype, DType::kBFloat16);
  EXPECT_EQ(core[s + 2]->kind, "dropout");
  EXPECT_EQ(g->tensors[core[s + 2]->outputs[0]].dtype, DType::kBFloat16);

  // Without autocast the cast is a no-op and is not there.
  g = Build("gpt2-small", {{"seq", 16}, {"layers", 1}});
  ASSERT_TRUE(g.ok());
  for (const Op& op : g->ops) {
    if (op.scope == "transformer.h.0.attn.core") EXPECT_NE(op.kind, "to");
  }
}

TEST(PresetsTest, Gpt2TiesLmHeadAndNamesParametersLikeHf) {
  StatusOr<Graph> g = Build("gpt2-small", {{"seq", 16}, {"layers", 1}});
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  std::set<std::string> names;
  for (const Tensor& t : g->tensors) {
    if (t.role == TensorRole::kParameter) names.insert(t.name);
  }
  EXPECT_TRUE(names.count("transformer.wte.weight"));
  EXPECT_TRUE(names.count("transformer.h.0.attn.c_attn.weight"));
  EXPECT_TRUE(names.count("transformer.h.0.mlp.c_proj.bias"));
  EXPECT_TRUE(names.count("transformer.ln_f.weight"));
  EXPECT_FALSE(names.count("lm_head.weight"));
  // HF Conv1D stores its weight [in, out].
  for (const Tensor& t : g->tensors) {
    if (t.name == "transformer.h.0.attn.c_attn.weight") {
      EXPECT_EQ(t.shape, (Shape{768, 2304}));
    }
  }
}

// State-dict names, as HF / torchvision spell them (parameters and buffers).
TEST(PresetsTest, NamesFollowTheModuleTree) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"vit-b16",
       {"conv_proj.weight", "class_token", "encoder.pos_embedding",
        "encoder.layers.encoder_layer_0.self_attention.in_proj_weight",
        "encoder.layers.encoder_layer_0.self_attention.out_proj.bias",
        "encoder.layers.encoder_layer_11.mlp.3.weight", "encoder.ln.weight", "heads.head.weight"}},
      {"resnet50",
       {"conv1.weight", "bn1.running_mean", "layer1.0.downsample.0.weight",
        "layer4.2.bn3.running_var", "layer4.2.bn3.num_batches_tracked", "fc.bias"}},
      {"llama-7b",
       {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.mlp.gate_proj.weight", "model.layers.0.post_attention_layernorm.weight",
        "model.norm.weight", "lm_head.weight"}},
      {"bert-base",
       {"bert.embeddings.word_embeddings.weight", "bert.embeddings.token_type_ids",
        "bert.encoder.layer.0.attention.self.query.weight",
        "bert.encoder.layer.0.attention.output.LayerNorm.weight",
        "bert.encoder.layer.11.output.dense.weight", "cls.predictions.transform.dense.weight",
        "cls.predictions.bias"}},
      {"unet-down", {"init_conv.conv1.0.weight", "down3.model.1.conv2.1.running_var"}},
  };
  for (const auto& [preset, want] : cases) {
    SCOPED_TRACE(preset);
    std::map<std::string, int64_t> params;
    if (preset == "llama-7b" || preset == "bert-base") params["seq"] = 16;
    StatusOr<Graph> g = Build(preset, params, Context(1));
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    std::set<std::string> names;
    for (const Tensor& t : g->tensors) {
      if (t.role == TensorRole::kParameter || t.role == TensorRole::kBuffer) names.insert(t.name);
    }
    for (const std::string& name : want) EXPECT_TRUE(names.count(name)) << name;
  }
}

TEST(PresetsTest, ParametersTakeTheParamDtype) {
  StatusOr<Graph> g = Build("llama-7b", {{"seq", 16}, {"layers", 1}},
                            Context(1, Mode::kTraining, DType::kBFloat16));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  for (const Tensor& t : g->tensors) {
    if (t.role == TensorRole::kParameter) {
      EXPECT_EQ(t.dtype, DType::kBFloat16) << t.name;
    }
  }
}

// KV cache in inference: per layer the prompt's k and v, [B, kv_heads, seq, head_dim], which the
// forward returns (Graph::cache), and room for the generated tokens, [B, kv_heads, gen,
// head_dim], in the parameter dtype (bf16): layers * 2 * B * kv_heads * gen * head_dim * 2.
struct KvCase {
  std::string name;
  int64_t seq, gen, batch;
  int64_t layers, kv_heads, head_dim;
};

TEST(PresetsTest, InferenceAllocatesKvCache) {
  const std::vector<KvCase> cases = {
      {"gpt2-small", 128, 64, 2, 12, 12, 64},
      {"gpt2-xl", 256, 0, 1, 48, 25, 64},
      {"llama-7b", 512, 512, 1, 32, 32, 128},
      {"llama-70b", 1024, 256, 2, 80, 8, 128},  // grouped-query: 8 kv heads
  };
  for (const KvCase& c : cases) {
    SCOPED_TRACE(c.name);
    BuildContext ctx = Context(c.batch, Mode::kInference, DType::kBFloat16);
    ctx.generate_tokens = c.gen;
    StatusOr<Graph> g = Build(c.name, {{"seq", c.seq}}, ctx);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    int64_t caches = 0, bytes = 0;
    for (const Tensor& t : g->tensors) {
      if (!t.kv_cache) continue;
      ++caches;
      bytes += Bytes(t.shape, t.dtype);
      EXPECT_EQ(t.role, TensorRole::kBuffer);
      EXPECT_EQ(t.dtype, DType::kBFloat16);
      EXPECT_EQ(t.shape, (Shape{c.batch, c.kv_heads, c.gen, c.head_dim})) << t.name;
    }
    EXPECT_EQ(caches, 2 * c.layers);  // without generated tokens, an empty room
    EXPECT_EQ(bytes, c.layers * 2 * c.batch * c.kv_heads * c.gen * c.head_dim * 2);
    ASSERT_EQ(g->cache.size(), static_cast<size_t>(2 * c.layers));
    for (int t : g->cache) EXPECT_EQ(g->tensors[t].shape[2], c.seq);
    // Only the last position's logits: [B, 1, V].
    EXPECT_EQ(g->tensors[g->ops.back().outputs[0]].shape.size(), 3u);
    EXPECT_EQ(g->tensors[g->ops.back().outputs[0]].shape[1], 1);
  }
  // Training keeps no cache.
  StatusOr<Graph> train = Build("gpt2-small", {{"seq", 16}});
  ASSERT_TRUE(train.ok());
  for (const Tensor& t : train->tensors) EXPECT_FALSE(t.kv_cache);
}

TEST(PresetsTest, LossesAreTheNaturalOnes) {
  struct LossCase {
    std::string name;
    std::string loss_kind;
    Shape logits;  // the loss op's first input
  };
  const std::vector<LossCase> cases = {
      {"gpt2-small", "cross_entropy", {2 * 16, 50257}},  // view(-1, V) of [2, 16, V]
      {"llama-7b", "cross_entropy", {2 * 16, 32000}},
      {"bert-base", "cross_entropy", {2 * 16, 30522}},
      {"vit-b16", "cross_entropy", {2, 1000}},
      {"resnet18", "cross_entropy", {2, 1000}},
      {"unet-down", "mse_loss", {2, 1024, 8, 8}},  // the seed's [B, 1024, 8, 8]
      {"mlp", "cross_entropy", {2, 10}},
  };
  for (const LossCase& c : cases) {
    SCOPED_TRACE(c.name);
    std::map<std::string, int64_t> params;
    if (c.name == "gpt2-small" || c.name == "bert-base") params = {{"seq", 16}, {"layers", 1}};
    if (c.name == "llama-7b") params = {{"seq", 16}, {"layers", 1}};
    StatusOr<Graph> g = Build(c.name, params, Context(2));
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    const Op& op = g->ops[g->tensors[g->loss].producer];
    EXPECT_EQ(op.kind, c.loss_kind);
    EXPECT_EQ(g->tensors[op.inputs[0]].shape, c.logits);
  }
}

TEST(PresetsTest, UnetDownFollowsTheSeedShapes) {
  StatusOr<Graph> g = Build("unet-down", {}, Context(4));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  // [B,128,64,64] -> [B,256,32,32] -> [B,512,16,16] -> [B,1024,8,8] after each max pool.
  std::vector<Shape> pooled;
  for (const Op& op : g->ops) {
    if (op.kind == "max_pool2d") pooled.push_back(g->tensors[op.outputs[0]].shape);
  }
  EXPECT_EQ(pooled, (std::vector<Shape>{{4, 256, 32, 32}, {4, 512, 16, 16}, {4, 1024, 8, 8}}));
  EXPECT_EQ(g->tensors[0].shape, (Shape{4, 3, 64, 64}));
}

TEST(PresetsTest, ResNetUsesInplaceReluAndDownsample) {
  StatusOr<Graph> g = Build("resnet50", {}, Context(1));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  int downsamples = 0, inplace = 0;
  for (const Op& op : g->ops) {
    if (op.kind == "conv2d" && ScopeWithin(op.scope, "layer1.0.downsample")) ++downsamples;
    if (op.kind == "relu" && HasAttr(op.attrs, "inplace")) ++inplace;
  }
  EXPECT_EQ(downsamples, 1);
  // 1 stem + 16 blocks * 3 (two inner, one after the residual add).
  EXPECT_EQ(inplace, 1 + 16 * 3);
}

TEST(PresetsTest, UnknownPresetIsNotFoundAndListsTheKnown) {
  StatusOr<Graph> g = Build("gpt5");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kNotFound);
  EXPECT_NE(g.status().message().find("model.preset.name"), std::string::npos);
  EXPECT_NE(g.status().message().find("llama-70b"), std::string::npos);
}

TEST(PresetsTest, BadParametersNameTheField) {
  struct BadCase {
    std::string preset;
    std::map<std::string, int64_t> params;
    std::string message;
  };
  const std::vector<BadCase> cases = {
      {"gpt2-small", {{"seq", -4}}, "model.preset.params.seq: must be positive, got -4"},
      {"gpt2-small", {{"sequence", 128}}, "model.preset.params.sequence: unknown parameter"},
      {"gpt2-small", {{"heads", 7}}, "model.preset.params.heads: must divide d_model 768"},
      {"llama-70b", {{"kv_heads", 7}}, "model.preset.params.kv_heads: must divide heads 64"},
      {"bert-base", {{"seq", 1024}}, "model.preset.params.seq: must be at most 512"},
      {"vit-b16", {{"image", 100}}, "model.preset.params.patch: must divide image 100"},
      {"resnet18", {{"classes", 0}}, "model.preset.params.classes: must be positive, got 0"},
      {"mlp", {{"width", int64_t{1} << 40}}, "model.preset.params.width: must be at most"},
  };
  for (const BadCase& c : cases) {
    StatusOr<Graph> g = Build(c.preset, c.params);
    ASSERT_FALSE(g.ok()) << c.message;
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(g.status().message().rfind(c.message, 0), 0u) << g.status().message();
  }
}

// A size too large to count in bytes names the field the user set: the batch, or a parameter,
// whether it overflows an input directly or only once folded into an activation ([B * T, C]).
TEST(PresetsTest, ShapesTooLargeNameTheFieldTheUserSet) {
  struct TooLarge {
    int64_t batch;
    std::map<std::string, int64_t> params;
    std::string message;
  };
  const std::vector<TooLarge> cases = {
      {int64_t{1} << 62,
       {},
       "config.batch_size: 4611686018427387904 is too large: the input "
       "'input_ids' would be [4611686018427387904, 1024] of int64"},
      {int64_t{1} << 34,  // [B, T, 768] fits in 2^56 bytes, the folded [B * T, 2304] does not
       {},
       "config.batch_size: 17179869184 is too large: the output of addmm "
       "in 'transformer.h.0.attn.c_attn' would be [17592186044416, 2304]"},
      {1024,
       {{"seq", int64_t{1} << 24}},
       "model.preset.params.seq: 16777216 is too large: the "
       "output of matmul in 'transformer.h.0.attn.core'"},
  };
  for (const TooLarge& c : cases) {
    ModelSpec model{PresetSpec{"gpt2-small", c.params}};
    StatusOr<Graph> g = BuildGraph(model, Context(c.batch));
    ASSERT_FALSE(g.ok()) << c.message;
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(g.status().message().rfind(c.message, 0), 0u) << g.status().message();
  }
}

TEST(PresetsTest, RefusesBadContext) {
  StatusOr<Graph> g = Build("mlp", {}, Context(0));
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("config.batch_size"), std::string::npos);
}

}  // namespace
}  // namespace memest
