// Rows of typed cells written as CSV or JSON lines: `vtoken-cli export`'s output. Thread-
// compatible.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

namespace vtoken::cli {

// One value of the output; monostate is "no value" (a NaN figure, a key a run lacks): an empty
// CSV field, a JSON null.
using Cell = std::variant<std::monostate, bool, int64_t, double, std::string>;

// A finite number, or no value (NaN, infinity).
Cell Number(double v);

// A config value as its type: TOML integers, floats and booleans become numbers and booleans in
// JSON; everything else (strings, arrays) stays text.
Cell ConfigCell(const std::string& text);

// Writes rows of cells as CSV (RFC 4180: a header line; fields holding a comma, quote or line
// break are quoted, quotes doubled; numbers in their shortest round-trip form) or as JSON lines
// (one object per row, keys in column order; invalid UTF-8 replaced).
class TableWriter {
 public:
  // Writes the CSV header at once.
  TableWriter(std::FILE* out, bool csv, std::vector<std::string> columns);

  // REQUIRES: row.size() == the number of columns.
  void Write(const std::vector<Cell>& row);

 private:
  static std::string CsvField(const std::string& s);
  static std::string CsvText(const Cell& cell);
  static nlohmann::ordered_json Json(const Cell& cell);

  std::FILE* out_;
  bool csv_;
  std::vector<std::string> columns_;
};

}  // namespace vtoken::cli
