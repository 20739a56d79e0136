#include "tests/golden/corpus.h"

#include <algorithm>
#include <filesystem>

namespace memest::golden {
namespace {

const char* const kPresets[] = {"gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl", "llama-7b",
                                "llama-13b",  "llama-70b",   "bert-base",  "vit-b16", "resnet18",
                                "resnet50",   "unet-down",   "mlp"};
const char* const kLlms[] = {"gpt2-small", "gpt2-xl", "llama-7b", "llama-13b", "llama-70b"};

std::vector<std::string> Sorted(const std::filesystem::path& dir, const std::string& extension) {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == extension) files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

std::vector<std::string> Configurations() {
  std::vector<std::string> out;
  const auto add = [&out](const std::string& line) { out.push_back(line); };
  for (const std::string preset : kPresets) {
    const std::string p = "--preset " + preset;
    // Training: precision x optimizer x checkpointing x batch, on an A100, no advice.
    for (const char* precision : {"fp32", "bf16", "bf16-pure", "fp16"}) {
      for (const char* optimizer : {"adamw", "sgd", "adafactor"}) {
        for (const char* checkpoint : {"none", "every-block"}) {
          for (const char* batch : {"1", "8", "32"}) {
            add(p + " --precision " + precision + " --optimizer " + optimizer + " --checkpoint " +
                checkpoint + " --batch " + batch + " --device a100-80gb --no-advice");
          }
        }
      }
    }
    // With advice, on a large GPU and a small one; the first step; the outputs not held.
    add(p + " --precision bf16 --batch 8 --device a100-80gb");
    add(p + " --precision bf16 --batch 8 --device l4");
    add(p + " --precision bf16 --batch 4 --first-step --device h100-80gb --no-advice");
    add(p + " --precision bf16 --batch 4 --no-hold-outputs --keep-grads --no-advice");
    // Inference, and the CPU runtime of the conformance suite.
    add(p + " --mode inference --precision fp16-pure --batch 1 --device a10g --no-advice");
    add(p + " --runtime cpu-1.13 --batch 2 --no-advice");
    add(p + " --batch 2 --no-advice --layer-rows 3");
  }
  for (const std::string llm : kLlms) {
    const std::string p = "--preset " + llm + " --precision bf16 --batch 4 --no-advice";
    // DeepSpeed keeps the model in 16 bits itself: the parallel runs are bf16-pure.
    const std::string pure = "--preset " + llm + " --precision bf16-pure --batch 4 --no-advice";
    for (const char* seq : {"512", "2048"}) add(p + " --seq " + seq);
    add("--preset " + llm +
        " --mode inference --precision bf16-pure --batch 2 --generate-tokens 64 "
        "--no-advice");
    for (const char* attention : {"eager", "flash", "mem-efficient"}) {
      add(p + " --attention " + attention);
    }
    for (const char* strategy :
         {"ddp", "zero1", "deepspeed-zero2", "deepspeed-zero3", "fsdp1", "fsdp2"}) {
      add(pure + " --data-parallel 4 --dp-strategy " + strategy);
    }
    add(pure + " --tensor-parallel 2 --sequence-parallel");
    add(pure + " --pipeline 2 --grad-accum 4");
    add(pure + " --data-parallel 2 --tensor-parallel 2 --pipeline 2 --grad-accum 4");
  }
  // Hugging Face configs: training, inference, checkpointing and flash attention.
  for (const std::string& config : Sorted("tests/data/hf_configs", ".json")) {
    const std::string c = "--hf-config " + config + " --seq 512 --batch 1 --no-advice";
    add(c + " --precision bf16-pure");
    add(c + " --precision bf16-pure --checkpoint every-block --attention flash");
    add(c + " --mode inference --precision bf16-pure --device h100-80gb");
    add(c + " --precision bf16 --lora-rank 16 --lora-targets all-linear");
  }
  // LoRA, QLoRA and serving on a few of them.
  const std::string configs = "tests/data/hf_configs/";
  for (const char* model : {"llama-3-8b.json", "mistral-7b-v0.1.json", "mixtral-8x7b.json"}) {
    const std::string c = "--hf-config " + configs + model + " --seq 1024 --batch 2 --no-advice";
    add(c + " --quantize bnb-nf4 --lora-rank 16 --lora-targets all-linear --precision bf16");
    add(c + " --quantize bnb-int8 --lora-rank 8 --lora-targets all-linear --precision bf16");
    const std::string served = "--hf-config " + configs + model + " --serve --no-advice";
    add(served + " --device h100-80gb --max-model-len 4096");
    add(served + " --device h100-80gb --tensor-parallel 2 --max-model-len 8192");
  }
  add("--hf-config " + configs + "deepseek-v3.json --serve --no-advice --device h200-141gb " +
      "--tensor-parallel 8 --max-model-len 8192");
  // The example model files.
  for (const std::string& file : Sorted("examples", ".json")) {
    add("--model " + file + " --batch 8 --no-advice");
    add("--model " + file + " --batch 8 --precision bf16 --device t4");
  }
  for (const std::string& file : Sorted("examples", ".yaml")) {
    add("--model " + file + " --batch 8 --no-advice");
  }
  return out;
}

}  // namespace memest::golden
