#include "lib/engine/result_store.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <filesystem>
#include <utility>

#include "lib/engine/sqlite_db.h"

namespace vtoken::engine {
namespace {

namespace fs = std::filesystem;
using sql::Exec;
using sql::QueryInt;
using sql::Stmt;
using sql::Transaction;

// Now as the store writes times: UTC ISO-8601.
std::string NowUtc() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

bool ProcessAlive(int64_t pid) {
  if (pid <= 0) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

std::string InterruptedMessage(int64_t pid) {
  if (ProcessAlive(pid)) {
    return "process " + std::to_string(pid) + " stopped writing the run without finishing it";
  }
  return "process " + std::to_string(pid) + " exited without finishing the run";
}

// "SELECT a, b, NULL, ... FROM table": the columns a file of schema `version` lacks read NULL.
template <typename Record>
std::string SelectSql(const Table<Record>& table, int version) {
  std::string sql = "SELECT ";
  for (size_t i = 0; i < table.columns.size(); ++i) {
    if (i > 0) sql += ", ";
    sql += table.columns[i].since <= version ? std::string(table.columns[i].name) : "NULL";
  }
  return sql + " FROM " + std::string(table.name);
}

}  // namespace

StatusOr<ResultStore> ResultStore::Open(const std::string& path, int busy_timeout_ms) {
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    if (ec) {
      return NotFoundError("result db " + path + ": cannot create directory " + parent.string() +
                           ": " + ec.message());
    }
  }
  VTOKEN_ASSIGN_OR_RETURN(sqlite3 * db, sql::OpenFile(path, /*create=*/true, busy_timeout_ms));
  ResultStore store(path, db, /*read_only=*/false);
  VTOKEN_RETURN_IF_ERROR(Exec(db, store.path_, "PRAGMA foreign_keys = ON"));
  VTOKEN_RETURN_IF_ERROR(Exec(db, store.path_, "PRAGMA journal_mode = WAL"));
  // In WAL mode NORMAL survives a crashed process (the case that matters: a killed run); only a
  // power loss may lose the last transactions. FULL would fsync on every batch.
  VTOKEN_RETURN_IF_ERROR(Exec(db, store.path_, "PRAGMA synchronous = NORMAL"));
  VTOKEN_RETURN_IF_ERROR(store.InitSchema());
  store.locks_ = RunLocks(path);
  VTOKEN_RETURN_IF_ERROR(store.MarkInterruptedRuns());
  return store;
}

StatusOr<ResultStore> ResultStore::OpenReadOnly(const std::string& path, int busy_timeout_ms) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return NotFoundError("result db " + path + " not found");
  VTOKEN_ASSIGN_OR_RETURN(sqlite3 * db, sql::OpenFile(path, /*create=*/false, busy_timeout_ms));
  ResultStore store(path, db, /*read_only=*/true);
  VTOKEN_RETURN_IF_ERROR(Exec(db, store.path_, "PRAGMA query_only = ON"));
  VTOKEN_ASSIGN_OR_RETURN(int64_t version, QueryInt(db, store.path_, "PRAGMA user_version"));
  if (version < 1 || version > kResultSchemaVersion) {
    return FailedPreconditionError(
        "result db " + path + ": schema version " + std::to_string(version) + ", expected " +
        (kResultSchemaVersion > 1 ? "1.." : "") + std::to_string(kResultSchemaVersion) +
        (version == 0 ? " (not a vtoken result database)" : ""));
  }
  store.version_ = static_cast<int>(version);
  store.locks_ = RunLocks(path);
  return store;
}

ResultStore::ResultStore(ResultStore&& other) noexcept
    : path_(std::move(other.path_)),
      db_(std::exchange(other.db_, nullptr)),
      read_only_(other.read_only_),
      version_(other.version_),
      locks_(std::move(other.locks_)) {}

ResultStore& ResultStore::operator=(ResultStore&& other) noexcept {
  if (this != &other) {
    sql::CloseFile(db_);
    path_ = std::move(other.path_);
    db_ = std::exchange(other.db_, nullptr);
    read_only_ = other.read_only_;
    version_ = other.version_;
    locks_ = std::move(other.locks_);
  }
  return *this;
}

ResultStore::~ResultStore() { sql::CloseFile(db_); }

bool ResultStore::WriterAlive(const RunRecord& run) const {
  if (run.run_lock.value_or(0) != 0) return locks_.Held(run.id);
  return ProcessAlive(run.pid);
}

RunRecord ResultStore::Presented(RunRecord run) const {
  if (read_only_ && run.status == "running" && !WriterAlive(run)) {
    run.status = "interrupted";
    run.error = InterruptedMessage(run.pid);
  }
  return run;
}

Status ResultStore::InitSchema() {
  auto too_new = [this](int64_t version) {
    return FailedPreconditionError("result db " + path_ + ": schema version " +
                                   std::to_string(version) + " is newer than this build's " +
                                   std::to_string(kResultSchemaVersion) + "; use a newer vtoken");
  };
  VTOKEN_ASSIGN_OR_RETURN(int64_t version, QueryInt(db_, path_, "PRAGMA user_version"));
  if (version > kResultSchemaVersion) return too_new(version);
  if (version == kResultSchemaVersion) return Status::Ok();
  VTOKEN_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_, path_));
  // Another process may have created or migrated the schema between the check and BEGIN.
  VTOKEN_ASSIGN_OR_RETURN(version, QueryInt(db_, path_, "PRAGMA user_version"));
  if (version > kResultSchemaVersion) return too_new(version);
  if (version == kResultSchemaVersion) return Status::Ok();
  const std::vector<std::string> statements =
      version == 0 ? CreateSchemaSql() : MigrateSchemaSql(static_cast<int>(version));
  for (const std::string& sql : statements) VTOKEN_RETURN_IF_ERROR(Exec(db_, path_, sql));
  VTOKEN_RETURN_IF_ERROR(
      Exec(db_, path_, "PRAGMA user_version = " + std::to_string(kResultSchemaVersion)));
  return txn.Commit();
}

Status ResultStore::MarkInterruptedRuns() {
  VTOKEN_ASSIGN_OR_RETURN(std::vector<RunRecord> running,
                          ListRuns({.ids = {}, .sweep = "", .status = "running"}));
  std::erase_if(running, [this](const RunRecord& r) { return WriterAlive(r); });
  if (running.empty()) return Status::Ok();
  VTOKEN_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_, path_));
  const std::string sql =
      "UPDATE runs SET status = 'interrupted', error = ?2, finished = ?3 WHERE id = ?1 AND "
      "status = 'running'";
  VTOKEN_ASSIGN_OR_RETURN(Stmt update, Stmt::Prepare(db_, path_, sql));
  for (const RunRecord& r : running) {
    update.Bind(1, r.id);
    update.Bind(2, InterruptedMessage(r.pid));
    update.Bind(3, NowUtc());
    VTOKEN_RETURN_IF_ERROR(update.Run());
  }
  return txn.Commit();
}

Status ResultStore::CheckExists(int64_t run_id) const {
  VTOKEN_ASSIGN_OR_RETURN(Stmt s, Stmt::Prepare(db_, path_, "SELECT 1 FROM runs WHERE id = ?1"));
  s.Bind(1, run_id);
  VTOKEN_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return NotFoundError("result db " + path_ + ": no run " + std::to_string(run_id));
  return Status::Ok();
}

Status ResultStore::CheckRunning(int64_t run_id) const {
  VTOKEN_ASSIGN_OR_RETURN(Stmt s,
                          Stmt::Prepare(db_, path_, "SELECT status FROM runs WHERE id = ?1"));
  s.Bind(1, run_id);
  VTOKEN_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return NotFoundError("result db " + path_ + ": no run " + std::to_string(run_id));
  const std::string status = s.Text(0);
  if (status != "running") {
    return FailedPreconditionError("result db " + path_ + ": run " + std::to_string(run_id) +
                                   " is " + status + ", not running");
  }
  return Status::Ok();
}

StatusOr<int64_t> ResultStore::BeginRun(const RunRecord& run) {
  if (read_only_) {
    return FailedPreconditionError("result db " + path_ + " is open read-only");
  }
  RunRecord row = run;
  row.created = NowUtc();
  row.status = "running";
  row.error.clear();
  row.finished.clear();
  row.pid = ::getpid();
  row.run_lock = 1;
  const auto columns = kRunTable.inserted();
  const std::string sql = "INSERT INTO runs (" + ColumnList(columns, version_) + ") VALUES (" +
                          sql::Placeholders(1, static_cast<int>(columns.size())) + ")";
  VTOKEN_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_, path_));
  VTOKEN_ASSIGN_OR_RETURN(Stmt s, Stmt::Prepare(db_, path_, sql));
  for (size_t i = 0; i < columns.size(); ++i) {
    s.BindValue(static_cast<int>(i) + 1, columns[i].get(row));
  }
  VTOKEN_RETURN_IF_ERROR(s.Run());
  const int64_t id = sql::LastInsertRowid(db_);
  // Locked before the row is visible, so no other open sees the run without its lock.
  VTOKEN_RETURN_IF_ERROR(locks_.Lock(id));
  Status committed = txn.Commit();
  if (!committed.ok()) {
    locks_.Unlock(id);
    return committed;
  }
  return id;
}

template <typename Record>
Status ResultStore::InsertRows(const Table<Record>& table, int64_t run_id,
                               const std::vector<Record>& rows) {
  const std::string sql = "INSERT INTO " + std::string(table.name) + " (run_id, " +
                          ColumnList(table.columns, version_) + ") VALUES (" +
                          sql::Placeholders(1, static_cast<int>(table.columns.size()) + 1) + ")";
  VTOKEN_ASSIGN_OR_RETURN(Stmt s, Stmt::Prepare(db_, path_, sql));
  for (const Record& r : rows) {
    s.Bind(1, run_id);
    for (size_t i = 0; i < table.columns.size(); ++i) {
      s.BindValue(static_cast<int>(i) + 2, table.columns[i].get(r));
    }
    VTOKEN_RETURN_IF_ERROR(s.Run());
  }
  return Status::Ok();
}

template <typename Record>
StatusOr<std::vector<Record>> ResultStore::ReadRows(const Table<Record>& table,
                                                    int64_t run_id) const {
  VTOKEN_RETURN_IF_ERROR(CheckExists(run_id));
  const std::string sql = SelectSql(table, version_) + " WHERE run_id = ?1 ORDER BY " +
                          std::string(table.columns[0].name);
  VTOKEN_ASSIGN_OR_RETURN(Stmt s, Stmt::Prepare(db_, path_, sql));
  s.Bind(1, run_id);
  std::vector<Record> out;
  while (true) {
    VTOKEN_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    Record r;
    for (size_t i = 0; i < table.columns.size(); ++i) {
      if (!table.columns[i].set(r, s.Get(static_cast<int>(i)))) {
        return DataLossError("result db " + path_ + ": " + std::string(table.name) + " of run " +
                             std::to_string(run_id) + " " + std::string(table.columns[0].name) +
                             " " + s.Text(0) + ": " + std::string(table.columns[i].name) +
                             " is malformed");
      }
    }
    out.push_back(std::move(r));
  }
  return out;
}

Status ResultStore::AppendSteps(int64_t run_id, const std::vector<StepRecord>& steps) {
  VTOKEN_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_, path_));
  VTOKEN_RETURN_IF_ERROR(CheckRunning(run_id));
  VTOKEN_RETURN_IF_ERROR(InsertRows(kStepTable, run_id, steps));
  return txn.Commit();
}

Status ResultStore::AppendRequests(int64_t run_id, const std::vector<RequestRecord>& requests) {
  VTOKEN_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_, path_));
  VTOKEN_RETURN_IF_ERROR(CheckRunning(run_id));
  VTOKEN_RETURN_IF_ERROR(InsertRows(kRequestTable, run_id, requests));
  return txn.Commit();
}

Status ResultStore::AppendOutputs(int64_t run_id, const std::vector<OutputRecord>& outputs) {
  VTOKEN_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_, path_));
  VTOKEN_RETURN_IF_ERROR(CheckRunning(run_id));
  VTOKEN_RETURN_IF_ERROR(InsertRows(kOutputTable, run_id, outputs));
  return txn.Commit();
}

Status ResultStore::FinishRun(int64_t run_id, const std::map<std::string, double>& summary,
                              const std::map<std::string, std::string>& text) {
  return CompleteRun(run_id, {}, summary, text);
}

Status ResultStore::CompleteRun(int64_t run_id, const RunRows& rows,
                                const std::map<std::string, double>& summary,
                                const std::map<std::string, std::string>& text) {
  VTOKEN_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_, path_));
  VTOKEN_RETURN_IF_ERROR(CheckRunning(run_id));
  VTOKEN_RETURN_IF_ERROR(InsertRows(kStepTable, run_id, rows.steps));
  VTOKEN_RETURN_IF_ERROR(InsertRows(kRequestTable, run_id, rows.requests));
  VTOKEN_RETURN_IF_ERROR(InsertRows(kOutputTable, run_id, rows.outputs));
  VTOKEN_RETURN_IF_ERROR(InsertSummary(run_id, summary, text));
  VTOKEN_RETURN_IF_ERROR(txn.Commit());
  locks_.Unlock(run_id);
  return Status::Ok();
}

Status ResultStore::InsertSummary(int64_t run_id, const std::map<std::string, double>& summary,
                                  const std::map<std::string, std::string>& text) {
  for (std::string_view table : kSummaryTables) {
    VTOKEN_ASSIGN_OR_RETURN(Stmt s,
                            Stmt::Prepare(db_, path_,
                                          "INSERT INTO " + std::string(table) +
                                              " (run_id, name, value) VALUES (?1, ?2, ?3)"));
    auto insert = [&](const std::string& name, const auto& value) {
      s.Bind(1, run_id);
      s.Bind(2, name);
      s.Bind(3, value);
      return s.Run();
    };
    if (table == "summary") {
      for (const auto& [name, value] : summary) VTOKEN_RETURN_IF_ERROR(insert(name, value));
    } else {
      for (const auto& [name, value] : text) {
        VTOKEN_RETURN_IF_ERROR(insert(name, std::string_view(value)));
      }
    }
  }
  VTOKEN_ASSIGN_OR_RETURN(
      Stmt update,
      Stmt::Prepare(db_, path_,
                    "UPDATE runs SET status = 'completed', finished = ?2 WHERE id = ?1"));
  update.Bind(1, run_id);
  update.Bind(2, NowUtc());
  return update.Run();
}

Status ResultStore::FailRun(int64_t run_id, const std::string& message) {
  return EndRun(run_id, "failed", message);
}

Status ResultStore::InterruptRun(int64_t run_id, const std::string& message) {
  return EndRun(run_id, "interrupted", message);
}

Status ResultStore::EndRun(int64_t run_id, std::string_view status, const std::string& message) {
  // This writer gives the run up whether or not the transaction below commits (a full disk): a
  // run it cannot end stays 'running' only until the next Open, which marks it interrupted.
  struct Release {
    const RunLocks& locks;
    int64_t id;
    ~Release() { locks.Unlock(id); }
  } release{locks_, run_id};
  VTOKEN_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_, path_));
  VTOKEN_RETURN_IF_ERROR(CheckRunning(run_id));
  // A run that did not complete keeps no rows but its own: readers never see half a run.
  std::vector<std::string_view> children = {kStepTable.name, kRequestTable.name, kOutputTable.name};
  children.insert(children.end(), std::begin(kSummaryTables), std::end(kSummaryTables));
  for (std::string_view table : children) {
    VTOKEN_ASSIGN_OR_RETURN(
        Stmt del,
        Stmt::Prepare(db_, path_, "DELETE FROM " + std::string(table) + " WHERE run_id = ?1"));
    del.Bind(1, run_id);
    VTOKEN_RETURN_IF_ERROR(del.Run());
  }
  VTOKEN_ASSIGN_OR_RETURN(Stmt update,
                          Stmt::Prepare(db_, path_,
                                        "UPDATE runs SET status = ?3, error = ?2, finished = ?4 "
                                        "WHERE id = ?1"));
  update.Bind(1, run_id);
  update.Bind(2, message);
  update.Bind(3, status);
  update.Bind(4, NowUtc());
  VTOKEN_RETURN_IF_ERROR(update.Run());
  return txn.Commit();
}

StatusOr<std::vector<RunRecord>> ResultStore::ListRuns(const RunFilter& filter) const {
  // A read-only store presents dead 'running' runs as 'interrupted' (see Presented), so it
  // filters by status, and hence applies `last`, after reading the rows.
  const bool status_in_sql = !filter.status.empty() && !read_only_;
  const bool limit_in_sql = filter.last > 0 && (filter.status.empty() || status_in_sql);
  std::string sql = SelectSql(kRunTable, version_);
  std::vector<std::string> where;
  int next = 1;
  if (!filter.ids.empty()) {
    where.push_back("id IN (" + sql::Placeholders(next, static_cast<int>(filter.ids.size())) + ")");
    next += static_cast<int>(filter.ids.size());
  }
  if (!filter.sweep.empty()) where.push_back("sweep = ?" + std::to_string(next++));
  if (status_in_sql) where.push_back("status = ?" + std::to_string(next++));
  for (size_t i = 0; i < where.size(); ++i) sql += (i == 0 ? " WHERE " : " AND ") + where[i];
  sql += " ORDER BY id DESC";
  if (limit_in_sql) sql += " LIMIT ?" + std::to_string(next);

  VTOKEN_ASSIGN_OR_RETURN(Stmt s, Stmt::Prepare(db_, path_, sql));
  int i = 1;
  for (int64_t id : filter.ids) s.Bind(i++, id);
  if (!filter.sweep.empty()) s.Bind(i++, filter.sweep);
  if (status_in_sql) s.Bind(i++, filter.status);
  if (limit_in_sql) s.Bind(i, filter.last);
  std::vector<RunRecord> runs;
  while (filter.last <= 0 || static_cast<int64_t>(runs.size()) < filter.last) {
    VTOKEN_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    RunRecord run;
    for (size_t c = 0; c < kRunTable.columns.size(); ++c) {
      kRunTable.columns[c].set(run, s.Get(static_cast<int>(c)));
    }
    run = Presented(std::move(run));
    if (filter.status.empty() || run.status == filter.status) runs.push_back(std::move(run));
  }
  std::reverse(runs.begin(), runs.end());
  return runs;
}

StatusOr<RunRecord> ResultStore::GetRun(int64_t run_id) const {
  VTOKEN_ASSIGN_OR_RETURN(std::vector<RunRecord> runs,
                          ListRuns({.ids = {run_id}, .sweep = "", .status = ""}));
  if (runs.empty()) {
    return NotFoundError("result db " + path_ + ": no run " + std::to_string(run_id));
  }
  return std::move(runs[0]);
}

StatusOr<RunSummary> ResultStore::GetSummary(int64_t run_id) const {
  VTOKEN_RETURN_IF_ERROR(CheckExists(run_id));
  RunSummary summary;
  for (std::string_view table : kSummaryTables) {
    VTOKEN_ASSIGN_OR_RETURN(Stmt s, Stmt::Prepare(db_, path_,
                                                  "SELECT name, value FROM " + std::string(table) +
                                                      " WHERE run_id = ?1"));
    s.Bind(1, run_id);
    while (true) {
      VTOKEN_ASSIGN_OR_RETURN(bool row, s.Step());
      if (!row) break;
      if (table == "summary") {
        summary.values[s.Text(0)] = s.Real(1);
      } else {
        summary.text[s.Text(0)] = s.Text(1);
      }
    }
  }
  return summary;
}

StatusOr<std::vector<RequestRecord>> ResultStore::GetRequests(int64_t run_id) const {
  return ReadRows(kRequestTable, run_id);
}

StatusOr<std::vector<StepRecord>> ResultStore::GetSteps(int64_t run_id) const {
  return ReadRows(kStepTable, run_id);
}

StatusOr<std::vector<OutputRecord>> ResultStore::GetOutputs(int64_t run_id) const {
  return ReadRows(kOutputTable, run_id);
}

StatusOr<std::optional<int64_t>> ResultStore::FindCompleted(const std::string& config_hash,
                                                            const std::string& sweep) const {
  VTOKEN_ASSIGN_OR_RETURN(
      Stmt s, Stmt::Prepare(db_, path_,
                            "SELECT id FROM runs WHERE config_hash = ?1 AND sweep = ?2 AND "
                            "status = 'completed' ORDER BY id DESC LIMIT 1"));
  s.Bind(1, config_hash);
  s.Bind(2, sweep);
  VTOKEN_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<int64_t>();
  return std::optional<int64_t>(s.Int(0));
}

}  // namespace vtoken::engine
