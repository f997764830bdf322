#include "apps/vtoken-cli/commands/table_writer.h"

#include <charconv>
#include <cmath>
#include <cstdint>

namespace vtoken::cli {
namespace {

std::string NumberText(double v) {
  char buf[32];
  return std::string(buf, std::to_chars(buf, buf + sizeof(buf), v).ptr);
}

}  // namespace

Cell Number(double v) { return std::isfinite(v) ? Cell(v) : Cell(); }

Cell ConfigCell(const std::string& text) {
  const char* end = text.data() + text.size();
  int64_t i = 0;
  if (auto r = std::from_chars(text.data(), end, i); r.ec == std::errc() && r.ptr == end) {
    return i;
  }
  double d = 0;
  if (auto r = std::from_chars(text.data(), end, d); r.ec == std::errc() && r.ptr == end) {
    return Number(d);
  }
  if (text == "true" || text == "false") return text == "true";
  return text;
}

TableWriter::TableWriter(std::FILE* out, bool csv, std::vector<std::string> columns)
    : out_(out), csv_(csv), columns_(std::move(columns)) {
  if (!csv_) return;
  for (size_t i = 0; i < columns_.size(); ++i) {
    std::fputs(i ? "," : "", out_);
    std::fputs(CsvField(columns_[i]).c_str(), out_);
  }
  std::fputc('\n', out_);
}

void TableWriter::Write(const std::vector<Cell>& row) {
  if (csv_) {
    for (size_t i = 0; i < row.size(); ++i) {
      std::fputs(i ? "," : "", out_);
      std::fputs(CsvText(row[i]).c_str(), out_);
    }
  } else {
    nlohmann::ordered_json object = nlohmann::ordered_json::object();
    for (size_t i = 0; i < row.size(); ++i) object[columns_[i]] = Json(row[i]);
    // Generated text may hold invalid UTF-8 (a token split mid-character): replace, not throw.
    std::fputs(object.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str(), out_);
  }
  std::fputc('\n', out_);
}

std::string TableWriter::CsvField(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string TableWriter::CsvText(const Cell& cell) {
  if (const auto* b = std::get_if<bool>(&cell)) return *b ? "true" : "false";
  if (const auto* i = std::get_if<int64_t>(&cell)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&cell)) return NumberText(*d);
  if (const auto* s = std::get_if<std::string>(&cell)) return CsvField(*s);
  return "";
}

nlohmann::ordered_json TableWriter::Json(const Cell& cell) {
  if (const auto* b = std::get_if<bool>(&cell)) return *b;
  if (const auto* i = std::get_if<int64_t>(&cell)) return *i;
  if (const auto* d = std::get_if<double>(&cell)) return *d;
  if (const auto* s = std::get_if<std::string>(&cell)) return *s;
  return nullptr;
}

}  // namespace vtoken::cli
