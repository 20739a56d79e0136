// The golden corpus (tests/golden/corpus.h): every configuration's whole answer, as the service's
// handler gives it, must be the one recorded in tests/data/golden/estimates.tsv, to the byte (a
// SHA-256 of the response serialized deterministically, or of the refusal's code and message).
// The peaks are recorded beside the hash so that a difference reads as numbers.
//
// Record again, after a change meant to change answers, with
//   MEMEST_GOLDEN_UPDATE=1 build/bin/golden_tests
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <gtest/gtest.h>
#include <openssl/sha.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "client/cli/flags.h"
#include "server/estimator_service.h"
#include "server/status_conversion.h"
#include "tests/golden/corpus.h"

namespace memest::golden {
namespace {

constexpr char kCorpus[] = "tests/data/golden/estimates.tsv";

struct Record {
  std::string code, hash;
  int64_t peak_allocated = 0, peak_reserved = 0, ops = 0;
  std::string Line() const {
    return code + "\t" + hash + "\t" + std::to_string(peak_allocated) + "\t" +
           std::to_string(peak_reserved) + "\t" + std::to_string(ops);
  }
};

std::string Sha256(const std::string& bytes) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), digest);
  std::string hex;
  char two[3];
  for (unsigned char b : digest) {
    std::snprintf(two, sizeof(two), "%02x", b);
    hex += two;
  }
  return hex;
}

std::string Deterministic(const google::protobuf::Message& message) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&coded);
  }
  return bytes;
}

// The answer to one line of flags.
Record Answer(const std::string& line) {
  CLI::App app{"golden"};
  cli::EstimateFlags flags;
  cli::AddEstimateFlags(&app, &flags);
  Record record;
  if (Status parsed = cli::ParseWords(&app, cli::SplitWords(line)); !parsed.ok()) {
    record.code = "FLAGS";
    record.hash = Sha256(parsed.message());
    return record;
  }
  StatusOr<v1::EstimateRequest> request = cli::BuildEstimateRequest(flags);
  Status status = request.status();
  v1::EstimateResponse response;
  if (status.ok()) status = HandleEstimate(*request, ServiceOptions{}, &response);
  record.code = StatusCodeName(status.code());
  if (!status.ok()) {
    record.hash = Sha256(status.message());
    return record;
  }
  record.hash = Sha256(Deterministic(response));
  record.peak_allocated = response.peak().allocated_bytes();
  record.peak_reserved = response.peak_reserved_bytes();
  record.ops = response.op_count();
  return record;
}

TEST(GoldenTest, EveryAnswerIsTheRecordedOne) {
  ASSERT_EQ(chdir(MEMEST_SOURCE_DIR), 0);
  const std::vector<std::string> configurations = Configurations();
  ASSERT_GE(configurations.size(), 1000u);
  const auto start = std::chrono::steady_clock::now();
  std::vector<Record> records;
  for (const std::string& line : configurations) records.push_back(Answer(line));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("golden: %zu configurations answered in %.1f s\n", records.size(), seconds);

  if (std::getenv("MEMEST_GOLDEN_UPDATE") != nullptr) {
    std::ofstream out(kCorpus);
    out << "# configuration (memest estimate flags)\tcode\tsha256\tpeak_allocated\t"
           "peak_reserved\tops: written by MEMEST_GOLDEN_UPDATE=1 build/bin/golden_tests\n";
    for (size_t i = 0; i < records.size(); ++i) {
      out << configurations[i] << "\t" << records[i].Line() << "\n";
    }
    std::printf("golden: recorded %s\n", kCorpus);
    return;
  }
  std::ifstream in(kCorpus);
  ASSERT_TRUE(in) << "no " << kCorpus << ": record it with MEMEST_GOLDEN_UPDATE=1";
  std::map<std::string, std::string> recorded;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t tab = line.find('\t');
    recorded[line.substr(0, tab)] = line.substr(tab + 1);
  }
  int differences = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    const auto it = recorded.find(configurations[i]);
    const std::string now = records[i].Line();
    if (it != recorded.end() && it->second == now) continue;
    if (++differences <= 20) {
      ADD_FAILURE() << configurations[i] << "\n  recorded: "
                    << (it == recorded.end() ? "(not in the corpus)" : it->second)
                    << "\n  now:      " << now;
    }
  }
  EXPECT_EQ(differences, 0) << differences << " of " << records.size()
                            << " answers differ from the recorded ones";
  EXPECT_EQ(recorded.size(), records.size()) << "the corpus holds configurations no longer made";
}

// The recorded answers of the corpus, by configuration line.
std::map<std::string, std::string> Recorded() {
  std::ifstream in(kCorpus);
  std::map<std::string, std::string> recorded;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t tab = line.find('\t');
    recorded[line.substr(0, tab)] = line.substr(tab + 1);
  }
  return recorded;
}

// The Sweep of each model (with the same advice and layer rows) over every configuration of the
// corpus gives, for each, the recorded answer, or the refusal Estimate gives it: a sweep shares
// graphs between configurations, and no answer may change for it.
TEST(GoldenTest, SweepsGiveEveryRecordedAnswer) {
  ASSERT_EQ(chdir(MEMEST_SOURCE_DIR), 0);
  const std::map<std::string, std::string> recorded = Recorded();
  ASSERT_FALSE(recorded.empty()) << "no " << kCorpus;
  struct Group {
    v1::SweepRequest request;
    std::vector<std::string> lines;
  };
  std::vector<Group> groups;
  std::map<std::string, size_t> group_of;
  for (const std::string& line : Configurations()) {
    CLI::App app{"golden"};
    cli::EstimateFlags flags;
    cli::AddEstimateFlags(&app, &flags);
    if (!cli::ParseWords(&app, cli::SplitWords(line)).ok()) continue;
    StatusOr<v1::EstimateRequest> request = cli::BuildEstimateRequest(flags);
    if (!request.ok()) continue;
    const std::string key = Deterministic(request->model()) + "|" +
                            std::to_string(request->skip_advice()) + "|" +
                            (request->has_max_layer_rows()
                                 ? std::to_string(request->max_layer_rows()) : "all");
    auto [it, added] = group_of.emplace(key, groups.size());
    if (added) {
      Group g;
      *g.request.mutable_model() = request->model();
      g.request.set_skip_advice(request->skip_advice());
      if (request->has_max_layer_rows()) g.request.set_max_layer_rows(request->max_layer_rows());
      groups.push_back(std::move(g));
    }
    *groups[it->second].request.add_configs() = request->config();
    groups[it->second].lines.push_back(line);
  }
  const auto start = std::chrono::steady_clock::now();
  int answered = 0, differences = 0;
  for (const Group& g : groups) {
    std::vector<v1::SweepResult> results;
    Budget each;
    each.set_max_op_steps(ServiceOptions{}.max_op_steps);
    const Status swept = HandleSweep(g.request, ServiceOptions{}, each,
                                     [&results](const v1::SweepResult& r) {
                                       results.push_back(r);
                                       return true;
                                     });
    for (size_t i = 0; i < g.lines.size(); ++i) {
      ++answered;
      std::string now;
      const v1::SweepResult* r = i < results.size() ? &results[i] : nullptr;
      if (r != nullptr && r->index() == static_cast<int64_t>(i) && r->has_estimate()) {
        Record record;
        record.code = "OK";
        record.hash = Sha256(Deterministic(r->estimate()));
        record.peak_allocated = r->estimate().peak().allocated_bytes();
        record.peak_reserved = r->estimate().peak_reserved_bytes();
        record.ops = r->estimate().op_count();
        now = record.Line();
      } else {
        // A refusal, of this configuration or of the whole sweep: Estimate's, as gRPC sends it.
        v1::EstimateRequest alone;
        *alone.mutable_model() = g.request.model();
        *alone.mutable_config() = g.request.configs(static_cast<int>(i));
        alone.set_skip_advice(g.request.skip_advice());
        if (g.request.has_max_layer_rows()) alone.set_max_layer_rows(g.request.max_layer_rows());
        v1::EstimateResponse ignored;
        const grpc::Status want = ToGrpcStatus(HandleEstimate(alone, ServiceOptions{}, &ignored));
        const grpc::Status got = r != nullptr && r->has_error()
                                     ? grpc::Status(static_cast<grpc::StatusCode>(r->error().code()),
                                                    r->error().message())
                                     : ToGrpcStatus(swept);
        if (!want.ok() && got.error_code() == want.error_code() &&
            got.error_message() == want.error_message()) {
          continue;
        }
        now = "code " + std::to_string(got.error_code()) + ": " + got.error_message() +
              " (Estimate: code " + std::to_string(want.error_code()) + ")";
      }
      const auto it = recorded.find(g.lines[i]);
      if (it != recorded.end() && it->second == now) continue;
      if (++differences <= 20) {
        ADD_FAILURE() << g.lines[i] << "\n  recorded: "
                      << (it == recorded.end() ? "(not in the corpus)" : it->second)
                      << "\n  swept:    " << now;
      }
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("golden: %d configurations swept in %zu sweeps, %.1f s\n", answered, groups.size(),
              seconds);
  EXPECT_GE(answered, 1000);
  EXPECT_EQ(differences, 0) << differences << " of " << answered
                            << " swept answers differ from the recorded ones";
}

}  // namespace
}  // namespace memest::golden
