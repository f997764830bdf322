// ResultStore::MergeInto: copies the completed runs of other result databases into this one.
#include <filesystem>
#include <tuple>

#include "lib/engine/result_store.h"
#include "lib/engine/sqlite_db.h"

namespace vtoken::engine {
namespace {

namespace fs = std::filesystem;
using sql::Stmt;

// "INSERT INTO main.T (run_id, cols) SELECT ?1, cols FROM src.T WHERE run_id = ?2" for a child
// table, with the columns a source of schema `version` has.
std::string CopyChildSql(std::string_view table, const std::string& columns) {
  return "INSERT INTO main." + std::string(table) + " (run_id, " + columns + ") SELECT ?1, " +
         columns + " FROM src." + std::string(table) + " WHERE run_id = ?2";
}

// Errors about the source name it, not this database: a corrupt page of the source is found
// before anything is copied.
Status CheckSource(sqlite3* db, const std::string& source) {
  VTOKEN_ASSIGN_OR_RETURN(Stmt check, Stmt::Prepare(db, source, "PRAGMA src.quick_check"));
  while (true) {
    VTOKEN_ASSIGN_OR_RETURN(bool row, check.Step());
    if (!row) return Status::Ok();
    const std::string problem = check.Text(0);
    if (problem == "ok") return Status::Ok();
    // The first problem, after the line that names the schema ("*** in database src ***").
    if (problem.rfind("*** in database", 0) == 0) continue;
    return DataLossError("result db " + source + ": merge source is corrupt: " + problem);
  }
}

}  // namespace

Status ResultStore::MergeInto(const std::vector<std::string>& sources, MergeStats* stats) {
  if (read_only_) {
    return FailedPreconditionError("result db " + path_ + " is open read-only");
  }
  MergeStats total;
  for (const std::string& source : sources) VTOKEN_RETURN_IF_ERROR(MergeOne(source, total));
  if (stats != nullptr) *stats = total;
  return Status::Ok();
}

Status ResultStore::MergeOne(const std::string& source, MergeStats& stats) {
  std::error_code ec;
  if (!fs::is_regular_file(source, ec)) {
    return NotFoundError("result db " + path_ + ": merge source " + source + " does not exist");
  }
  if (fs::equivalent(source, path_, ec)) {
    return FailedPreconditionError("result db " + path_ + ": cannot merge " + source +
                                   " into itself");
  }
  {
    VTOKEN_ASSIGN_OR_RETURN(Stmt attach, Stmt::Prepare(db_, source, "ATTACH DATABASE ?1 AS src"));
    attach.Bind(1, source);
    VTOKEN_RETURN_IF_ERROR(attach.Run());
  }
  // Detaches on every path out of this function, after the transaction has ended.
  struct Detach {
    ResultStore* self;
    ~Detach() { sql::Exec(self->db_, self->path_, "DETACH DATABASE src").IgnoreError(); }
  } detach{this};

  VTOKEN_ASSIGN_OR_RETURN(int64_t version, sql::QueryInt(db_, source, "PRAGMA src.user_version"));
  if (version < 1 || version > kResultSchemaVersion) {
    return FailedPreconditionError("result db " + path_ + ": merge source " + source +
                                   " has schema version " + std::to_string(version) +
                                   ", expected 1.." + std::to_string(kResultSchemaVersion));
  }
  VTOKEN_RETURN_IF_ERROR(CheckSource(db_, source));
  const int v = static_cast<int>(version);
  MergeStats local;
  VTOKEN_ASSIGN_OR_RETURN(sql::Transaction txn, sql::Transaction::Begin(db_, path_));
  std::vector<std::tuple<int64_t, std::string, std::string>> completed;
  {
    VTOKEN_ASSIGN_OR_RETURN(Stmt s, Stmt::Prepare(db_, source,
                                                  "SELECT id, config_hash, sweep FROM src.runs "
                                                  "WHERE status = 'completed' ORDER BY id"));
    while (true) {
      VTOKEN_ASSIGN_OR_RETURN(bool row, s.Step());
      if (!row) break;
      completed.emplace_back(s.Int(0), s.Text(1), s.Text(2));
    }
  }
  const std::string run_columns = ColumnList(kRunTable.inserted(), v);
  VTOKEN_ASSIGN_OR_RETURN(Stmt copy_run,
                          Stmt::Prepare(db_, path_,
                                        "INSERT INTO main.runs (" + run_columns + ") SELECT " +
                                            run_columns + " FROM src.runs WHERE id = ?1"));
  std::vector<Stmt> copy_children;
  auto add_child = [&](std::string_view table, const std::string& columns) -> Status {
    VTOKEN_ASSIGN_OR_RETURN(Stmt s, Stmt::Prepare(db_, path_, CopyChildSql(table, columns)));
    copy_children.push_back(std::move(s));
    return Status::Ok();
  };
  VTOKEN_RETURN_IF_ERROR(add_child(kRequestTable.name, ColumnList(kRequestTable.columns, v)));
  VTOKEN_RETURN_IF_ERROR(add_child(kStepTable.name, ColumnList(kStepTable.columns, v)));
  VTOKEN_RETURN_IF_ERROR(add_child(kOutputTable.name, ColumnList(kOutputTable.columns, v)));
  for (std::string_view table : kSummaryTables) {
    VTOKEN_RETURN_IF_ERROR(add_child(table, "name, value"));
  }
  for (const auto& [old_id, hash, sweep] : completed) {
    if (!hash.empty()) {
      VTOKEN_ASSIGN_OR_RETURN(std::optional<int64_t> existing, FindCompleted(hash, sweep));
      if (existing.has_value()) {
        ++local.runs_skipped;
        continue;
      }
    }
    copy_run.Bind(1, old_id);
    VTOKEN_RETURN_IF_ERROR(copy_run.Run());
    const int64_t new_id = sql::LastInsertRowid(db_);
    for (Stmt& s : copy_children) {
      s.Bind(1, new_id);
      s.Bind(2, old_id);
      VTOKEN_RETURN_IF_ERROR(s.Run());
    }
    ++local.runs_copied;
  }
  VTOKEN_RETURN_IF_ERROR(txn.Commit());
  stats.runs_copied += local.runs_copied;
  stats.runs_skipped += local.runs_skipped;
  return Status::Ok();
}

}  // namespace vtoken::engine
