// A served model's startup for a terminal (client/cli/render.h, RenderServing): vLLM's budget
// on one GPU, the KV cache's pages and what they hold, and whether the server starts.
#include <cstdio>
#include <ostream>
#include <string>

#include "client/cli/render.h"
#include "client/cli/text_table.h"
#include "client/cli/units.h"

namespace memest::cli {
namespace {

std::string Bytes(uint64_t bytes) { return FormatBytes(static_cast<int64_t>(bytes)); }

// 476,016: as vLLM's log prints its token counts.
std::string Grouped(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (n < 0 ? "-" : "") + out;
}

std::string Times(double x) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2fx", x);
  return text;
}

}  // namespace

void RenderServing(const v1::EstimateResponse& response, std::ostream& out) {
  if (!response.has_serving()) return;
  const v1::ServingReport& s = response.serving();
  const v1::DeviceFit& fit = response.fit();
  out << "Served by vLLM on " << fit.device() << " (" << Bytes(fit.capacity_bytes())
      << "): " << (s.starts() ? "STARTS" : "DOES NOT START") << "\n"
      << "  gpu_memory_utilization " << s.gpu_memory_utilization() << ", max_model_len "
      << s.max_model_len() << ", max_num_seqs " << s.max_num_seqs()
      << ", max_num_batched_tokens " << s.max_num_batched_tokens() << ", block_size "
      << s.block_size() << ", kv_cache_dtype " << s.kv_cache_dtype() << "\n\n";
  using Align = TextTable::Align;
  TextTable budget({{"startup budget"}, {"bytes", Align::kRight}});
  budget.AddRow({"requested (total x utilization)", Bytes(s.requested_bytes())});
  budget.AddRow({"  weights", Bytes(s.weights_bytes())});
  if (s.lora_bytes() > 0) budget.AddRow({"    of which LoRA slots", Bytes(s.lora_bytes())});
  budget.AddRow({"  profile run's activation peak", Bytes(s.activation_peak_bytes())});
  budget.AddRow({"  outside PyTorch's allocator", Bytes(s.non_torch_bytes())});
  budget.AddRow({"  KV cache", FormatBytes(s.kv_cache_bytes())});
  budget.AddRow({"before the budget (CUDA context, NCCL)", Bytes(s.baseline_bytes())});
  budget.AddRow({"the server on the GPU (before CUDA graphs)", Bytes(fit.required_bytes())});
  budget.Print(out);
  out << "\nKV cache: " << Grouped(s.num_blocks()) << " blocks of " << s.block_size()
      << " tokens, " << Bytes(s.kv_bytes_per_token()) << " a token over " << s.kv_layers()
      << " layers: " << Grouped(s.kv_tokens()) << " tokens\n"
      << "  maximum concurrency for " << s.max_model_len() << " tokens per request: "
      << Times(s.max_concurrency()) << "\n"
      << "  requests of " << s.request_tokens() << " tokens at once: " << s.concurrent_requests()
      << (s.concurrent_requests() == s.max_num_seqs() ? " (max_num_seqs)" : "") << "\n";
  if (s.concurrency() > 0) {
    out << "  the longest request with " << s.concurrency()
        << " at once: " << s.longest_request() << " tokens\n";
  }
  if (!s.starts()) out << "  vLLM refuses to start: " << s.refusal() << "\n";
  out << "\nIts profile run at startup (" << s.max_num_batched_tokens() << " tokens in "
      << s.profile_requests() << " requests, then the sampler), before the KV cache exists:\n";
}

}  // namespace memest::cli
