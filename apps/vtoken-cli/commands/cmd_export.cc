// `vtoken-cli export`: one table of a result database as CSV or JSON lines, for pandas and other
// tools (docs/EXPORT.md). Tables:
//   runs      one row per run: its record, every config key that varies among the selected runs
//             (dotted names, from runs.config_toml) and every summary figure;
//   requests  one row per request per run: timings, blocks held, and ROUGE-L computed from the
//             stored outputs against the run's native / naive counterpart (see Counterpart);
//   steps     one row per engine step per run: the pool and fragmentation figures;
//   points    one row per sweep point and mode over its seeds: every summary figure's mean and
//             95% confidence interval (ExportPoints).
// The database is opened read-only; nothing is written but the output.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "apps/vtoken-cli/commands/command.h"
#include "apps/vtoken-cli/commands/known_sweeps.h"
#include "apps/vtoken-cli/commands/table_writer.h"
#include "apps/vtoken-cli/config/run_config.h"
#include "lib/engine/result_store.h"
#include "lib/engine/rouge.h"
#include "lib/engine/stats.h"

namespace vtoken::cli {
namespace {

// The value of a stored column as a cell.
Cell CellOf(const engine::sql::Value& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return *i;
  if (const auto* d = std::get_if<double>(&v)) return Number(*d);
  if (const auto* t = std::get_if<std::string>(&v)) return *t;
  return Cell();
}

// The columns of a child table (requests, steps) that the file has, as the table declares them.
template <typename Record>
std::vector<const engine::Column<Record>*> StoredColumns(const engine::ResultStore& store,
                                                         const engine::Table<Record>& table) {
  std::vector<const engine::Column<Record>*> out;
  for (const engine::Column<Record>& c : table.columns) {
    if (c.since <= store.schema_version()) out.push_back(&c);
  }
  return out;
}

// A child table's rows: run_id, its stored columns, then `extra` cells per row.
template <typename Record>
class ChildRows {
 public:
  ChildRows(const engine::ResultStore& store, const engine::Table<Record>& table)
      : columns_(StoredColumns(store, table)) {}

  std::vector<std::string> Names(const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> out = {"run_id"};
    for (const auto* c : columns_) out.emplace_back(c->name);
    out.insert(out.end(), extra.begin(), extra.end());
    return out;
  }
  bool Has(std::string_view name) const {
    return std::any_of(columns_.begin(), columns_.end(),
                       [&](const auto* c) { return c->name == name; });
  }
  std::vector<Cell> Row(int64_t run_id, const Record& r) const {
    std::vector<Cell> row = {run_id};
    for (const auto* c : columns_) row.push_back(CellOf(c->get(r)));
    return row;
  }

 private:
  std::vector<const engine::Column<Record>*> columns_;
};

// The record columns of export's runs table (a view of the runs record, renamed and ordered for
// reading), before the config keys and the summary figures.
struct RunColumn {
  const char* name;
  Cell (*get)(const engine::RunRecord&);
};

const RunColumn kRunColumns[] = {
    {"run_id", [](const engine::RunRecord& r) -> Cell { return r.id; }},
    {"status", [](const engine::RunRecord& r) -> Cell { return r.status; }},
    {"mode", [](const engine::RunRecord& r) -> Cell { return r.mode; }},
    {"policy", [](const engine::RunRecord& r) -> Cell { return r.policy; }},
    {"model", [](const engine::RunRecord& r) -> Cell { return r.model; }},
    {"workload", [](const engine::RunRecord& r) -> Cell { return r.workload; }},
    {"sweep", [](const engine::RunRecord& r) -> Cell { return r.sweep; }},
    {"created", [](const engine::RunRecord& r) -> Cell { return r.created; }},
    {"finished", [](const engine::RunRecord& r) -> Cell { return r.finished; }},
    {"git_sha", [](const engine::RunRecord& r) -> Cell { return r.git_sha; }},
    {"error", [](const engine::RunRecord& r) -> Cell { return r.error; }},
};

// Config keys the record columns already carry (mode, policy): one column per fact.
const std::set<std::string> kRecordKeys = {"modes", "policy.name"};

struct ExportArgs {
  std::string db = "results/vtoken.db";
  std::string sweep;
  std::vector<int64_t> runs;
  std::string table;
  std::string format = "csv";
  std::string out;
};

// The selected runs, in id order: --runs (every id must exist), --sweep (must have runs), or all.
StatusOr<std::vector<engine::RunRecord>> SelectRuns(const engine::ResultStore& store,
                                                    const ExportArgs& a) {
  if (!a.runs.empty()) {
    VTOKEN_ASSIGN_OR_RETURN(std::vector<engine::RunRecord> runs,
                            store.ListRuns({.ids = a.runs, .sweep = "", .status = ""}));
    std::set<int64_t> found;
    for (const engine::RunRecord& r : runs) found.insert(r.id);
    std::string missing;
    for (int64_t id : std::set<int64_t>(a.runs.begin(), a.runs.end())) {
      if (!found.count(id)) missing += (missing.empty() ? "" : ", ") + std::to_string(id);
    }
    if (!missing.empty()) {
      return NotFoundError("result db " + store.path() + ": no run " + missing);
    }
    return runs;
  }
  VTOKEN_ASSIGN_OR_RETURN(std::vector<engine::RunRecord> runs,
                          store.ListRuns({.ids = {}, .sweep = a.sweep, .status = ""}));
  if (a.sweep.empty() || !runs.empty()) return runs;
  VTOKEN_ASSIGN_OR_RETURN(const std::string known, KnownSweepsText(store));
  return NotFoundError("result db " + store.path() + " has no runs of sweep '" + a.sweep + "'" +
                       known);
}

Status ExportRuns(const engine::ResultStore& store, const std::vector<engine::RunRecord>& runs,
                  std::FILE* out, bool csv) {
  std::vector<FlatConfig> configs;
  std::vector<engine::RunSummary> summaries;
  std::set<std::string> figures;
  for (const engine::RunRecord& r : runs) {
    VTOKEN_ASSIGN_OR_RETURN(
        FlatConfig c, FlattenConfig(r.config_toml,
                                    "result db " + store.path() + ": run " + std::to_string(r.id)));
    configs.push_back(std::move(c));
    VTOKEN_ASSIGN_OR_RETURN(engine::RunSummary s, store.GetSummary(r.id));
    for (const auto& [name, value] : s.values) figures.insert(name);
    summaries.push_back(std::move(s));
  }
  std::vector<const FlatConfig*> config_ptrs;
  std::vector<bool> native;
  for (size_t i = 0; i < configs.size(); ++i) {
    config_ptrs.push_back(&configs[i]);
    native.push_back(runs[i].mode == "native");
  }
  // The mode has its own column.
  const std::vector<std::string> keys = VaryingKeys(config_ptrs, native, kRecordKeys);
  std::vector<std::string> columns;
  for (const RunColumn& c : kRunColumns) columns.push_back(c.name);
  columns.insert(columns.end(), keys.begin(), keys.end());
  columns.insert(columns.end(), figures.begin(), figures.end());
  TableWriter writer(out, csv, columns);
  for (size_t i = 0; i < runs.size(); ++i) {
    std::vector<Cell> row;
    for (const auto& c : kRunColumns) row.push_back(c.get(runs[i]));
    for (const std::string& k : keys) {
      auto it = configs[i].find(k);
      row.push_back(it == configs[i].end() ? Cell() : ConfigCell(it->second));
    }
    for (const std::string& f : figures) {
      auto it = summaries[i].values.find(f);
      row.push_back(it == summaries[i].values.end() ? Cell() : Number(it->second));
    }
    writer.Write(row);
  }
  return Status::Ok();
}

// The points table: the completed runs whose resolved configs differ only in `seed` and
// `workload.seed` (the repetitions of `[sweep] seeds`) form one point per mode; per summary figure
// the point's mean over its runs, FIGURE_ci95 (the half-width of the 95% confidence interval,
// Student's t; empty with one run) and the run count `seeds`.
Status ExportPoints(const engine::ResultStore& store, const std::vector<engine::RunRecord>& runs,
                    std::FILE* out, bool csv) {
  struct Point {
    std::string mode, policy, sweep;
    FlatConfig config;  // Without modes and the seeds.
    std::vector<std::string> seeds;
    std::vector<int64_t> ids;
    std::map<std::string, std::vector<double>> figures;
    // engine::kPerRequestFigures: the values of the requests of all its runs, where every run
    // has them (accuracy, and ROUGE-L since schema 5).
    engine::PerRequestValues per_request;
  };
  std::vector<const engine::RunRecord*> completed;
  std::vector<FlatConfig> configs;
  for (const engine::RunRecord& r : runs) {
    if (r.status != "completed") continue;
    VTOKEN_ASSIGN_OR_RETURN(
        FlatConfig c, FlattenConfig(r.config_toml,
                                    "result db " + store.path() + ": run " + std::to_string(r.id)));
    completed.push_back(&r);
    configs.push_back(std::move(c));
  }
  std::vector<Point> points;  // In order of their first run.
  std::set<std::string> figures;
  for (const std::vector<size_t>& group : GroupSeedPoints(
           completed.size(), [&](size_t i) -> const FlatConfig& { return configs[i]; },
           [&](size_t i) { return completed[i]->mode + '\0' + completed[i]->sweep; })) {
    const engine::RunRecord& first = *completed[group.front()];
    Point p{first.mode, first.policy, first.sweep, SeedPointConfig(configs[group.front()]),
            {},         {},           {}};
    std::vector<engine::PerRequestValues> of_runs;
    for (size_t i : group) {
      p.seeds.push_back(ConfigValue(configs[i], "seed", ""));
      p.ids.push_back(completed[i]->id);
      VTOKEN_ASSIGN_OR_RETURN(engine::RunSummary summary, store.GetSummary(completed[i]->id));
      for (const auto& [name, value] : summary.values) {
        figures.insert(name);
        p.figures[name].push_back(value);
      }
      engine::PerRequestValues& values = of_runs.emplace_back();
      if (engine::HasPerRequestFigure(summary.values)) {
        VTOKEN_ASSIGN_OR_RETURN(const std::vector<engine::RequestRecord> requests,
                                store.GetRequests(completed[i]->id));
        values = engine::CollectPerRequest(requests, summary.values);
      }
    }
    std::vector<const engine::PerRequestValues*> pointers;
    for (const engine::PerRequestValues& v : of_runs) pointers.push_back(&v);
    p.per_request = engine::PoolPerRequest(pointers);
    points.push_back(std::move(p));
  }
  std::vector<const FlatConfig*> config_ptrs;
  std::vector<bool> native;
  for (const Point& p : points) {
    config_ptrs.push_back(&p.config);
    native.push_back(p.mode == "native");
  }
  const std::vector<std::string> keys = VaryingKeys(config_ptrs, native, kRecordKeys);
  std::vector<std::string> columns = {"mode", "policy", "sweep", "seeds", "seed_values", "run_ids"};
  columns.insert(columns.end(), keys.begin(), keys.end());
  for (const std::string& f : figures) {
    columns.push_back(f);
    columns.push_back(f + "_ci95");
  }
  TableWriter writer(out, csv, columns);
  for (const Point& p : points) {
    std::string seeds, ids;
    for (size_t i = 0; i < p.ids.size(); ++i) {
      seeds += (i ? " " : "") + p.seeds[i];
      ids += (i ? " " : "") + std::to_string(p.ids[i]);
    }
    std::vector<Cell> row = {p.mode, p.policy, p.sweep, static_cast<int64_t>(p.ids.size()),
                             seeds,  ids};
    for (const std::string& k : keys) {
      auto it = p.config.find(k);
      row.push_back(it == p.config.end() ? Cell() : ConfigCell(it->second));
    }
    for (const std::string& f : figures) {
      auto it = p.figures.find(f);
      auto by_request = p.per_request.find(f);
      // A mean over requests: over the requests of all the point's runs. Else over the runs; a
      // figure some runs of the point lack, over the runs that have it.
      const engine::MeanCi m = by_request != p.per_request.end()
                                   ? engine::MeanCi95(by_request->second)
                               : it == p.figures.end() ? engine::MeanCi95({})
                                                       : engine::MeanCi95(it->second);
      row.push_back(Number(m.mean));
      row.push_back(Number(m.half_width));
    }
    writer.Write(row);
  }
  return Status::Ok();
}

// Finds the runs whose outputs the requests table scores against: for a run, the completed run
// of `mode` in the same sweep whose resolved config equals the run's but for the mode (the run
// of the same `run` or sweep point, as `run` itself scores them), the nearest before it by id
// if there is one, else the nearest after it.
class Counterparts {
 public:
  static StatusOr<Counterparts> Load(const engine::ResultStore& store) {
    Counterparts c;
    VTOKEN_ASSIGN_OR_RETURN(std::vector<engine::RunRecord> all,
                            store.ListRuns({.ids = {}, .sweep = "", .status = "completed"}));
    for (engine::RunRecord& r : all) {
      VTOKEN_ASSIGN_OR_RETURN(FlatConfig config,
                              FlattenConfig(r.config_toml, "result db " + store.path() + ": run " +
                                                               std::to_string(r.id)));
      config.erase("modes");
      FlatConfig native = NativeView(config);
      c.runs_.push_back({r.id, r.mode, r.sweep, std::move(config), std::move(native)});
    }
    return c;
  }

  // The id of `run`'s counterpart of `mode` (`run` itself when it is of that mode), or nullopt.
  std::optional<int64_t> Find(const engine::RunRecord& run, const std::string& mode) const {
    const Entry* self = nullptr;
    for (const Entry& e : runs_) {
      if (e.id == run.id) self = &e;
    }
    if (self == nullptr) return std::nullopt;  // not completed
    if (run.mode == mode) return run.id;
    std::optional<int64_t> before, after;
    // A native run does not record [policy] and [reclaim] (older ones do): compare without.
    const bool native = mode == "native";
    for (const Entry& e : runs_) {  // ascending ids
      if (e.mode != mode || e.sweep != self->sweep) continue;
      if (native ? e.native_view != self->native_view : e.config != self->config) continue;
      if (e.id < run.id) before = e.id;
      if (e.id > run.id && !after) after = e.id;
    }
    return before ? before : after;
  }

 private:
  struct Entry {
    int64_t id;
    std::string mode;
    std::string sweep;
    FlatConfig config;       // without "modes"
    FlatConfig native_view;  // NativeView(config), what a native counterpart is matched on
  };
  std::vector<Entry> runs_;
};

using Texts = std::map<int64_t, std::string>;  // request id -> generated text

StatusOr<Texts> OutputTexts(const engine::ResultStore& store, int64_t run_id) {
  VTOKEN_ASSIGN_OR_RETURN(std::vector<engine::OutputRecord> outputs, store.GetOutputs(run_id));
  Texts texts;
  for (engine::OutputRecord& o : outputs) texts[o.request_id] = std::move(o.text);
  return texts;
}

Cell Rouge(const Texts& run, const std::optional<Texts>& reference, int64_t request_id) {
  if (!reference) return Cell();
  auto candidate = run.find(request_id);
  auto ref = reference->find(request_id);
  if (candidate == run.end() || ref == reference->end()) return Cell();
  return engine::RougeLF1(candidate->second, ref->second);
}

Status ExportRequests(const engine::ResultStore& store, const std::vector<engine::RunRecord>& runs,
                      std::FILE* out, bool csv) {
  const ChildRows<engine::RequestRecord> rows(store, engine::kRequestTable);
  // Files before schema 5 store no per-request ROUGE-L: computed here from the outputs of the
  // run's native and naive counterparts, as the run would have stored it.
  const bool stored_rouge = rows.Has("rouge_l_vs_native");
  std::optional<Counterparts> counterparts;
  if (!stored_rouge) {
    VTOKEN_ASSIGN_OR_RETURN(counterparts, Counterparts::Load(store));
  }
  TableWriter writer(
      out, csv,
      stored_rouge ? rows.Names() : rows.Names({"rouge_l_vs_native", "rouge_l_vs_naive"}));
  for (const engine::RunRecord& run : runs) {
    VTOKEN_ASSIGN_OR_RETURN(std::vector<engine::RequestRecord> requests, store.GetRequests(run.id));
    if (requests.empty()) continue;
    if (stored_rouge) {
      for (const engine::RequestRecord& q : requests) writer.Write(rows.Row(run.id, q));
      continue;
    }
    VTOKEN_ASSIGN_OR_RETURN(Texts texts, OutputTexts(store, run.id));
    // As in the run's summary: every mode against native, vtoken also against naive.
    std::optional<Texts> native, naive;
    if (std::optional<int64_t> id = counterparts->Find(run, "native")) {
      VTOKEN_ASSIGN_OR_RETURN(native, OutputTexts(store, *id));
    }
    if (run.mode == "vtoken") {
      if (std::optional<int64_t> id = counterparts->Find(run, "naive")) {
        VTOKEN_ASSIGN_OR_RETURN(naive, OutputTexts(store, *id));
      }
    }
    for (const engine::RequestRecord& q : requests) {
      std::vector<Cell> row = rows.Row(run.id, q);
      row.push_back(Rouge(texts, native, q.request_id));
      row.push_back(Rouge(texts, naive, q.request_id));
      writer.Write(row);
    }
  }
  return Status::Ok();
}

Status ExportSteps(const engine::ResultStore& store, const std::vector<engine::RunRecord>& runs,
                   std::FILE* out, bool csv) {
  const ChildRows<engine::StepRecord> rows(store, engine::kStepTable);
  TableWriter writer(out, csv, rows.Names());
  for (const engine::RunRecord& run : runs) {
    VTOKEN_ASSIGN_OR_RETURN(std::vector<engine::StepRecord> steps, store.GetSteps(run.id));
    for (const engine::StepRecord& s : steps) {
      writer.Write(rows.Row(run.id, s));
    }
  }
  return Status::Ok();
}

Status Export(const ExportArgs& a) {
  VTOKEN_ASSIGN_OR_RETURN(engine::ResultStore store, engine::ResultStore::OpenReadOnly(a.db));
  VTOKEN_ASSIGN_OR_RETURN(std::vector<engine::RunRecord> runs, SelectRuns(store, a));
  std::FILE* out = stdout;
  if (!a.out.empty()) {
    out = std::fopen(a.out.c_str(), "w");
    if (out == nullptr) {
      return NotFoundError("cannot write " + a.out + ": " + std::strerror(errno));
    }
  }
  const bool csv = a.format == "csv";
  Status s = a.table == "runs"       ? ExportRuns(store, runs, out, csv)
             : a.table == "points"   ? ExportPoints(store, runs, out, csv)
             : a.table == "requests" ? ExportRequests(store, runs, out, csv)
                                     : ExportSteps(store, runs, out, csv);
  if (std::fflush(out) != 0 && s.ok()) {
    s = InternalError("cannot write " + (a.out.empty() ? "stdout" : a.out) + ": " +
                      std::strerror(errno));
  }
  if (out != stdout) {
    std::fclose(out);
    if (!s.ok()) std::remove(a.out.c_str());  // no half-written file
  }
  return s;
}

CLI::App* SetupExport(CLI::App& app) {
  auto a = std::make_shared<ExportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "export", "Write one table of a result database as CSV or JSON lines (docs/EXPORT.md)");
  cmd->add_option("--db", a->db, "Result database (opened read-only)")->capture_default_str();
  CLI::Option* sweep = cmd->add_option("--sweep", a->sweep, "Only the runs of this sweep");
  cmd->add_option("--runs", a->runs, "Only these run ids (comma-separated)")
      ->delimiter(',')
      ->excludes(sweep);
  cmd->add_option("--table", a->table,
                  "runs | points (runs that differ only in seed, as mean and 95% CI) | requests | "
                  "steps")
      ->required()
      ->check(CLI::IsMember({"runs", "points", "requests", "steps"}));
  cmd->add_option("--format", a->format, "csv | jsonl")
      ->capture_default_str()
      ->check(CLI::IsMember({"csv", "jsonl"}));
  cmd->add_option("--out", a->out, "Output file (default: stdout)");
  cmd->callback([a] { FinishWith(Export(*a)); });
  return cmd;
}

}  // namespace

VTOKEN_REGISTER_COMMAND("export", SetupExport);

}  // namespace vtoken::cli
