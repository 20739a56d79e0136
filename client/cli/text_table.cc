#include "client/cli/text_table.h"

#include <algorithm>
#include <utility>

namespace memest::cli {

TextTable::TextTable(std::vector<Column> columns, int indent)
    : columns_(std::move(columns)), indent_(indent) {}

void TextTable::AddRow(std::vector<std::string> cells) {
  cells.resize(columns_.size());
  rows_.push_back(std::move(cells));
}

void TextTable::AddRule() { rows_.emplace_back(); }

void TextTable::Print(std::ostream& out) const {
  std::vector<size_t> widths(columns_.size());
  for (size_t c = 0; c < columns_.size(); ++c) {
    widths[c] = columns_[c].header.size();
    for (const auto& row : rows_) {
      if (!row.empty()) widths[c] = std::max(widths[c], row[c].size());
    }
  }
  size_t total = 0;
  for (size_t w : widths) total += w;
  total += 2 * (widths.empty() ? 0 : widths.size() - 1);

  auto print_cells = [&](const std::vector<std::string>& cells) {
    std::string line(indent_, ' ');
    for (size_t c = 0; c < columns_.size(); ++c) {
      if (c > 0) line += "  ";
      const size_t pad = widths[c] - cells[c].size();
      if (columns_[c].align == Align::kRight) line.append(pad, ' ');
      line += cells[c];
      if (columns_[c].align == Align::kLeft && c + 1 < columns_.size()) line.append(pad, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << '\n';
  };

  std::vector<std::string> headers;
  for (const Column& column : columns_) headers.push_back(column.header);
  print_cells(headers);
  for (const auto& row : rows_) {
    if (row.empty()) {
      out << std::string(indent_, ' ') << std::string(total, '-') << '\n';
    } else {
      print_cells(row);
    }
  }
}

}  // namespace memest::cli
