// The result database's records and their columns, each column declared once (DESIGN.md §9).
//
// A record struct (RunRecord, StepRecord, RequestRecord, OutputRecord) is one row of its table;
// its column table (kRunColumns, kStepColumns, kRequestColumns, kOutputColumns) lists, per
// column, the SQL name and declaration, the schema version that added it, a one-line doc and
// how to get and set the value in the record. The tables drive the DDL, the migration of older
// files (ALTER TABLE ADD COLUMN), the INSERT, SELECT and merge column lists, the binds and reads
// (ResultStore), `vtoken-cli export`'s requests and steps columns; the Python reader takes the
// names from the file. Adding a column is a field in the record and one line in its table
// (appended last, with `since` = kResultSchemaVersion, bumped if the version was released).
//
// Besides these: summary(run_id, name, value REAL), summary_text(run_id, name, value TEXT).
// Child tables are keyed by (run_id, their first column). Times are UTC ISO-8601.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "lib/engine/sqlite_db.h"

namespace vtoken::engine {

// PRAGMA user_version of a database this build writes. 1: c87a9c5 and before. 2: the task
// columns of requests (task ... score), runs.run_lock. 3: requests.live_per_group. 4:
// requests.score_partial. 5: requests.rouge_l_vs_{native,naive,reference}.
inline constexpr int kResultSchemaVersion = 5;

// One column of the table of `Record`.
template <typename Record>
struct Column {
  std::string_view name;
  std::string_view decl;  // SQL type and constraints, as in CREATE TABLE
  int since;              // schema version that added it
  std::string_view doc;
  sql::Value (*get)(const Record&);
  // Returns false when the stored value is malformed (the reader reports kDataLoss).
  bool (*set)(Record&, const sql::Value&);
};

// A table: its name, its columns, and the SQL after the columns (keys, table options). A child
// table (`child`) starts with run_id, a key of runs; else its first column is the rowid key,
// assigned by SQLite and not inserted.
template <typename Record>
struct Table {
  std::string_view name;
  std::span<const Column<Record>> columns;
  std::string_view tail;
  bool child = true;

  // The columns an INSERT names.
  constexpr std::span<const Column<Record>> inserted() const {
    return child ? columns : columns.subspan(1);
  }
};

// Whether the columns are in the order of the versions that added them, as ALTER TABLE appends
// them, so that a migrated file and a new one have the same column order.
template <typename Record>
constexpr bool VersionsAscend(std::span<const Column<Record>> columns) {
  for (size_t i = 1; i < columns.size(); ++i) {
    if (columns[i].since < columns[i - 1].since || columns[i].since > kResultSchemaVersion) {
      return false;
    }
  }
  return true;
}

namespace schema_internal {

template <typename T>
struct IsOptional : std::false_type {};
template <typename T>
struct IsOptional<std::optional<T>> : std::true_type {};

template <typename T>
sql::Value ToValue(const T& v) {
  if constexpr (IsOptional<T>::value) {
    return v.has_value() ? ToValue(*v) : sql::Value();
  } else if constexpr (std::is_same_v<T, std::string>) {
    return v;
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<double>(v);
  } else {
    return static_cast<int64_t>(v);  // uint64_t is stored bit-cast
  }
}

template <typename T>
T Missing() {
  if constexpr (std::is_floating_point_v<T>) {
    return std::nan("");
  } else {
    return T{};
  }
}

// A NULL sets an optional to nullopt and a plain field to Missing (NaN, 0, "").
template <typename T>
bool FromValue(const sql::Value& v, T& out) {
  if (std::holds_alternative<std::monostate>(v)) {
    out = Missing<T>();
    return true;
  }
  if constexpr (IsOptional<T>::value) {
    typename T::value_type x{};
    if (!FromValue(v, x)) return false;
    out = std::move(x);
  } else if constexpr (std::is_same_v<T, std::string>) {
    const auto* s = std::get_if<std::string>(&v);
    if (s == nullptr) return false;
    out = *s;
  } else if (const auto* i = std::get_if<int64_t>(&v)) {
    out = static_cast<T>(*i);
  } else if (const auto* d = std::get_if<double>(&v)) {
    out = static_cast<T>(*d);
  } else {
    return false;
  }
  return true;
}

template <auto Member, typename Record>
sql::Value Get(const Record& r) {
  return ToValue(r.*Member);
}

template <auto Member, typename Record>
bool Set(Record& r, const sql::Value& v) {
  return FromValue(v, r.*Member);
}

template <typename T>
struct MemberOf;
template <typename R, typename T>
struct MemberOf<T R::*> {
  using Record = R;
  using Type = T;
};

}  // namespace schema_internal

// The column of record field `Member`: Field<&StepRecord::moves>("moves", "INTEGER", 1, "doc").
// `Record` is the class that declares `Member`; name the record when it inherits the field
// (Field<&RequestRecord::ttft_s, RequestRecord>: ttft_s is RequestMetrics').
template <auto Member,
          typename Record = typename schema_internal::MemberOf<decltype(Member)>::Record>
constexpr auto Field(std::string_view name, std::string_view decl, int since,
                     std::string_view doc) {
  static_assert(
      std::is_base_of_v<typename schema_internal::MemberOf<decltype(Member)>::Record, Record>);
  return Column<Record>{name,
                        decl,
                        since,
                        doc,
                        &schema_internal::Get<Member, Record>,
                        &schema_internal::Set<Member, Record>};
}

// One row of `runs`. The caller fills the configuration fields for BeginRun; the store fills
// id, created, status, error, pid, finished and run_lock.
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
  // Whether its writer held the run's lock (RunLocks) while running; nullopt for runs written
  // before schema 2, whose liveness is their pid's.
  std::optional<int64_t> run_lock;
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

// What the engine measures of one request (docs/METRICS.md), declared once: the engine's
// RequestResult and the store's RequestRecord both are one. Times in seconds from the run's start.
struct RequestMetrics {
  int64_t request_id = 0;
  int64_t prompt_tokens = 0;  // the question's tokens included; BOS excluded
  double arrival_s = 0.0;
  double first_token_s = 0.0;
  double finish_s = 0.0;
  double ttft_s = 0.0;
  double tpot_s = 0.0;
  double e2e_s = 0.0;
  int32_t preemptions = 0;
  double blocks_mean = 0.0;        // blocks held, time-mean over the steps it was running
  int32_t blocks_final = 0;        // blocks held at finish
  int32_t ideal_blocks_final = 0;  // ceil(live / block_size) at finish, summed over KV groups
};

// One row of `requests`: the outcome of one request, its engine figures (RequestMetrics) and
// what the run derived from its output.
struct RequestRecord : RequestMetrics {
  int64_t output_tokens = 0;  // tokens generated
  // Task accuracy; nullopt for a workload without tasks.
  std::optional<std::string> task;        // task name, e.g. "passkey"
  std::optional<int64_t> context_tokens;  // target context length of the task instance
  std::optional<double> depth;            // needle depth in [0, 1]
  std::optional<std::string> expected;    // JSON array of the expected answer strings
  std::optional<double> score;            // task score in [0, 1]
  std::optional<double> needle_depth;     // the depth the generator reached
  std::optional<double> nll_mean;         // teacher-forced: mean NLL of its forced tokens (nats)
  // Layer / head granularity: the live tokens of every KV group at finish as JSON, one entry per
  // layer ([n, ...] at layer granularity, [[n per KV head], ...] at head granularity): what the
  // budget allocation kept where. nullopt at token granularity.
  std::optional<std::string> live_per_group;
  // Task requests: the share of the expected answer's characters the output has in place
  // (PartialTaskScore); nullopt for a workload without tasks.
  std::optional<double> score_partial;
  // ROUGE-L F1 of its output against the same request's output in the invocation's native run,
  // in its naive run (vtoken runs), and against the workload's reference text; nullopt when the
  // run had no such counterpart (a simulated model: none).
  std::optional<double> rouge_l_vs_native;
  std::optional<double> rouge_l_vs_naive;
  std::optional<double> rouge_l_vs_reference;
};

// One row of `outputs`: what a request generated.
struct OutputRecord {
  int64_t request_id = 0;
  std::string text;
  std::vector<int32_t> token_ids;  // stored as a JSON array
  // Teacher-forced requests: log p of each forced token, a JSON array; nullopt otherwise.
  std::optional<std::string> token_logprobs;
};

namespace schema_internal {
// runs.finished is NULL while the run is running.
sql::Value FinishedToValue(const RunRecord& r);
bool FinishedFromValue(RunRecord& r, const sql::Value& v);
// outputs.token_ids is a JSON array of integers.
sql::Value TokenIdsToValue(const OutputRecord& r);
bool TokenIdsFromValue(OutputRecord& r, const sql::Value& v);
template <int I>
sql::Value HistToValue(const StepRecord& r) {
  return int64_t{r.hist[I]};
}
template <int I>
bool HistFromValue(StepRecord& r, const sql::Value& v) {
  return FromValue(v, r.hist[I]);
}
}  // namespace schema_internal

inline constexpr Column<RunRecord> kRunColumns[] = {
    Field<&RunRecord::id>("id", "INTEGER PRIMARY KEY", 1, "run id"),
    Field<&RunRecord::created>("created", "TEXT NOT NULL", 1, "when it began"),
    Field<&RunRecord::git_sha>("git_sha", "TEXT NOT NULL DEFAULT ''", 1, "commit of the binary"),
    Field<&RunRecord::config_toml>("config_toml", "TEXT NOT NULL DEFAULT ''", 1, "resolved config"),
    Field<&RunRecord::config_hash>("config_hash", "TEXT NOT NULL DEFAULT ''", 1, "config's hash"),
    Field<&RunRecord::sweep>("sweep", "TEXT NOT NULL DEFAULT ''", 1, "sweep name or ''"),
    Field<&RunRecord::model>("model", "TEXT NOT NULL DEFAULT ''", 1, "model"),
    Field<&RunRecord::mode>("mode", "TEXT NOT NULL DEFAULT ''", 1, "native | naive | vtoken"),
    Field<&RunRecord::policy>("policy", "TEXT NOT NULL DEFAULT ''", 1, "eviction policy"),
    Field<&RunRecord::budget>("budget", "REAL NOT NULL DEFAULT 0", 1, "tokens or keep ratio"),
    Field<&RunRecord::block_size>("block_size", "INTEGER NOT NULL DEFAULT 0", 1, "slots/block"),
    Field<&RunRecord::num_blocks>("num_blocks", "INTEGER NOT NULL DEFAULT 0", 1, "pool blocks"),
    Field<&RunRecord::workload>("workload", "TEXT NOT NULL DEFAULT ''", 1, "workload kind"),
    Field<&RunRecord::seed>("seed", "INTEGER NOT NULL DEFAULT 0", 1, "seed, bit-cast to int64"),
    Field<&RunRecord::status>("status",
                              "TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed', "
                              "'interrupted'))",
                              1, "life cycle state"),
    Field<&RunRecord::error>("error", "TEXT NOT NULL DEFAULT ''", 1, "why it failed"),
    Field<&RunRecord::pid>("pid", "INTEGER NOT NULL DEFAULT 0", 1, "process that ran it"),
    {"finished", "TEXT", 1, "when it ended; NULL while running", &schema_internal::FinishedToValue,
     &schema_internal::FinishedFromValue},
    Field<&RunRecord::run_lock>("run_lock", "INTEGER", 2, "1: writer held the run lock"),
};
static_assert(VersionsAscend<RunRecord>(kRunColumns));
inline constexpr Table<RunRecord> kRunTable{"runs", kRunColumns, "", /*child=*/false};

inline constexpr Column<StepRecord> kStepColumns[] = {
    Field<&StepRecord::step>("step", "INTEGER NOT NULL", 1, "step number"),
    Field<&StepRecord::time_s>("time_s", "REAL", 1, "seconds since the run started"),
    Field<&StepRecord::num_running>("num_running", "INTEGER", 1, "running requests"),
    Field<&StepRecord::num_waiting>("num_waiting", "INTEGER", 1, "waiting requests"),
    Field<&StepRecord::free_blocks>("free_blocks", "INTEGER", 1, "free blocks"),
    Field<&StepRecord::allocated_blocks>("allocated_blocks", "INTEGER", 1, "allocated blocks"),
    Field<&StepRecord::live_slots>("live_slots", "INTEGER", 1, "live token slots"),
    Field<&StepRecord::waste_ratio>("waste_ratio", "REAL", 1, "F"),
    Field<&StepRecord::held_blocks>("held_blocks", "INTEGER", 1, "held by running sequences"),
    Field<&StepRecord::ideal_blocks>("ideal_blocks", "INTEGER", 1, "ideal packed blocks"),
    {"hist0", "INTEGER", 1, "blocks [0,25)% used", &schema_internal::HistToValue<0>,
     &schema_internal::HistFromValue<0>},
    {"hist1", "INTEGER", 1, "blocks [25,50)% used", &schema_internal::HistToValue<1>,
     &schema_internal::HistFromValue<1>},
    {"hist2", "INTEGER", 1, "blocks [50,75)% used", &schema_internal::HistToValue<2>,
     &schema_internal::HistFromValue<2>},
    {"hist3", "INTEGER", 1, "blocks [75,100]% used", &schema_internal::HistToValue<3>,
     &schema_internal::HistFromValue<3>},
    Field<&StepRecord::moves>("moves", "INTEGER", 1, "tokens relocated"),
    Field<&StepRecord::fence_waits>("fence_waits", "INTEGER", 1, "waits for a pending copy"),
};
static_assert(VersionsAscend<StepRecord>(kStepColumns));
inline constexpr Table<StepRecord> kStepTable{"steps", kStepColumns,
                                              "PRIMARY KEY (run_id, step)) WITHOUT ROWID"};

inline constexpr Column<RequestRecord> kRequestColumns[] = {
    Field<&RequestRecord::request_id, RequestRecord>("request_id", "INTEGER NOT NULL", 1,
                                                     "request id"),
    Field<&RequestRecord::prompt_tokens, RequestRecord>("prompt_tokens", "INTEGER", 1,
                                                        "prompt length"),
    Field<&RequestRecord::output_tokens, RequestRecord>("output_tokens", "INTEGER", 1,
                                                        "tokens generated"),
    Field<&RequestRecord::arrival_s, RequestRecord>("arrival_s", "REAL", 1, "arrival time"),
    Field<&RequestRecord::first_token_s, RequestRecord>("first_token_s", "REAL", 1,
                                                        "first token time"),
    Field<&RequestRecord::finish_s, RequestRecord>("finish_s", "REAL", 1, "finish time"),
    Field<&RequestRecord::ttft_s, RequestRecord>("ttft_s", "REAL", 1, "time to first token"),
    Field<&RequestRecord::tpot_s, RequestRecord>("tpot_s", "REAL", 1, "time per output token"),
    Field<&RequestRecord::e2e_s, RequestRecord>("e2e_s", "REAL", 1, "end-to-end latency"),
    Field<&RequestRecord::preemptions, RequestRecord>("preemptions", "INTEGER", 1,
                                                      "times preempted"),
    Field<&RequestRecord::blocks_mean, RequestRecord>("blocks_mean", "REAL", 1,
                                                      "blocks held, time-mean"),
    Field<&RequestRecord::blocks_final, RequestRecord>("blocks_final", "INTEGER", 1,
                                                       "blocks held at finish"),
    Field<&RequestRecord::ideal_blocks_final, RequestRecord>("ideal_blocks_final", "INTEGER", 1,
                                                             "ceil(live / block_size) at finish"),
    Field<&RequestRecord::task, RequestRecord>("task", "TEXT", 2, "task name, e.g. passkey"),
    Field<&RequestRecord::context_tokens, RequestRecord>("context_tokens", "INTEGER", 2,
                                                         "target context"),
    Field<&RequestRecord::depth, RequestRecord>("depth", "REAL", 2, "needle depth in [0, 1]"),
    Field<&RequestRecord::expected, RequestRecord>("expected", "TEXT", 2,
                                                   "JSON array of expected answers"),
    Field<&RequestRecord::score, RequestRecord>("score", "REAL", 2, "task score in [0, 1]"),
    Field<&RequestRecord::needle_depth, RequestRecord>("needle_depth", "REAL", 2,
                                                       "needle depth reached"),
    Field<&RequestRecord::nll_mean, RequestRecord>("nll_mean", "REAL", 2,
                                                   "mean NLL of forced tokens"),
    Field<&RequestRecord::live_per_group, RequestRecord>(
        "live_per_group", "TEXT", 3, "live tokens per KV group at finish, JSON per layer"),
    Field<&RequestRecord::score_partial, RequestRecord>("score_partial", "REAL", 4,
                                                        "share of the answer's characters found"),
    Field<&RequestRecord::rouge_l_vs_native, RequestRecord>("rouge_l_vs_native", "REAL", 5,
                                                            "ROUGE-L F1 vs the native output"),
    Field<&RequestRecord::rouge_l_vs_naive, RequestRecord>("rouge_l_vs_naive", "REAL", 5,
                                                           "ROUGE-L F1 vs the naive output"),
    Field<&RequestRecord::rouge_l_vs_reference, RequestRecord>("rouge_l_vs_reference", "REAL", 5,
                                                               "ROUGE-L F1 vs the reference"),
};
static_assert(VersionsAscend<RequestRecord>(kRequestColumns));
inline constexpr Table<RequestRecord> kRequestTable{
    "requests", kRequestColumns, "PRIMARY KEY (run_id, request_id)) WITHOUT ROWID"};

// Summary figures that are the mean over a run's requests of one requests column: `report` and
// experiments/plot.py take their 95% interval over the requests (those of all of a point's
// seeds, pooled), not over the seeds' means. experiments/sweep_points.py's PER_REQUEST repeats
// this table (result_schema_test checks that the two agree).
struct PerRequestFigure {
  std::string_view summary;  // the summary name
  std::string_view column;   // the requests column it is the mean of
};
inline constexpr PerRequestFigure kPerRequestFigures[] = {
    {"task_accuracy", "score"},
    {"rouge_l_vs_native", "rouge_l_vs_native"},
    {"rouge_l_vs_naive", "rouge_l_vs_naive"},
    {"rouge_l_vs_reference", "rouge_l_vs_reference"},
};

// The value of requests column `column` in `r`, or nullopt when it is NULL, not numeric, or no
// column has that name.
std::optional<double> RequestColumnValue(const RequestRecord& r, std::string_view column);

// kPerRequestFigures' values: summary name -> the values of the requests.
using PerRequestValues = std::map<std::string, std::vector<double>>;
// Whether `summary` (a run's figures) has one of kPerRequestFigures (then its requests are worth
// reading).
bool HasPerRequestFigure(const std::map<std::string, double>& summary);
// For each of kPerRequestFigures that `summary` has (not NaN), the values its column holds in
// `requests`; a figure with no value (ROUGE-L in a file older than schema 5) is left out.
PerRequestValues CollectPerRequest(const std::vector<RequestRecord>& requests,
                                   const std::map<std::string, double>& summary);
// Several runs' values pooled (the seeds of one point): only the figures every run has.
PerRequestValues PoolPerRequest(const std::vector<const PerRequestValues*>& runs);

inline constexpr Column<OutputRecord> kOutputColumns[] = {
    Field<&OutputRecord::request_id>("request_id", "INTEGER NOT NULL", 1, "request id"),
    Field<&OutputRecord::text>("text", "TEXT NOT NULL", 1, "generated text"),
    {"token_ids", "TEXT NOT NULL", 1, "generated ids, a JSON array",
     &schema_internal::TokenIdsToValue, &schema_internal::TokenIdsFromValue},
    Field<&OutputRecord::token_logprobs>("token_logprobs", "TEXT", 2,
                                         "log p of each forced token, a JSON array"),
};
static_assert(VersionsAscend<OutputRecord>(kOutputColumns));
inline constexpr Table<OutputRecord> kOutputTable{
    "outputs", kOutputColumns, "PRIMARY KEY (run_id, request_id)) WITHOUT ROWID"};

// "a, b, c": the names of `columns` that a file of schema `version` has, prefixed by `prefix`.
template <typename Record>
std::string ColumnList(std::span<const Column<Record>> columns, int version,
                       std::string_view prefix = "") {
  std::string out;
  for (const Column<Record>& c : columns) {
    if (c.since > version) continue;
    if (!out.empty()) out += ", ";
    out += std::string(prefix) + std::string(c.name);
  }
  return out;
}

// The run's name/value tables (columns run_id, name, value): summary (REAL), summary_text (TEXT).
inline constexpr std::string_view kSummaryTables[] = {"summary", "summary_text"};

// The statements that create an empty database of schema kResultSchemaVersion.
std::vector<std::string> CreateSchemaSql();
// The statements that upgrade a database of schema `version` (1 <= version <
// kResultSchemaVersion) to kResultSchemaVersion, user_version excepted.
std::vector<std::string> MigrateSchemaSql(int version);

}  // namespace vtoken::engine
