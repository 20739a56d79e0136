// `memest sweep`'s table (client/cli/render.h).
#include <algorithm>
#include <string>
#include <utility>

#include "client/cli/exit_codes.h"
#include "client/cli/render.h"
#include "client/cli/text_table.h"
#include "client/cli/units.h"

namespace memest::cli {

void RenderSweep(const std::vector<std::string>& headers,
                 const std::vector<std::vector<std::string>>& values,
                 const std::vector<v1::SweepResult>& results, std::ostream& out) {
  std::vector<TextTable::Column> columns;
  for (const std::string& h : headers) columns.push_back({h});
  for (const char* h : {"peak allocated", "reserved", "needs", "fits"}) {
    columns.push_back({h, TextTable::Align::kRight});
  }
  TextTable table(columns);
  // Each refusal once, with the configurations it refused: "[2, 5] NOT_FOUND: ...".
  std::vector<std::pair<std::string, std::string>> refusals;  // (indices, status)
  for (const v1::SweepResult& r : results) {
    const size_t i = static_cast<size_t>(r.index());
    std::vector<std::string> row = i < values.size() ? values[i] : std::vector<std::string>();
    row.resize(headers.size());
    if (r.has_estimate()) {
      const v1::EstimateResponse& e = r.estimate();
      row.push_back(FormatBytes(static_cast<int64_t>(e.peak().allocated_bytes())));
      row.push_back(FormatBytes(static_cast<int64_t>(e.peak_reserved_bytes())));
      row.push_back(e.has_fit() ? FormatBytes(static_cast<int64_t>(e.fit().required_bytes()))
                                : "-");
      row.push_back(!e.has_fit() ? "-" : e.fit().fits() ? "yes" : "no");
    } else {
      row.insert(row.end(), {"-", "-", "-", "refused"});
      const std::string status = GrpcCodeName(static_cast<grpc::StatusCode>(r.error().code())) +
                                 ": " + r.error().message();
      auto same = std::find_if(refusals.begin(), refusals.end(),
                               [&](const auto& seen) { return seen.second == status; });
      if (same == refusals.end()) {
        refusals.emplace_back(std::to_string(i), status);
      } else {
        same->first += ", " + std::to_string(i);
      }
    }
    table.AddRow(std::move(row));
  }
  table.Print(out);
  for (const auto& [indices, status] : refusals) {
    out << "  [" << indices << "] " << status << '\n';
  }
}

}  // namespace memest::cli
