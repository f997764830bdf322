// ResultStore: the SQLite database every run is recorded in (DESIGN.md §9). Raw data (per-step
// pool figures, per-request latencies, generated outputs) is stored; summaries are derived from
// it and written once, when the run completes.
//
// Schema (PRAGMA user_version = kSchemaVersion), WAL journal, foreign keys on:
//   runs(id, created, git_sha, config_toml, config_hash, sweep, model, mode, policy, budget,
//        block_size, num_blocks, workload, seed, status, error, pid, finished)
//   requests(run_id, request_id, ...)  steps(run_id, step, ...)  outputs(run_id, request_id, ...)
//   summary(run_id, name, value REAL)  summary_text(run_id, name, value TEXT)
// Times are UTC ISO-8601 ("2025-01-31T12:00:00Z").
//
// Run life cycle: BeginRun inserts a 'running' row; the engine appends batches of steps,
// requests and outputs (each batch one transaction); FinishRun writes the summary and marks the
// run 'completed' in one transaction (CompleteRun does all of it in one), FailRun marks it
// 'failed' and InterruptRun 'interrupted', each deleting the rows the run had appended. A process that dies mid-run
// leaves a 'running' row whose pid is gone; the next Open marks it 'interrupted' (pids are
// those of this host: a database shared between machines must be written by one of them). So a run with
// summary rows is always a completed one, and a failed or interrupted run has none.
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

struct sqlite3;

namespace vtoken::engine {

inline constexpr int kResultSchemaVersion = 1;

// One row of `runs`. The caller fills the configuration fields for BeginRun; the store fills
// id, created, status, error, pid and finished.
struct RunRecord {
  int64_t id = 0;
  std::string created;      // UTC ISO-8601, set by BeginRun
  std::string git_sha;      // commit of the binary that ran, or "" if unknown
  std::string config_toml;  // the fully resolved experiment config
  std::string config_hash;  // identifies the config for sweep --resume and MergeInto
  std::string sweep;        // sweep name, or "" for a single run
  std::string model;        // model directory or "synthetic:<name>"
  std::string mode;         // "native" | "naive" | "vtoken"
  std::string policy;       // eviction policy name, or "" in native mode
  // budget_tokens when the run used an absolute budget, else keep_ratio in (0, 1]; 0 = none.
  double budget = 0.0;
  int32_t block_size = 0;
  int32_t num_blocks = 0;
  std::string workload;  // workload kind or JSONL path
  uint64_t seed = 0;
  std::string status;    // "running" | "completed" | "failed" | "interrupted"
  std::string error;     // why a run failed or was interrupted; "" otherwise
  int64_t pid = 0;       // process that ran it
  std::string finished;  // UTC ISO-8601 when it ended; "" while running
};

// One row of `steps`: pool and fragmentation figures after one engine step (docs/METRICS.md).
struct StepRecord {
  int64_t step = 0;
  double time_s = 0.0;  // seconds since the run started
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  int32_t free_blocks = 0;
  int32_t allocated_blocks = 0;
  int64_t live_slots = 0;
  double waste_ratio = 0.0;  // F = 1 - live_slots / (allocated_blocks * block_size)
  int32_t held_blocks = 0;   // blocks held by running sequences
  int32_t ideal_blocks = 0;  // sum over seqs of ceil(live / block_size)
  // Allocated blocks by utilization: [0,25), [25,50), [50,75), [75,100]%.
  int32_t hist[4] = {0, 0, 0, 0};
  int64_t moves = 0;        // tokens relocated this step
  int64_t fence_waits = 0;  // waits for a pending copy this step
};

// One row of `requests`: the outcome of one request. Times in seconds from the run's start.
struct RequestRecord {
  int64_t request_id = 0;
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  double arrival_s = 0.0;
  double first_token_s = 0.0;
  double finish_s = 0.0;
  double ttft_s = 0.0;
  double tpot_s = 0.0;
  double e2e_s = 0.0;
  int32_t preemptions = 0;
  double blocks_mean = 0.0;  // blocks held, time-mean while running
  int32_t blocks_final = 0;  // blocks held at finish
  int32_t ideal_blocks_final = 0;
};

// One row of `outputs`: what a request generated.
struct OutputRecord {
  int64_t request_id = 0;
  std::string text;
  std::vector<int32_t> token_ids;  // stored as a JSON array
};

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
  // Opens (creating if needed, with parent directories) the database at `path`, creates the
  // schema, and marks 'running' runs whose pid is no live process as 'interrupted'.
  // Errors: kNotFound when the directory cannot be created or the file cannot be opened,
  // kFailedPrecondition when the database has a newer schema version than this build,
  // kDataLoss when the file is not a SQLite database.
  static StatusOr<ResultStore> Open(const std::string& path, int busy_timeout_ms = 10000);
  // Opens an existing database for reading only (the read-only commands: runs, compare, report,
  // export): never creates the file or the schema and writes nothing. A 'running' run whose pid
  // is no live process reads back as 'interrupted' (with Open's error text) but stays 'running'
  // in the file until a writer opens it. Every write returns kFailedPrecondition.
  // Errors: kNotFound when the file does not exist, kFailedPrecondition when its schema version
  // is not this build's (0: not a result database), kDataLoss when it is not a SQLite database.
  static StatusOr<ResultStore> OpenReadOnly(const std::string& path, int busy_timeout_ms = 10000);

  ResultStore(ResultStore&& other) noexcept;
  ResultStore& operator=(ResultStore&& other) noexcept;
  ResultStore(const ResultStore&) = delete;
  ResultStore& operator=(const ResultStore&) = delete;
  ~ResultStore();

  const std::string& path() const { return path_; }
  bool read_only() const { return read_only_; }

  // Inserts a run with status 'running', created = now, pid = getpid(). Returns its id.
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
  // completed here (runs with an empty config_hash are always copied). Sources are not modified.
  // kNotFound for a missing source; kFailedPrecondition for a source that is this database or
  // has another schema version. `stats`, if given, receives the counts over all sources.
  Status MergeInto(const std::vector<std::string>& sources, MergeStats* stats = nullptr);

 private:
  ResultStore(std::string path, sqlite3* db, bool read_only)
      : path_(std::move(path)), db_(db), read_only_(read_only) {}

  Status InitSchema();
  Status MarkInterruptedRuns();
  // OK if the run exists and is 'running'.
  Status CheckRunning(int64_t run_id) const;
  Status CheckExists(int64_t run_id) const;
  Status MergeOne(const std::string& source, MergeStats& stats);
  // The rows of one run, without a transaction or status check (the callers have both).
  Status InsertSteps(int64_t run_id, const std::vector<StepRecord>& steps);
  Status InsertRequests(int64_t run_id, const std::vector<RequestRecord>& requests);
  Status InsertOutputs(int64_t run_id, const std::vector<OutputRecord>& outputs);
  Status InsertSummary(int64_t run_id, const std::map<std::string, double>& summary,
                       const std::map<std::string, std::string>& text);
  Status EndRun(int64_t run_id, std::string_view status, const std::string& message);
  // A read-only store's view of a run row: see OpenReadOnly.
  RunRecord Presented(RunRecord run) const;

  std::string path_;
  sqlite3* db_ = nullptr;
  bool read_only_ = false;
};

}  // namespace vtoken::engine
