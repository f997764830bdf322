#include "lib/engine/result_store.h"

#include <signal.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>
#include <tuple>
#include <utility>

namespace vtoken::engine {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kSchema[] = {
    R"(CREATE TABLE IF NOT EXISTS runs (
      id INTEGER PRIMARY KEY,
      created TEXT NOT NULL,
      git_sha TEXT NOT NULL DEFAULT '',
      config_toml TEXT NOT NULL DEFAULT '',
      config_hash TEXT NOT NULL DEFAULT '',
      sweep TEXT NOT NULL DEFAULT '',
      model TEXT NOT NULL DEFAULT '',
      mode TEXT NOT NULL DEFAULT '',
      policy TEXT NOT NULL DEFAULT '',
      budget REAL NOT NULL DEFAULT 0,
      block_size INTEGER NOT NULL DEFAULT 0,
      num_blocks INTEGER NOT NULL DEFAULT 0,
      workload TEXT NOT NULL DEFAULT '',
      seed INTEGER NOT NULL DEFAULT 0,
      status TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'interrupted')),
      error TEXT NOT NULL DEFAULT '',
      pid INTEGER NOT NULL DEFAULT 0,
      finished TEXT))",
    "CREATE INDEX IF NOT EXISTS runs_by_config ON runs (config_hash, sweep, status)",
    R"(CREATE TABLE IF NOT EXISTS requests (
      run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
      request_id INTEGER NOT NULL,
      prompt_tokens INTEGER, output_tokens INTEGER, arrival_s REAL, first_token_s REAL,
      finish_s REAL, ttft_s REAL, tpot_s REAL, e2e_s REAL, preemptions INTEGER,
      blocks_mean REAL, blocks_final INTEGER, ideal_blocks_final INTEGER,
      PRIMARY KEY (run_id, request_id)) WITHOUT ROWID)",
    R"(CREATE TABLE IF NOT EXISTS steps (
      run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
      step INTEGER NOT NULL,
      time_s REAL, num_running INTEGER, num_waiting INTEGER, free_blocks INTEGER,
      allocated_blocks INTEGER, live_slots INTEGER, waste_ratio REAL, held_blocks INTEGER,
      ideal_blocks INTEGER, hist0 INTEGER, hist1 INTEGER, hist2 INTEGER, hist3 INTEGER,
      moves INTEGER, fence_waits INTEGER,
      PRIMARY KEY (run_id, step)) WITHOUT ROWID)",
    R"(CREATE TABLE IF NOT EXISTS outputs (
      run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
      request_id INTEGER NOT NULL,
      text TEXT NOT NULL, token_ids TEXT NOT NULL,
      PRIMARY KEY (run_id, request_id)) WITHOUT ROWID)",
    R"(CREATE TABLE IF NOT EXISTS summary (
      run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
      name TEXT NOT NULL, value REAL,
      PRIMARY KEY (run_id, name)) WITHOUT ROWID)",
    R"(CREATE TABLE IF NOT EXISTS summary_text (
      run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
      name TEXT NOT NULL, value TEXT NOT NULL,
      PRIMARY KEY (run_id, name)) WITHOUT ROWID)",
};

// Columns of each child table after run_id; MergeInto copies them by these lists.
constexpr std::string_view kRunCopyColumns =
    "created, git_sha, config_toml, config_hash, sweep, model, mode, policy, budget, block_size, "
    "num_blocks, workload, seed, status, error, pid, finished";
constexpr std::string_view kRequestColumns =
    "request_id, prompt_tokens, output_tokens, arrival_s, first_token_s, finish_s, ttft_s, "
    "tpot_s, e2e_s, preemptions, blocks_mean, blocks_final, ideal_blocks_final";
constexpr std::string_view kStepColumns =
    "step, time_s, num_running, num_waiting, free_blocks, allocated_blocks, live_slots, "
    "waste_ratio, held_blocks, ideal_blocks, hist0, hist1, hist2, hist3, moves, fence_waits";
constexpr std::pair<std::string_view, std::string_view> kChildTables[] = {
    {"requests", kRequestColumns},
    {"steps", kStepColumns},
    {"outputs", "request_id, text, token_ids"},
    {"summary", "name, value"},
    {"summary_text", "name, value"},
};
constexpr std::string_view kRunSelect =
    "SELECT id, created, git_sha, config_toml, config_hash, sweep, model, mode, policy, budget, "
    "block_size, num_blocks, workload, seed, status, error, pid, COALESCE(finished, '') FROM runs";
constexpr std::string_view kNow = "strftime('%Y-%m-%dT%H:%M:%SZ', 'now')";

StatusCode CodeOf(int rc) {
  switch (rc & 0xff) {
    case SQLITE_CONSTRAINT:
    case SQLITE_MISMATCH:
    case SQLITE_RANGE:
      return StatusCode::kInvalidArgument;
    case SQLITE_CANTOPEN:
      return StatusCode::kNotFound;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return StatusCode::kDataLoss;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_FULL:
    case SQLITE_NOMEM:
      return StatusCode::kResourceExhausted;
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_AUTH:
      return StatusCode::kFailedPrecondition;
    default:
      return StatusCode::kInternal;
  }
}

// The statement as it appears in an error message: whitespace collapsed, at most 80 characters.
std::string Abbreviate(std::string_view sql) {
  std::string out;
  for (char c : sql) {
    const bool space = c == ' ' || c == '\n' || c == '\t';
    if (space && (out.empty() || out.back() == ' ')) continue;
    out.push_back(space ? ' ' : c);
    if (out.size() >= 80) return out + "...";
  }
  return out;
}

Status SqlError(sqlite3* db, int rc, const std::string& path, std::string_view sql) {
  const char* detail = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  return Status(CodeOf(rc), "result db " + path + ": " + Abbreviate(sql) + ": " + detail);
}

double ToDouble(sqlite3_stmt* s, int col) {
  // SQLite stores NaN as NULL; a missing figure reads back as NaN, not 0.
  if (sqlite3_column_type(s, col) == SQLITE_NULL) return std::numeric_limits<double>::quiet_NaN();
  return sqlite3_column_double(s, col);
}

// A prepared statement bound to its database path for error messages.
class Stmt {
 public:
  static StatusOr<Stmt> Prepare(sqlite3* db, const std::string& path, std::string_view sql) {
    sqlite3_stmt* s = nullptr;
    const int rc = sqlite3_prepare_v2(db, sql.data(), static_cast<int>(sql.size()), &s, nullptr);
    if (rc != SQLITE_OK) return SqlError(db, rc, path, sql);
    return Stmt(db, path, sql, s);
  }
  Stmt(Stmt&& o) noexcept
      : db_(o.db_), path_(o.path_), sql_(std::move(o.sql_)), s_(std::exchange(o.s_, nullptr)) {}
  Stmt& operator=(Stmt&&) = delete;
  ~Stmt() { sqlite3_finalize(s_); }

  // Parameters are 1-based, as in SQL ("?1").
  void Bind(int i, int64_t v) { sqlite3_bind_int64(s_, i, v); }
  void Bind(int i, double v) { sqlite3_bind_double(s_, i, v); }
  void Bind(int i, std::string_view v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }

  // Returns true when a row is ready, false when the statement is done.
  StatusOr<bool> Step() {
    const int rc = sqlite3_step(s_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return SqlError(db_, rc, path_, sql_);
  }
  // Steps to completion, then resets so the statement can be bound and run again.
  Status Run() {
    StatusOr<bool> row = Step();
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
    if (!row.ok()) return row.status();
    return Status::Ok();
  }

  int64_t Int(int col) const { return sqlite3_column_int64(s_, col); }
  double Real(int col) const { return ToDouble(s_, col); }
  std::string Text(int col) const {
    const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s_, col));
    return p == nullptr ? std::string() : std::string(p, sqlite3_column_bytes(s_, col));
  }

 private:
  Stmt(sqlite3* db, const std::string& path, std::string_view sql, sqlite3_stmt* s)
      : db_(db), path_(path), sql_(sql), s_(s) {}

  sqlite3* db_;
  const std::string& path_;
  std::string sql_;  // For error messages.
  sqlite3_stmt* s_;
};

Status Exec(sqlite3* db, const std::string& path, std::string_view sql) {
  VTOKEN_ASSIGN_OR_RETURN(Stmt stmt, Stmt::Prepare(db, path, sql));
  while (true) {
    VTOKEN_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) return Status::Ok();
  }
}

StatusOr<int64_t> QueryInt(sqlite3* db, const std::string& path, std::string_view sql) {
  VTOKEN_ASSIGN_OR_RETURN(Stmt stmt, Stmt::Prepare(db, path, sql));
  VTOKEN_ASSIGN_OR_RETURN(bool row, stmt.Step());
  if (!row) return InternalError("result db " + path + ": " + std::string(sql) + ": no row");
  return stmt.Int(0);
}

// A write transaction; rolled back unless committed. IMMEDIATE takes the write lock up front, so
// two writers wait for each other at BEGIN (busy timeout) instead of deadlocking mid-way.
class Transaction {
 public:
  static StatusOr<Transaction> Begin(sqlite3* db, const std::string& path) {
    VTOKEN_RETURN_IF_ERROR(Exec(db, path, "BEGIN IMMEDIATE"));
    return Transaction(db, path);
  }
  Transaction(Transaction&& o) noexcept : db_(std::exchange(o.db_, nullptr)), path_(o.path_) {}
  Transaction& operator=(Transaction&&) = delete;
  ~Transaction() {
    if (db_ != nullptr) Exec(db_, path_, "ROLLBACK").IgnoreError();
  }
  Status Commit() {
    Status s = Exec(db_, path_, "COMMIT");
    if (s.ok()) db_ = nullptr;
    return s;
  }

 private:
  Transaction(sqlite3* db, const std::string& path) : db_(db), path_(path) {}
  sqlite3* db_;
  const std::string& path_;
};

bool ProcessAlive(int64_t pid) {
  if (pid <= 0) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

std::string InterruptedMessage(int64_t pid) {
  return "process " + std::to_string(pid) + " exited without finishing the run";
}

RunRecord ReadRun(const Stmt& s) {
  RunRecord r;
  r.id = s.Int(0);
  r.created = s.Text(1);
  r.git_sha = s.Text(2);
  r.config_toml = s.Text(3);
  r.config_hash = s.Text(4);
  r.sweep = s.Text(5);
  r.model = s.Text(6);
  r.mode = s.Text(7);
  r.policy = s.Text(8);
  r.budget = s.Real(9);
  r.block_size = static_cast<int32_t>(s.Int(10));
  r.num_blocks = static_cast<int32_t>(s.Int(11));
  r.workload = s.Text(12);
  r.seed = static_cast<uint64_t>(s.Int(13));
  r.status = s.Text(14);
  r.error = s.Text(15);
  r.pid = s.Int(16);
  r.finished = s.Text(17);
  return r;
}

std::string Placeholders(int first, int count) {
  std::string out;
  for (int i = 0; i < count; ++i) {
    if (i > 0) out += ", ";
    out += '?';
    out += std::to_string(first + i);
  }
  return out;
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
  sqlite3* db = nullptr;
  const int rc =
      sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
  if (rc != SQLITE_OK) {
    Status s = SqlError(db, rc, path, "open (is the directory writable?)");
    sqlite3_close(db);
    return s;
  }
  ResultStore store(path, db, /*read_only=*/false);
  sqlite3_busy_timeout(db, busy_timeout_ms);
  VTOKEN_RETURN_IF_ERROR(Exec(db, store.path_, "PRAGMA foreign_keys = ON"));
  VTOKEN_RETURN_IF_ERROR(Exec(db, store.path_, "PRAGMA journal_mode = WAL"));
  // In WAL mode NORMAL survives a crashed process (the case that matters: a killed run); only a
  // power loss may lose the last transactions. FULL would fsync on every batch.
  VTOKEN_RETURN_IF_ERROR(Exec(db, store.path_, "PRAGMA synchronous = NORMAL"));
  VTOKEN_RETURN_IF_ERROR(store.InitSchema());
  VTOKEN_RETURN_IF_ERROR(store.MarkInterruptedRuns());
  return store;
}

StatusOr<ResultStore> ResultStore::OpenReadOnly(const std::string& path, int busy_timeout_ms) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return NotFoundError("result db " + path + " not found");
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
  if (rc != SQLITE_OK) {
    Status s = SqlError(db, rc, path, "open read-only");
    sqlite3_close(db);
    return s;
  }
  ResultStore store(path, db, /*read_only=*/true);
  sqlite3_busy_timeout(db, busy_timeout_ms);
  VTOKEN_RETURN_IF_ERROR(Exec(db, store.path_, "PRAGMA query_only = ON"));
  VTOKEN_ASSIGN_OR_RETURN(int64_t version, QueryInt(db, store.path_, "PRAGMA user_version"));
  if (version != kResultSchemaVersion) {
    return FailedPreconditionError(
        "result db " + path + ": schema version " + std::to_string(version) + ", expected " +
        std::to_string(kResultSchemaVersion) +
        (version == 0 ? " (not a vtoken result database)" : ""));
  }
  return store;
}

ResultStore::ResultStore(ResultStore&& other) noexcept
    : path_(std::move(other.path_)),
      db_(std::exchange(other.db_, nullptr)),
      read_only_(other.read_only_) {}

ResultStore& ResultStore::operator=(ResultStore&& other) noexcept {
  if (this != &other) {
    sqlite3_close(db_);
    path_ = std::move(other.path_);
    db_ = std::exchange(other.db_, nullptr);
    read_only_ = other.read_only_;
  }
  return *this;
}

RunRecord ResultStore::Presented(RunRecord run) const {
  if (read_only_ && run.status == "running" && !ProcessAlive(run.pid)) {
    run.status = "interrupted";
    run.error = InterruptedMessage(run.pid);
  }
  return run;
}

ResultStore::~ResultStore() { sqlite3_close(db_); }

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
  // Another process may have created the schema between the check and BEGIN.
  VTOKEN_ASSIGN_OR_RETURN(version, QueryInt(db_, path_, "PRAGMA user_version"));
  if (version > kResultSchemaVersion) return too_new(version);
  if (version == kResultSchemaVersion) return Status::Ok();
  for (std::string_view sql : kSchema) VTOKEN_RETURN_IF_ERROR(Exec(db_, path_, sql));
  VTOKEN_RETURN_IF_ERROR(
      Exec(db_, path_, "PRAGMA user_version = " + std::to_string(kResultSchemaVersion)));
  return txn.Commit();
}

Status ResultStore::MarkInterruptedRuns() {
  std::vector<std::pair<int64_t, int64_t>> dead;  // (run id, pid)
  {
    VTOKEN_ASSIGN_OR_RETURN(
        Stmt select,
        Stmt::Prepare(db_, path_, "SELECT id, pid FROM runs WHERE status = 'running'"));
    while (true) {
      VTOKEN_ASSIGN_OR_RETURN(bool row, select.Step());
      if (!row) break;
      if (!ProcessAlive(select.Int(1))) dead.emplace_back(select.Int(0), select.Int(1));
    }
  }
  if (dead.empty()) return Status::Ok();
  VTOKEN_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_, path_));
  const std::string sql =
      "UPDATE runs SET status = 'interrupted', error = ?2, finished = " + std::string(kNow) +
      " WHERE id = ?1 AND status = 'running'";
  VTOKEN_ASSIGN_OR_RETURN(Stmt update, Stmt::Prepare(db_, path_, sql));
  for (const auto& [id, pid] : dead) {
    update.Bind(1, id);
    update.Bind(2, InterruptedMessage(pid));
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
  const std::string sql =
      "INSERT INTO runs (created, git_sha, config_toml, config_hash, sweep, model, mode, policy, "
      "budget, block_size, num_blocks, workload, seed, status, pid) VALUES (" +
      std::string(kNow) + ", " + Placeholders(1, 12) + ", 'running', ?13)";
  VTOKEN_ASSIGN_OR_RETURN(Stmt s, Stmt::Prepare(db_, path_, sql));
  s.Bind(1, run.git_sha);
  s.Bind(2, run.config_toml);
  s.Bind(3, run.config_hash);
  s.Bind(4, run.sweep);
  s.Bind(5, run.model);
  s.Bind(6, run.mode);
  s.Bind(7, run.policy);
  s.Bind(8, run.budget);
  s.Bind(9, int64_t{run.block_size});
  s.Bind(10, int64_t{run.num_blocks});
  s.Bind(11, run.workload);
  s.Bind(12, static_cast<int64_t>(run.seed));
  s.Bind(13, static_cast<int64_t>(::getpid()));
  VTOKEN_RETURN_IF_ERROR(s.Run());
  return static_cast<int64_t>(sqlite3_last_insert_rowid(db_));
}

Status ResultStore::AppendSteps(int64_t run_id, const std::vector<StepRecord>& steps) {
  VTOKEN_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_, path_));
  VTOKEN_RETURN_IF_ERROR(CheckRunning(run_id));
  VTOKEN_RETURN_IF_ERROR(InsertSteps(run_id, steps));
  return txn.Commit();
}

Status ResultStore::InsertSteps(int64_t run_id, const std::vector<StepRecord>& steps) {
  const std::string sql = "INSERT INTO steps (run_id, " + std::string(kStepColumns) + ") VALUES (" +
                          Placeholders(1, 17) + ")";
  VTOKEN_ASSIGN_OR_RETURN(Stmt s, Stmt::Prepare(db_, path_, sql));
  for (const StepRecord& r : steps) {
    s.Bind(1, run_id);
    s.Bind(2, r.step);
    s.Bind(3, r.time_s);
    s.Bind(4, int64_t{r.num_running});
    s.Bind(5, int64_t{r.num_waiting});
    s.Bind(6, int64_t{r.free_blocks});
    s.Bind(7, int64_t{r.allocated_blocks});
    s.Bind(8, r.live_slots);
    s.Bind(9, r.waste_ratio);
    s.Bind(10, int64_t{r.held_blocks});
    s.Bind(11, int64_t{r.ideal_blocks});
    for (int i = 0; i < 4; ++i) s.Bind(12 + i, int64_t{r.hist[i]});
    s.Bind(16, r.moves);
    s.Bind(17, r.fence_waits);
    VTOKEN_RETURN_IF_ERROR(s.Run());
  }
  return Status::Ok();
}

Status ResultStore::AppendRequests(int64_t run_id, const std::vector<RequestRecord>& requests) {
  VTOKEN_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_, path_));
  VTOKEN_RETURN_IF_ERROR(CheckRunning(run_id));
  VTOKEN_RETURN_IF_ERROR(InsertRequests(run_id, requests));
  return txn.Commit();
}

Status ResultStore::InsertRequests(int64_t run_id, const std::vector<RequestRecord>& requests) {
  const std::string sql = "INSERT INTO requests (run_id, " + std::string(kRequestColumns) +
                          ") VALUES (" + Placeholders(1, 14) + ")";
  VTOKEN_ASSIGN_OR_RETURN(Stmt s, Stmt::Prepare(db_, path_, sql));
  for (const RequestRecord& r : requests) {
    s.Bind(1, run_id);
    s.Bind(2, r.request_id);
    s.Bind(3, r.prompt_tokens);
    s.Bind(4, r.output_tokens);
    s.Bind(5, r.arrival_s);
    s.Bind(6, r.first_token_s);
    s.Bind(7, r.finish_s);
    s.Bind(8, r.ttft_s);
    s.Bind(9, r.tpot_s);
    s.Bind(10, r.e2e_s);
    s.Bind(11, int64_t{r.preemptions});
    s.Bind(12, r.blocks_mean);
    s.Bind(13, int64_t{r.blocks_final});
    s.Bind(14, int64_t{r.ideal_blocks_final});
    VTOKEN_RETURN_IF_ERROR(s.Run());
  }
  return Status::Ok();
}

Status ResultStore::AppendOutputs(int64_t run_id, const std::vector<OutputRecord>& outputs) {
  VTOKEN_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_, path_));
  VTOKEN_RETURN_IF_ERROR(CheckRunning(run_id));
  VTOKEN_RETURN_IF_ERROR(InsertOutputs(run_id, outputs));
  return txn.Commit();
}

Status ResultStore::InsertOutputs(int64_t run_id, const std::vector<OutputRecord>& outputs) {
  VTOKEN_ASSIGN_OR_RETURN(Stmt s,
                          Stmt::Prepare(db_, path_,
                                        "INSERT INTO outputs (run_id, request_id, text, token_ids) "
                                        "VALUES (?1, ?2, ?3, ?4)"));
  for (const OutputRecord& r : outputs) {
    s.Bind(1, run_id);
    s.Bind(2, r.request_id);
    s.Bind(3, r.text);
    s.Bind(4, nlohmann::json(r.token_ids).dump());
    VTOKEN_RETURN_IF_ERROR(s.Run());
  }
  return Status::Ok();
}

Status ResultStore::FinishRun(int64_t run_id, const std::map<std::string, double>& summary,
                              const std::map<std::string, std::string>& text) {
  VTOKEN_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_, path_));
  VTOKEN_RETURN_IF_ERROR(CheckRunning(run_id));
  VTOKEN_RETURN_IF_ERROR(InsertSummary(run_id, summary, text));
  return txn.Commit();
}

Status ResultStore::CompleteRun(int64_t run_id, const RunRows& rows,
                                const std::map<std::string, double>& summary,
                                const std::map<std::string, std::string>& text) {
  VTOKEN_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_, path_));
  VTOKEN_RETURN_IF_ERROR(CheckRunning(run_id));
  VTOKEN_RETURN_IF_ERROR(InsertSteps(run_id, rows.steps));
  VTOKEN_RETURN_IF_ERROR(InsertRequests(run_id, rows.requests));
  VTOKEN_RETURN_IF_ERROR(InsertOutputs(run_id, rows.outputs));
  VTOKEN_RETURN_IF_ERROR(InsertSummary(run_id, summary, text));
  return txn.Commit();
}

Status ResultStore::InsertSummary(int64_t run_id, const std::map<std::string, double>& summary,
                                  const std::map<std::string, std::string>& text) {
  {
    VTOKEN_ASSIGN_OR_RETURN(
        Stmt s,
        Stmt::Prepare(db_, path_, "INSERT INTO summary (run_id, name, value) VALUES (?1, ?2, ?3)"));
    for (const auto& [name, value] : summary) {
      s.Bind(1, run_id);
      s.Bind(2, name);
      s.Bind(3, value);
      VTOKEN_RETURN_IF_ERROR(s.Run());
    }
  }
  {
    VTOKEN_ASSIGN_OR_RETURN(
        Stmt s,
        Stmt::Prepare(db_, path_,
                      "INSERT INTO summary_text (run_id, name, value) VALUES (?1, ?2, ?3)"));
    for (const auto& [name, value] : text) {
      s.Bind(1, run_id);
      s.Bind(2, name);
      s.Bind(3, value);
      VTOKEN_RETURN_IF_ERROR(s.Run());
    }
  }
  const std::string sql =
      "UPDATE runs SET status = 'completed', finished = " + std::string(kNow) + " WHERE id = ?1";
  VTOKEN_ASSIGN_OR_RETURN(Stmt update, Stmt::Prepare(db_, path_, sql));
  update.Bind(1, run_id);
  VTOKEN_RETURN_IF_ERROR(update.Run());
  return Status::Ok();
}

Status ResultStore::FailRun(int64_t run_id, const std::string& message) {
  return EndRun(run_id, "failed", message);
}

Status ResultStore::InterruptRun(int64_t run_id, const std::string& message) {
  return EndRun(run_id, "interrupted", message);
}

Status ResultStore::EndRun(int64_t run_id, std::string_view status, const std::string& message) {
  VTOKEN_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_, path_));
  VTOKEN_RETURN_IF_ERROR(CheckRunning(run_id));
  // A run that did not complete keeps no rows but its own: readers never see half a run.
  for (const auto& [table, columns] : kChildTables) {
    VTOKEN_ASSIGN_OR_RETURN(
        Stmt del,
        Stmt::Prepare(db_, path_, "DELETE FROM " + std::string(table) + " WHERE run_id = ?1"));
    del.Bind(1, run_id);
    VTOKEN_RETURN_IF_ERROR(del.Run());
  }
  const std::string sql = "UPDATE runs SET status = ?3, error = ?2, finished = " +
                          std::string(kNow) + " WHERE id = ?1";
  VTOKEN_ASSIGN_OR_RETURN(Stmt update, Stmt::Prepare(db_, path_, sql));
  update.Bind(1, run_id);
  update.Bind(2, message);
  update.Bind(3, std::string(status));
  VTOKEN_RETURN_IF_ERROR(update.Run());
  return txn.Commit();
}

StatusOr<std::vector<RunRecord>> ResultStore::ListRuns(const RunFilter& filter) const {
  // A read-only store presents dead 'running' runs as 'interrupted' (see Presented), so it
  // filters by status, and hence applies `last`, after reading the rows.
  const bool status_in_sql = !filter.status.empty() && !read_only_;
  const bool limit_in_sql = filter.last > 0 && (filter.status.empty() || status_in_sql);
  std::string sql(kRunSelect);
  std::vector<std::string> where;
  int next = 1;
  if (!filter.ids.empty()) {
    where.push_back("id IN (" + Placeholders(next, static_cast<int>(filter.ids.size())) + ")");
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
    RunRecord run = Presented(ReadRun(s));
    if (filter.status.empty() || run.status == filter.status) runs.push_back(std::move(run));
  }
  std::reverse(runs.begin(), runs.end());
  return runs;
}

StatusOr<RunRecord> ResultStore::GetRun(int64_t run_id) const {
  VTOKEN_ASSIGN_OR_RETURN(Stmt s,
                          Stmt::Prepare(db_, path_, std::string(kRunSelect) + " WHERE id = ?1"));
  s.Bind(1, run_id);
  VTOKEN_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return NotFoundError("result db " + path_ + ": no run " + std::to_string(run_id));
  return Presented(ReadRun(s));
}

StatusOr<RunSummary> ResultStore::GetSummary(int64_t run_id) const {
  VTOKEN_RETURN_IF_ERROR(CheckExists(run_id));
  RunSummary summary;
  for (const bool text : {false, true}) {
    VTOKEN_ASSIGN_OR_RETURN(
        Stmt s, Stmt::Prepare(db_, path_,
                              text ? "SELECT name, value FROM summary_text WHERE run_id = ?1"
                                   : "SELECT name, value FROM summary WHERE run_id = ?1"));
    s.Bind(1, run_id);
    while (true) {
      VTOKEN_ASSIGN_OR_RETURN(bool row, s.Step());
      if (!row) break;
      if (text) {
        summary.text[s.Text(0)] = s.Text(1);
      } else {
        summary.values[s.Text(0)] = s.Real(1);
      }
    }
  }
  return summary;
}

StatusOr<std::vector<RequestRecord>> ResultStore::GetRequests(int64_t run_id) const {
  VTOKEN_RETURN_IF_ERROR(CheckExists(run_id));
  const std::string sql = "SELECT " + std::string(kRequestColumns) +
                          " FROM requests WHERE run_id = ?1 ORDER BY request_id";
  VTOKEN_ASSIGN_OR_RETURN(Stmt s, Stmt::Prepare(db_, path_, sql));
  s.Bind(1, run_id);
  std::vector<RequestRecord> out;
  while (true) {
    VTOKEN_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    RequestRecord r;
    r.request_id = s.Int(0);
    r.prompt_tokens = s.Int(1);
    r.output_tokens = s.Int(2);
    r.arrival_s = s.Real(3);
    r.first_token_s = s.Real(4);
    r.finish_s = s.Real(5);
    r.ttft_s = s.Real(6);
    r.tpot_s = s.Real(7);
    r.e2e_s = s.Real(8);
    r.preemptions = static_cast<int32_t>(s.Int(9));
    r.blocks_mean = s.Real(10);
    r.blocks_final = static_cast<int32_t>(s.Int(11));
    r.ideal_blocks_final = static_cast<int32_t>(s.Int(12));
    out.push_back(r);
  }
  return out;
}

StatusOr<std::vector<StepRecord>> ResultStore::GetSteps(int64_t run_id) const {
  VTOKEN_RETURN_IF_ERROR(CheckExists(run_id));
  const std::string sql =
      "SELECT " + std::string(kStepColumns) + " FROM steps WHERE run_id = ?1 ORDER BY step";
  VTOKEN_ASSIGN_OR_RETURN(Stmt s, Stmt::Prepare(db_, path_, sql));
  s.Bind(1, run_id);
  std::vector<StepRecord> out;
  while (true) {
    VTOKEN_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    StepRecord r;
    r.step = s.Int(0);
    r.time_s = s.Real(1);
    r.num_running = static_cast<int32_t>(s.Int(2));
    r.num_waiting = static_cast<int32_t>(s.Int(3));
    r.free_blocks = static_cast<int32_t>(s.Int(4));
    r.allocated_blocks = static_cast<int32_t>(s.Int(5));
    r.live_slots = s.Int(6);
    r.waste_ratio = s.Real(7);
    r.held_blocks = static_cast<int32_t>(s.Int(8));
    r.ideal_blocks = static_cast<int32_t>(s.Int(9));
    for (int i = 0; i < 4; ++i) r.hist[i] = static_cast<int32_t>(s.Int(10 + i));
    r.moves = s.Int(14);
    r.fence_waits = s.Int(15);
    out.push_back(r);
  }
  return out;
}

StatusOr<std::vector<OutputRecord>> ResultStore::GetOutputs(int64_t run_id) const {
  VTOKEN_RETURN_IF_ERROR(CheckExists(run_id));
  VTOKEN_ASSIGN_OR_RETURN(
      Stmt s, Stmt::Prepare(db_, path_,
                            "SELECT request_id, text, token_ids FROM outputs WHERE run_id = ?1 "
                            "ORDER BY request_id"));
  s.Bind(1, run_id);
  std::vector<OutputRecord> out;
  while (true) {
    VTOKEN_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    OutputRecord r;
    r.request_id = s.Int(0);
    r.text = s.Text(1);
    const auto ids = nlohmann::json::parse(s.Text(2), nullptr, /*allow_exceptions=*/false);
    if (!ids.is_array()) {
      return DataLossError("result db " + path_ + ": outputs of run " + std::to_string(run_id) +
                           " request " + std::to_string(r.request_id) +
                           ": token_ids is not a JSON array");
    }
    for (const auto& id : ids) {
      if (!id.is_number_integer()) {
        return DataLossError("result db " + path_ + ": outputs of run " + std::to_string(run_id) +
                             " request " + std::to_string(r.request_id) +
                             ": token_ids holds a non-integer");
      }
      r.token_ids.push_back(id.get<int32_t>());
    }
    out.push_back(std::move(r));
  }
  return out;
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

Status ResultStore::MergeInto(const std::vector<std::string>& sources, MergeStats* stats) {
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
    // Errors about the source name it, not this database.
    VTOKEN_ASSIGN_OR_RETURN(Stmt attach, Stmt::Prepare(db_, source, "ATTACH DATABASE ?1 AS src"));
    attach.Bind(1, source);
    VTOKEN_RETURN_IF_ERROR(attach.Run());
  }
  // Detaches on every path out of this function, after the transaction has ended.
  struct Detach {
    ResultStore* self;
    ~Detach() { Exec(self->db_, self->path_, "DETACH DATABASE src").IgnoreError(); }
  } detach{this};

  VTOKEN_ASSIGN_OR_RETURN(int64_t version, QueryInt(db_, source, "PRAGMA src.user_version"));
  if (version != kResultSchemaVersion) {
    return FailedPreconditionError("result db " + path_ + ": merge source " + source +
                                   " has schema version " + std::to_string(version) +
                                   ", expected " + std::to_string(kResultSchemaVersion));
  }
  MergeStats local;
  {
    VTOKEN_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_, path_));
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
    const std::string insert_run = "INSERT INTO main.runs (" + std::string(kRunCopyColumns) +
                                   ") SELECT " + std::string(kRunCopyColumns) +
                                   " FROM src.runs WHERE id = ?1";
    VTOKEN_ASSIGN_OR_RETURN(Stmt copy_run, Stmt::Prepare(db_, path_, insert_run));
    std::vector<Stmt> copy_children;
    for (const auto& [table, columns] : kChildTables) {
      const std::string sql = "INSERT INTO main." + std::string(table) + " (run_id, " +
                              std::string(columns) + ") SELECT ?1, " + std::string(columns) +
                              " FROM src." + std::string(table) + " WHERE run_id = ?2";
      VTOKEN_ASSIGN_OR_RETURN(Stmt s, Stmt::Prepare(db_, path_, sql));
      copy_children.push_back(std::move(s));
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
      const int64_t new_id = sqlite3_last_insert_rowid(db_);
      for (Stmt& s : copy_children) {
        s.Bind(1, new_id);
        s.Bind(2, old_id);
        VTOKEN_RETURN_IF_ERROR(s.Run());
      }
      ++local.runs_copied;
    }
    VTOKEN_RETURN_IF_ERROR(txn.Commit());
  }
  stats.runs_copied += local.runs_copied;
  stats.runs_skipped += local.runs_skipped;
  return Status::Ok();
}

}  // namespace vtoken::engine
