// ResultStore: the SQLite database every run is recorded in (DESIGN.md §9). Raw data (per-step
// pool figures, per-request latencies, generated outputs) is stored; summaries are derived from
// it and written once, when the run completes.
//
// Schema (PRAGMA user_version = kResultSchemaVersion; the tables in result_schema.h), WAL
// journal, foreign keys on. A writer's Open migrates an older file; a read-only open reads one
// as it is (columns added since read as NULL).
//
// Run life cycle: BeginRun inserts a 'running' row and takes the run's lock (RunLocks); the
// engine appends batches of steps, requests and outputs (each batch one transaction);
// FinishRun writes the summary and marks the run 'completed' in one transaction (CompleteRun
// does all of it in one), FailRun marks it 'failed' and InterruptRun 'interrupted', each
// deleting the rows the run had appended. The lock is released when the run ends, when FailRun
// or InterruptRun gives up on it (even if its transaction fails, e.g. on a full disk), or when
// its process dies; a store closed mid-run leaves the run to its live process. Open marks every
// 'running' run whose lock no one holds 'interrupted' (runs written before schema 2, which hold no
// lock, when their pid is no live process of this host), and leaves alone runs that another live
// writer is recording. So a run with summary rows is always a completed one, and a failed or
// interrupted run has none.
//
// Every error names the database path and the statement that failed. One ResultStore is used by
// one thread at a time; several processes may share one database file (writers wait up to
// `busy_timeout_ms` for the lock).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lib/core/status.h"
#include "lib/engine/result_schema.h"
#include "lib/engine/run_lock.h"

struct sqlite3;

namespace vtoken::engine {

// Everything a finished run records besides its summary (CompleteRun).
struct RunRows {
  std::vector<StepRecord> steps;
  std::vector<RequestRecord> requests;
  std::vector<OutputRecord> outputs;
};

struct RunSummary {
  std::map<std::string, double> values;     // table summary
  std::map<std::string, std::string> text;  // table summary_text
};

// Which runs ListRuns returns; empty fields do not filter. Results are in ascending id order.
struct RunFilter {
  std::vector<int64_t> ids;  // only these ids
  std::string sweep;         // only runs of this sweep
  std::string status;        // only runs with this status
  int64_t last = 0;          // if > 0, only the `last` highest ids among the matches
};

struct MergeStats {
  int64_t runs_copied = 0;
  int64_t runs_skipped = 0;  // already completed in the target (same config_hash and sweep)
};

class ResultStore {
 public:
  // Opens (creating if needed, with parent directories) the database at `path`, creates or
  // migrates the schema, and marks 'running' runs whose writer is gone 'interrupted'.
  // Errors: kNotFound when the directory cannot be created or the file cannot be opened,
  // kFailedPrecondition when the database has a newer schema version than this build,
  // kDataLoss when the file is not a SQLite database.
  static StatusOr<ResultStore> Open(const std::string& path, int busy_timeout_ms = 10000);
  // Opens an existing database for reading only (the read-only commands: runs, compare, report,
  // export): never creates the file or the schema and writes nothing. A 'running' run whose
  // writer is gone reads back as 'interrupted' (with Open's error text) but stays 'running' in
  // the file until a writer opens it. Every write returns kFailedPrecondition.
  // Errors: kNotFound when the file does not exist, kFailedPrecondition when its schema version
  // is not 1..this build's (0: not a result database), kDataLoss when it is not SQLite.
  static StatusOr<ResultStore> OpenReadOnly(const std::string& path, int busy_timeout_ms = 10000);

  ResultStore(ResultStore&& other) noexcept;
  ResultStore& operator=(ResultStore&& other) noexcept;
  ResultStore(const ResultStore&) = delete;
  ResultStore& operator=(const ResultStore&) = delete;
  ~ResultStore();

  const std::string& path() const { return path_; }
  bool read_only() const { return read_only_; }
  // The file's schema version (kResultSchemaVersion unless read-only on an older file).
  int schema_version() const { return version_; }

  // Inserts a run with status 'running', created = now, pid = getpid(), and takes its lock.
  // Returns its id.
  StatusOr<int64_t> BeginRun(const RunRecord& run);

  // Each appends its rows in one transaction. kNotFound for an unknown run, kFailedPrecondition
  // when the run is not 'running', kInvalidArgument for a duplicate step or request id.
  Status AppendSteps(int64_t run_id, const std::vector<StepRecord>& steps);
  Status AppendRequests(int64_t run_id, const std::vector<RequestRecord>& requests);
  Status AppendOutputs(int64_t run_id, const std::vector<OutputRecord>& outputs);

  // In one transaction: writes the summary rows, sets status 'completed' and finished = now.
  // kFailedPrecondition when the run is not 'running'.
  Status FinishRun(int64_t run_id, const std::map<std::string, double>& summary,
                   const std::map<std::string, std::string>& text = {});
  // In one transaction: appends `rows`, writes the summary and marks the run 'completed'. On any
  // error (disk full included) nothing of it is written and the run stays 'running'.
  Status CompleteRun(int64_t run_id, const RunRows& rows,
                     const std::map<std::string, double>& summary,
                     const std::map<std::string, std::string>& text = {});
  // In one transaction: deletes every row the run appended (steps, requests, outputs, summary),
  // sets status 'failed' (FailRun) or 'interrupted' (InterruptRun), error = `message`,
  // finished = now. kFailedPrecondition when the run is not 'running'.
  Status FailRun(int64_t run_id, const std::string& message);
  Status InterruptRun(int64_t run_id, const std::string& message);

  StatusOr<std::vector<RunRecord>> ListRuns(const RunFilter& filter = {}) const;
  // kNotFound for an unknown id (as for every Get*).
  StatusOr<RunRecord> GetRun(int64_t run_id) const;
  StatusOr<RunSummary> GetSummary(int64_t run_id) const;
  // Rows in request_id / step order.
  StatusOr<std::vector<RequestRecord>> GetRequests(int64_t run_id) const;
  StatusOr<std::vector<StepRecord>> GetSteps(int64_t run_id) const;
  StatusOr<std::vector<OutputRecord>> GetOutputs(int64_t run_id) const;

  // Returns the id of a completed run with this config hash and sweep (the newest if several),
  // or nullopt.
  StatusOr<std::optional<int64_t>> FindCompleted(const std::string& config_hash,
                                                 const std::string& sweep) const;

  // Copies every completed run of each source database, with all its rows, into this one under
  // new ids, one transaction per source. Skips a run whose (config_hash, sweep) is already
  // completed here (runs with an empty config_hash are always copied). Sources are not modified;
  // one of an older schema version gives NULL for the columns it lacks. kNotFound for a missing
  // source; kFailedPrecondition for a source that is this database or has a schema version
  // outside 1..kResultSchemaVersion; kDataLoss, naming the source, for a corrupt source. `stats`,
  // if given, receives the counts over all sources.
  Status MergeInto(const std::vector<std::string>& sources, MergeStats* stats = nullptr);

 private:
  ResultStore(std::string path, sqlite3* db, bool read_only)
      : path_(std::move(path)), db_(db), read_only_(read_only) {}

  Status InitSchema();
  Status MarkInterruptedRuns();
  // Whether the process recording a 'running' run is still at it (see the life cycle above).
  bool WriterAlive(const RunRecord& run) const;
  // The rows of a run in a child table, in key order; the columns this file lacks read NULL.
  template <typename Record>
  StatusOr<std::vector<Record>> ReadRows(const Table<Record>& table, int64_t run_id) const;
  template <typename Record>
  Status InsertRows(const Table<Record>& table, int64_t run_id, const std::vector<Record>& rows);
  // OK if the run exists and is 'running'.
  Status CheckRunning(int64_t run_id) const;
  Status CheckExists(int64_t run_id) const;
  Status MergeOne(const std::string& source, MergeStats& stats);
  // The rows of one run, without a transaction or status check (the callers have both).
  Status InsertSummary(int64_t run_id, const std::map<std::string, double>& summary,
                       const std::map<std::string, std::string>& text);
  Status EndRun(int64_t run_id, std::string_view status, const std::string& message);
  // A read-only store's view of a run row: see OpenReadOnly.
  RunRecord Presented(RunRecord run) const;

  std::string path_;
  sqlite3* db_ = nullptr;
  bool read_only_ = false;
  int version_ = kResultSchemaVersion;
  RunLocks locks_;
};

}  // namespace vtoken::engine
