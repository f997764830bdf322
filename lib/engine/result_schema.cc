#include "lib/engine/result_schema.h"

#include <cmath>
#include <nlohmann/json.hpp>

namespace vtoken::engine {
namespace schema_internal {

sql::Value FinishedToValue(const RunRecord& r) {
  return r.finished.empty() ? sql::Value() : sql::Value(r.finished);
}

bool FinishedFromValue(RunRecord& r, const sql::Value& v) { return FromValue(v, r.finished); }

sql::Value TokenIdsToValue(const OutputRecord& r) { return nlohmann::json(r.token_ids).dump(); }

bool TokenIdsFromValue(OutputRecord& r, const sql::Value& v) {
  const auto* text = std::get_if<std::string>(&v);
  if (text == nullptr) return false;
  const auto ids = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!ids.is_array()) return false;
  r.token_ids.clear();
  for (const auto& id : ids) {
    if (!id.is_number_integer()) return false;
    r.token_ids.push_back(id.get<int32_t>());
  }
  return true;
}

}  // namespace schema_internal
namespace {

constexpr std::string_view kRunIdColumn =
    "run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE";

template <typename Record>
std::string CreateTable(const Table<Record>& table) {
  std::string sql = "CREATE TABLE IF NOT EXISTS " + std::string(table.name) + " (";
  if (table.child) sql += std::string(kRunIdColumn) + ", ";
  for (size_t i = 0; i < table.columns.size(); ++i) {
    if (i > 0) sql += ", ";
    sql += std::string(table.columns[i].name) + " " + std::string(table.columns[i].decl);
  }
  if (!table.tail.empty()) return sql + ", " + std::string(table.tail);
  return sql + ")";
}

template <typename Record>
void AddColumns(const Table<Record>& table, int version, std::vector<std::string>& out) {
  for (const Column<Record>& c : table.columns) {
    if (c.since <= version) continue;
    out.push_back("ALTER TABLE " + std::string(table.name) + " ADD COLUMN " + std::string(c.name) +
                  " " + std::string(c.decl));
  }
}

// The key/value tables of a run's summary figures.
constexpr std::string_view kSummaryDdl[] = {
    R"(CREATE TABLE IF NOT EXISTS summary (
      run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
      name TEXT NOT NULL, value REAL,
      PRIMARY KEY (run_id, name)) WITHOUT ROWID)",
    R"(CREATE TABLE IF NOT EXISTS summary_text (
      run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
      name TEXT NOT NULL, value TEXT NOT NULL,
      PRIMARY KEY (run_id, name)) WITHOUT ROWID)",
};

}  // namespace

std::optional<double> RequestColumnValue(const RequestRecord& r, std::string_view column) {
  for (const Column<RequestRecord>& c : kRequestColumns) {
    if (c.name != column) continue;
    const sql::Value v = c.get(r);
    if (const auto* d = std::get_if<double>(&v)) return *d;
    if (const auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
    return std::nullopt;
  }
  return std::nullopt;
}

bool HasPerRequestFigure(const std::map<std::string, double>& summary) {
  for (const PerRequestFigure& f : kPerRequestFigures) {
    auto it = summary.find(std::string(f.summary));
    if (it != summary.end() && !std::isnan(it->second)) return true;
  }
  return false;
}

PerRequestValues CollectPerRequest(const std::vector<RequestRecord>& requests,
                                   const std::map<std::string, double>& summary) {
  PerRequestValues out;
  for (const PerRequestFigure& f : kPerRequestFigures) {
    auto it = summary.find(std::string(f.summary));
    if (it == summary.end() || std::isnan(it->second)) continue;
    std::vector<double> values;
    for (const RequestRecord& q : requests) {
      if (std::optional<double> v = RequestColumnValue(q, f.column)) values.push_back(*v);
    }
    if (!values.empty()) out[std::string(f.summary)] = std::move(values);
  }
  return out;
}

PerRequestValues PoolPerRequest(const std::vector<const PerRequestValues*>& runs) {
  PerRequestValues out;
  if (runs.empty()) return out;
  for (const auto& [name, first] : *runs.front()) {
    std::vector<double> pooled;
    bool all = true;
    for (const PerRequestValues* run : runs) {
      auto it = run->find(name);
      if (it == run->end()) {
        all = false;
        break;
      }
      pooled.insert(pooled.end(), it->second.begin(), it->second.end());
    }
    if (all) out[name] = std::move(pooled);
  }
  return out;
}

std::vector<std::string> CreateSchemaSql() {
  std::vector<std::string> out = {
      CreateTable(kRunTable),
      "CREATE INDEX IF NOT EXISTS runs_by_config ON runs (config_hash, sweep, status)",
      CreateTable(kRequestTable), CreateTable(kStepTable), CreateTable(kOutputTable)};
  for (std::string_view sql : kSummaryDdl) out.emplace_back(sql);
  return out;
}

std::vector<std::string> MigrateSchemaSql(int version) {
  std::vector<std::string> out;
  AddColumns(kRunTable, version, out);
  AddColumns(kRequestTable, version, out);
  AddColumns(kStepTable, version, out);
  AddColumns(kOutputTable, version, out);
  return out;
}

}  // namespace vtoken::engine
