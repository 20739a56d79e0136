// docs/published.md, re-run: every table row of that page that gives a `build/bin/memest
// estimate ...` command is run with the built binary (plus --json), and memest's peak allocated
// bytes, in the table's unit (MB = 1e6 bytes or GB = 1e9 bytes, from the header) and printed with
// as many decimals as the page prints, must read as the page's "memest" cell; the "difference"
// cell must read as (memest - published) / published, in percent with two decimals. A change to
// the engine that moves a published comparison fails here until the page says so.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli/subprocess.h"

namespace memest {
namespace {

using ::memest::testing::RunResult;

const std::string kMemest = MEMEST_CLI_PATH;
const std::string kSourceDir = MEMEST_SOURCE_DIR;
constexpr char kCommandPrefix[] = "build/bin/memest estimate";

std::string Trim(const std::string& s) {
  const size_t begin = s.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t") - begin + 1);
}

// The cells of a Markdown table row "| a | b |", trimmed.
std::vector<std::string> Cells(const std::string& line) {
  std::vector<std::string> cells;
  std::stringstream in(line);
  std::string cell;
  std::getline(in, cell, '|');  // before the first '|'
  while (std::getline(in, cell, '|')) cells.push_back(Trim(cell));
  if (!cells.empty() && cells.back().empty()) cells.pop_back();  // after the last '|'
  return cells;
}

std::vector<std::string> Words(const std::string& s) {
  std::vector<std::string> words;
  std::stringstream in(s);
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

int Decimals(const std::string& number) {
  const size_t dot = number.find('.');
  return dot == std::string::npos ? 0 : static_cast<int>(number.size() - dot - 1);
}

std::string Format(const char* format, double value, int decimals = 0) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), format, decimals, value);
  return buffer;
}

struct Row {
  int line = 0;
  std::string label, published, memest, difference, command;
  double unit = 0;  // bytes per printed unit
};

// The rows of docs/published.md's comparison tables: "| row | published (U) | memest (U) |
// difference | command |" with U = MB or GB.
std::vector<Row> ReadRows() {
  std::ifstream in(kSourceDir + "/docs/published.md");
  EXPECT_TRUE(in.good()) << "cannot read docs/published.md";
  std::vector<Row> rows;
  double unit = 0;
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    const std::vector<std::string> cells = Cells(line);
    if (cells.size() == 5 && cells[0] == "row") {
      unit = cells[2] == "memest (MB)" ? 1e6 : cells[2] == "memest (GB)" ? 1e9 : 0;
      EXPECT_NE(unit, 0) << "line " << number << ": unknown unit in " << cells[2];
      continue;
    }
    if (cells.size() != 5 || cells[4].rfind(std::string("`") + kCommandPrefix, 0) != 0) continue;
    EXPECT_NE(unit, 0) << "line " << number << ": a row before any table header";
    const std::string& code = cells[4];
    rows.push_back({number, cells[0], cells[1], cells[2], cells[3],
                    code.substr(1, code.size() - 2), unit});
  }
  return rows;
}

TEST(PublishedTest, EveryRowReadsAsMemestPrintsIt) {
  const std::vector<Row> rows = ReadRows();
  // Sources A to D of the page: 12 + 4 + 16 + 2 rows. Fewer means the parser lost some.
  ASSERT_GE(rows.size(), 34u);
  for (const Row& row : rows) {
    SCOPED_TRACE("docs/published.md:" + std::to_string(row.line) + " (" + row.label + ")");
    std::vector<std::string> argv = Words(row.command);
    ASSERT_GE(argv.size(), 2u);
    argv[0] = kMemest;
    for (std::string& arg : argv) {
      if (arg.rfind("docs/", 0) == 0) arg = kSourceDir + "/" + arg;  // model files
    }
    argv.push_back("--json");
    const RunResult r = ::memest::testing::Run(argv);  // not Test::Run
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json response = nlohmann::json::parse(r.out);
    const nlohmann::json& bytes = response.at("peak").at("allocatedBytes");
    const double value =
        static_cast<double>(bytes.is_string() ? std::stoll(bytes.get<std::string>())
                                              : bytes.get<int64_t>()) /
        row.unit;
    EXPECT_EQ(Format("%.*f", value, Decimals(row.memest)), row.memest)
        << "memest now prints " << value << " for this row";
    const double published = std::stod(row.published);
    EXPECT_EQ(Format("%+.*f%%", 100 * (value - published) / published, 2), row.difference);
  }
}

}  // namespace
}  // namespace memest
