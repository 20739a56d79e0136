// `memest sweep`'s table (client/cli/render.h).
#include <string>
#include <utility>

#include "client/cli/exit_codes.h"
#include "client/cli/render.h"
#include "client/cli/units.h"

namespace memest::cli {
namespace {

std::vector<TextTable::Column> SweepColumns(const std::vector<std::string>& headers) {
  std::vector<TextTable::Column> columns;
  for (const std::string& h : headers) columns.push_back({h});
  for (const char* h : {"peak allocated", "reserved", "needs", "fits"}) {
    columns.push_back({h, TextTable::Align::kRight});
  }
  return columns;
}

}  // namespace

SweepTable::SweepTable(std::vector<std::string> headers)
    : columns_(headers.size()), table_(SweepColumns(headers)) {}

void SweepTable::Add(std::vector<std::string> values, const v1::SweepResult& r) {
  values.resize(columns_);
  if (r.has_estimate()) {
    const v1::EstimateResponse& e = r.estimate();
    values.push_back(FormatBytes(static_cast<int64_t>(e.peak().allocated_bytes())));
    values.push_back(FormatBytes(static_cast<int64_t>(e.peak_reserved_bytes())));
    values.push_back(e.has_fit() ? FormatBytes(static_cast<int64_t>(e.fit().required_bytes()))
                                 : "-");
    values.push_back(!e.has_fit() ? "-" : e.fit().fits() ? "yes" : "no");
  } else {
    values.insert(values.end(), {"-", "-", "-", "refused"});
    const std::string status =
        GrpcCodeName(static_cast<grpc::StatusCode>(r.error().code())) + ": " + r.error().message();
    const std::string index = std::to_string(r.index());
    auto [seen, added] = refusal_of_.emplace(status, refusals_.size());
    if (added) {
      refusals_.emplace_back(index, status);
    } else {
      refusals_[seen->second].first += ", " + index;
    }
  }
  table_.AddRow(std::move(values));
}

void SweepTable::Print(std::ostream& out) const {
  table_.Print(out);
  for (const auto& [indices, status] : refusals_) {
    out << "  [" << indices << "] " << status << '\n';
  }
}

}  // namespace memest::cli
