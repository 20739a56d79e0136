// A plain-text table with aligned columns, for the `memest` reports.
#ifndef MEMEST_CLIENT_CLI_TEXT_TABLE_H_
#define MEMEST_CLIENT_CLI_TEXT_TABLE_H_

#include <ostream>
#include <string>
#include <vector>

namespace memest::cli {

// Columns are left-aligned or right-aligned (numbers); cells are padded to the widest cell
// of their column, columns separated by two spaces, rows indented by `indent` spaces.
class TextTable {
 public:
  enum class Align { kLeft, kRight };
  struct Column {
    std::string header;
    Align align = Align::kLeft;
  };

  explicit TextTable(std::vector<Column> columns, int indent = 2);

  // Adds a row; missing trailing cells are empty, extra cells are dropped.
  void AddRow(std::vector<std::string> cells);
  // Adds a horizontal rule under the previous row.
  void AddRule();
  void Print(std::ostream& out) const;

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;  // an empty row is a rule
  int indent_;
};

}  // namespace memest::cli

#endif  // MEMEST_CLIENT_CLI_TEXT_TABLE_H_
