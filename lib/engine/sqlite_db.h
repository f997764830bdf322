// The result store's thin layer over SQLite: opening a database file, prepared statements,
// write transactions and the mapping of SQLite result codes to Status codes. Every error names
// the file it is about (the `path` given to each call) and the statement that failed, its
// whitespace collapsed to at most 80 characters. This is the only file pair of lib/ that
// includes sqlite3.h. Objects here are used by one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "lib/core/status.h"

struct sqlite3;
struct sqlite3_stmt;

namespace vtoken::engine::sql {

// One SQL value: NULL, INTEGER, REAL or TEXT. SQLite stores a NaN REAL as NULL.
using Value = std::variant<std::monostate, int64_t, double, std::string>;

// Opens (read-write, creating it if `create`, else read-only) the database at `path`, with
// `busy_timeout_ms` for locks. Errors: kNotFound when the file cannot be opened, as CodeOf.
StatusOr<sqlite3*> OpenFile(const std::string& path, bool create, int busy_timeout_ms);
// Closes a connection from OpenFile; null is ignored.
void CloseFile(sqlite3* db);
// The rowid of the last row this connection inserted.
int64_t LastInsertRowid(sqlite3* db);

// A prepared statement. `path` is the file its errors name; it must outlive the statement.
class Stmt {
 public:
  static StatusOr<Stmt> Prepare(sqlite3* db, const std::string& path, std::string_view sql);
  Stmt(Stmt&& o) noexcept;
  Stmt& operator=(Stmt&&) = delete;
  ~Stmt();

  // Parameters are 1-based, as in SQL ("?1").
  void Bind(int i, int64_t v);
  void Bind(int i, double v);
  void Bind(int i, std::string_view v);
  void BindValue(int i, const Value& v);

  // Returns true when a row is ready, false when the statement is done.
  StatusOr<bool> Step();
  // Steps to completion, then resets so the statement can be bound and run again.
  Status Run();

  // Column values of the current row (0-based). A NULL reads as 0, NaN and "" respectively.
  int64_t Int(int col) const;
  double Real(int col) const;
  std::string Text(int col) const;
  // The value with its stored type (a NULL is monostate).
  Value Get(int col) const;

 private:
  Stmt(sqlite3* db, const std::string& path, std::string_view sql, sqlite3_stmt* s)
      : db_(db), path_(path), sql_(sql), s_(s) {}

  sqlite3* db_;
  const std::string& path_;
  std::string sql_;  // For error messages.
  sqlite3_stmt* s_;
};

// Runs `sql` (every row ignored).
Status Exec(sqlite3* db, const std::string& path, std::string_view sql);
// The first column of the first row of `sql` as an integer; kInternal when there is no row.
StatusOr<int64_t> QueryInt(sqlite3* db, const std::string& path, std::string_view sql);

// A write transaction; rolled back unless committed. IMMEDIATE takes the write lock up front, so
// two writers wait for each other at BEGIN (busy timeout) instead of deadlocking mid-way.
class Transaction {
 public:
  static StatusOr<Transaction> Begin(sqlite3* db, const std::string& path);
  Transaction(Transaction&& o) noexcept;
  Transaction& operator=(Transaction&&) = delete;
  ~Transaction();
  Status Commit();

 private:
  Transaction(sqlite3* db, const std::string& path) : db_(db), path_(path) {}
  sqlite3* db_;
  const std::string& path_;
};

// "?first, ?first+1, ..." with `count` parameters.
std::string Placeholders(int first, int count);

}  // namespace vtoken::engine::sql
