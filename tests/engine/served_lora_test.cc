// vLLM's LoRA serving (engine/passes/served_lora.h): the adapter slots each GPU holds, counted
// here again from vLLM 0.19's create_lora_weights shapes (lora/layers/*.py), the kernels' buffers
// in the profile run, and the refusals.
#include <gtest/gtest.h>

#include <string>

#include "engine/estimator.h"
#include "tests/engine/hf_json.h"

namespace memest {
namespace {

using enginetest::HfModel;

RunConfig ServedLora(int64_t rank, int64_t max_loras, int64_t tensor = 1) {
  RunConfig c;
  c.mode = Mode::kInference;
  c.precision = Precision::kBf16Pure;
  c.device = "h100-80gb";
  c.serving.enabled = true;
  c.serving.max_model_len = 8192;
  c.serving.max_loras = max_loras;
  c.parallelism.tensor = tensor;
  c.lora.rank = rank;
  return c;
}

StatusOr<Report> Serve(const std::string& config, const RunConfig& c) {
  return Estimate(HfModel(config), c);
}

// The punica wrapper's index tensors: 56 T + 24 B + 24 L + 32 bytes.
int64_t IndexBytes(int64_t tokens, int64_t seqs, int64_t loras) {
  return 56 * tokens + 24 * seqs + 24 * loras + 32;
}

// A Llama-shaped decoder's slots in bf16 on one of `t` ranks, as vLLM's wrappers shape them.
struct Decoder {
  int64_t layers, hidden, heads, kv_heads, head_dim, intermediate, vocab;
};

int64_t LinearSlots(const Decoder& d, int64_t L, int64_t R, int64_t t, bool sharded) {
  const int64_t q = d.heads * d.head_dim, kv = d.kv_heads * d.head_dim;
  const int64_t ra = sharded ? R / t : R;  // a column-parallel A's rows
  int64_t per_layer = 0;
  for (int64_t out : {q, kv, kv, d.intermediate, d.intermediate}) {  // column-parallel
    per_layer += L * ra * d.hidden + L * (out / t) * R;
  }
  for (auto [in, out] : {std::pair{q, d.hidden}, std::pair{d.intermediate, d.hidden}}) {  // row
    per_layer += L * R * (in / t) + L * (sharded ? out / t : out) * R;
  }
  return 2 * d.layers * per_layer;
}

int64_t EmbeddingSlots(const Decoder& d, int64_t L, int64_t R) {
  return 2 * (L * d.vocab * R + L * d.hidden * R);  // embed_tokens' A and B
}

constexpr Decoder kLlama3_8b{32, 4096, 32, 8, 128, 14336, 128256};

TEST(ServedLoraTest, Llama3SlotsOnOneGpuMatchVllmsShapes) {
  StatusOr<Report> r = Serve("llama-3-8b", ServedLora(16, 4));
  ASSERT_TRUE(r.ok()) << r.status().message();
  const int64_t slots = LinearSlots(kLlama3_8b, 4, 16, 1, false) +
                        2 * EmbeddingSlots(kLlama3_8b, 4, 16);  // logits' as many as the table's
  EXPECT_EQ(slots, 369'426'432);                                // docs/serving.md's figure
  EXPECT_EQ(r->serving->lora_bytes, slots + IndexBytes(8192, 1024, 4));
  StatusOr<Report> plain = Estimate(HfModel("llama-3-8b"), [] {
    RunConfig c = ServedLora(0, 0);
    return c;
  }());
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  // The weights take the slots (each index tensor rounded up to the allocator's 512 bytes).
  const int64_t added = r->serving->weights_bytes - plain->serving->weights_bytes;
  EXPECT_GE(added, r->serving->lora_bytes);
  EXPECT_LE(added, r->serving->lora_bytes + 16 * 512);
  // The kernels' float32 buffers run in the profile: its peak does not fall.
  EXPECT_GE(r->serving->activation_peak_bytes, plain->serving->activation_peak_bytes);
  EXPECT_LT(r->serving->kv_cache_bytes, plain->serving->kv_cache_bytes);
  bool noted = false;
  for (const std::string& n : r->notes) noted |= n.rfind("serving with LoRA", 0) == 0;
  EXPECT_TRUE(noted);
}

TEST(ServedLoraTest, TensorParallelSplitsWhatVllmSplits) {
  for (bool sharded : {false, true}) {
    RunConfig c = ServedLora(16, 4, 2);
    c.serving.fully_sharded_loras = sharded;
    StatusOr<Report> r = Serve("llama-3-8b", c);
    ASSERT_TRUE(r.ok()) << r.status().message();
    // The logits' reindexing map, int64 over the vocabulary, with t > 1.
    const int64_t slots = LinearSlots(kLlama3_8b, 4, 16, 2, sharded) +
                          2 * EmbeddingSlots(kLlama3_8b, 4, 16) + 8 * kLlama3_8b.vocab;
    EXPECT_EQ(r->serving->lora_bytes, slots + IndexBytes(8192, 1024, 4)) << sharded;
  }
}

TEST(ServedLoraTest, TargetsAndClassesChooseTheModules) {
  // Only o_proj: its A and B in every layer.
  RunConfig c = ServedLora(8, 2);
  c.lora.target_modules = {"o_proj"};
  StatusOr<Report> o = Serve("llama-3-8b", c);
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->serving->lora_bytes, 32 * 2 * (2 * 8 * 4096 * 2) + IndexBytes(8192, 1024, 2));
  // A target no module has is ignored, as vLLM ignores it, and the note says so.
  c.lora.target_modules = {"o_proj", "q_proj"};
  StatusOr<Report> typo = Serve("llama-3-8b", c);
  ASSERT_TRUE(typo.ok()) << typo.status().message();
  EXPECT_EQ(typo->serving->lora_bytes, o->serving->lora_bytes);
  bool noted = false;
  for (const std::string& n : typo->notes) {
    noted |= n.find("target_modules 'q_proj' name no module vLLM wraps") != std::string::npos;
  }
  EXPECT_TRUE(noted);
  // MistralForCausalLM empties embedding_modules: the linears alone.
  constexpr Decoder kMistral{32, 4096, 32, 8, 128, 14336, 32000};
  StatusOr<Report> mistral = Serve("mistral-7b-v0.1", ServedLora(16, 4));
  ASSERT_TRUE(mistral.ok()) << mistral.status().message();
  EXPECT_EQ(mistral->serving->lora_bytes,
            LinearSlots(kMistral, 4, 16, 1, false) + IndexBytes(8192, 1024, 4));
  // Phi-3's fused qkv_proj and gate_up_proj are one slice each (packed_modules_mapping lists
  // themselves).
  StatusOr<Report> phi = Serve("phi-3-mini-4k", [] {
    RunConfig p = ServedLora(16, 1);
    p.serving.max_model_len = 4096;
    return p;
  }());
  ASSERT_TRUE(phi.ok()) << phi.status().message();
  const int64_t per_layer = 2 * (16 * 3072 + 9216 * 16 + 16 * 3072 + 3072 * 16 + 16 * 3072 +
                                 16384 * 16 + 16 * 8192 + 3072 * 16);
  const int64_t table = 2 * 2 * (32064 * 16 + 3072 * 16);  // embed_tokens and the logits
  EXPECT_EQ(phi->serving->lora_bytes, 32 * per_layer + table + IndexBytes(8192, 1024, 1));
  // Qwen3 with tied embeddings: lm_head is embed_tokens, wrapped a second time.
  RunConfig q = ServedLora(8, 1);
  q.serving.max_model_len = 4096;
  q.lora.target_modules = {"embed_tokens", "lm_head"};
  StatusOr<Report> qwen = Serve("qwen3-0.6b", q);
  ASSERT_TRUE(qwen.ok()) << qwen.status().message();
  const int64_t qwen_table = 2 * (151936 * 8 + 1024 * 8);
  EXPECT_EQ(qwen->serving->lora_bytes, 3 * qwen_table + IndexBytes(8192, 1024, 1));
}

TEST(ServedLoraTest, RefusesNamingTheField) {
  struct Case {
    const char* config;
    const char* field;
    void (*edit)(RunConfig*);
  };
  const Case cases[] = {
      {"llama-3-8b", "config.lora.rank", [](RunConfig* c) { c->lora.rank = 12; }},
      {"llama-3-8b", "config.lora.dropout", [](RunConfig* c) { c->lora.dropout = 0.05; }},
      {"llama-3-8b", "config.lora.use_dora", [](RunConfig* c) { c->lora.use_dora = true; }},
      {"llama-3-8b", "config.lora.modules_to_save",
       [](RunConfig* c) { c->lora.modules_to_save = {"lm_head"}; }},
      {"llama-3-8b", "config.lora.target_modules[0]",
       [](RunConfig* c) { c->lora.target_modules = {"all-linear"}; }},
      {"llama-3-8b", "config.serving.max_loras",
       [](RunConfig* c) {
         c->lora.rank = 0;
         c->serving.max_loras = 4;
       }},
      {"llama-3-8b", "config.serving.fully_sharded_loras",
       [](RunConfig* c) {
         c->lora.rank = 0;
         c->serving.max_loras = 0;
         c->serving.fully_sharded_loras = true;
       }},
      {"llama-3-8b", "config.serving.max_loras",
       [](RunConfig* c) { c->serving.max_loras = kMaxServingLoras + 1; }},
      {"llama-3-8b", "config.lora.rank",
       [](RunConfig* c) {
         c->lora.rank = 1;
         c->parallelism.tensor = 2;
         c->serving.fully_sharded_loras = true;
       }},
      {"gpt2", "config.lora", [](RunConfig* c) { c->serving.max_model_len = 1024; }},
      {"mixtral-8x7b", "config.lora", [](RunConfig*) {}},
  };
  for (const Case& k : cases) {
    RunConfig c = ServedLora(16, 4);
    k.edit(&c);
    StatusOr<Report> r = Serve(k.config, c);
    ASSERT_FALSE(r.ok()) << k.field;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << k.field;
    EXPECT_EQ(r.status().message().rfind(k.field, 0), 0u) << r.status().message();
  }
}

}  // namespace
}  // namespace memest
