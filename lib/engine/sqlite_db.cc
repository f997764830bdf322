#include "lib/engine/sqlite_db.h"

#include <sqlite3.h>

#include <limits>
#include <utility>

namespace vtoken::engine::sql {
namespace {

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

}  // namespace

StatusOr<sqlite3*> OpenFile(const std::string& path, bool create, int busy_timeout_ms) {
  sqlite3* db = nullptr;
  const int flags = create ? SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE : SQLITE_OPEN_READONLY;
  const int rc = sqlite3_open_v2(path.c_str(), &db, flags, nullptr);
  if (rc != SQLITE_OK) {
    Status s =
        SqlError(db, rc, path, create ? "open (is the directory writable?)" : "open read-only");
    sqlite3_close(db);
    return s;
  }
  sqlite3_busy_timeout(db, busy_timeout_ms);
  return db;
}

void CloseFile(sqlite3* db) { sqlite3_close(db); }

int64_t LastInsertRowid(sqlite3* db) { return sqlite3_last_insert_rowid(db); }

StatusOr<Stmt> Stmt::Prepare(sqlite3* db, const std::string& path, std::string_view sql) {
  sqlite3_stmt* s = nullptr;
  const int rc = sqlite3_prepare_v2(db, sql.data(), static_cast<int>(sql.size()), &s, nullptr);
  if (rc != SQLITE_OK) return SqlError(db, rc, path, sql);
  return Stmt(db, path, sql, s);
}

Stmt::Stmt(Stmt&& o) noexcept
    : db_(o.db_), path_(o.path_), sql_(std::move(o.sql_)), s_(std::exchange(o.s_, nullptr)) {}

Stmt::~Stmt() { sqlite3_finalize(s_); }

void Stmt::Bind(int i, int64_t v) { sqlite3_bind_int64(s_, i, v); }
void Stmt::Bind(int i, double v) { sqlite3_bind_double(s_, i, v); }
void Stmt::Bind(int i, std::string_view v) {
  sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
}
void Stmt::BindValue(int i, const Value& v) {
  if (const auto* x = std::get_if<int64_t>(&v)) return Bind(i, *x);
  if (const auto* x = std::get_if<double>(&v)) return Bind(i, *x);
  if (const auto* x = std::get_if<std::string>(&v)) return Bind(i, std::string_view(*x));
  sqlite3_bind_null(s_, i);
}

StatusOr<bool> Stmt::Step() {
  const int rc = sqlite3_step(s_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return SqlError(db_, rc, path_, sql_);
}

Status Stmt::Run() {
  StatusOr<bool> row = Step();
  sqlite3_reset(s_);
  sqlite3_clear_bindings(s_);
  if (!row.ok()) return row.status();
  return Status::Ok();
}

int64_t Stmt::Int(int col) const { return sqlite3_column_int64(s_, col); }

double Stmt::Real(int col) const {
  // SQLite stores NaN as NULL; a missing figure reads back as NaN, not 0.
  if (sqlite3_column_type(s_, col) == SQLITE_NULL) return std::numeric_limits<double>::quiet_NaN();
  return sqlite3_column_double(s_, col);
}

std::string Stmt::Text(int col) const {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s_, col));
  return p == nullptr ? std::string() : std::string(p, sqlite3_column_bytes(s_, col));
}

Value Stmt::Get(int col) const {
  switch (sqlite3_column_type(s_, col)) {
    case SQLITE_INTEGER:
      return Int(col);
    case SQLITE_FLOAT:
      return Real(col);
    case SQLITE_NULL:
      return std::monostate();
    default:
      return Text(col);
  }
}

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

StatusOr<Transaction> Transaction::Begin(sqlite3* db, const std::string& path) {
  VTOKEN_RETURN_IF_ERROR(Exec(db, path, "BEGIN IMMEDIATE"));
  return Transaction(db, path);
}

Transaction::Transaction(Transaction&& o) noexcept
    : db_(std::exchange(o.db_, nullptr)), path_(o.path_) {}

Transaction::~Transaction() {
  if (db_ != nullptr) Exec(db_, path_, "ROLLBACK").IgnoreError();
}

Status Transaction::Commit() {
  Status s = Exec(db_, path_, "COMMIT");
  if (s.ok()) db_ = nullptr;
  return s;
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

}  // namespace vtoken::engine::sql
