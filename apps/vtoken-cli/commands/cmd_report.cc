// `vtoken-cli report --sweep NAME`: the completed runs of one sweep as markdown tables (one row
// per run: mode, policy, the grid keys that vary across the sweep, the key summary figures),
// the SLA and capacity frontiers when the sweep varies engine.max_num_seqs, and the figures of
// experiments/plot.py written into --out. The grid keys are recovered by comparing the runs'
// resolved configs (runs.config_toml, run_config.h), so a report needs nothing but the database.
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "apps/vtoken-cli/commands/command.h"
#include "apps/vtoken-cli/commands/known_sweeps.h"
#include "apps/vtoken-cli/config/run_config.h"
#include "lib/engine/result_store.h"
#include "lib/engine/stats.h"

extern char** environ;

namespace vtoken::cli {
namespace {

// A column of figures from the summary table.
struct Figure {
  const char* header;
  const char* key;  // summary name (util_below_50 is added when the runs are read)
  const char* format;
  bool only_if_measured = false;  // Left out when no run has it (task accuracy, perplexity).
};

// Memory: what eviction and reclamation do to the pool (docs/METRICS.md).
constexpr Figure kMemory[] = {
    {"blocks/req (mean)", "blocks_mean", "%.1f"},
    {"blocks/req (final)", "blocks_final_mean", "%.1f"},
    {"ideal (final)", "ideal_final_mean", "%.1f"},
    {"waste F", "waste_ratio_mean", "%.3f"},
    {"blocks <50% used", "util_below_50", "%.3f"},
    {"peak blocks (with copy sources)", "peak_allocated_blocks", "%.0f"},
    {"peak conc.", "peak_running", "%.0f"},
    {"preempt.", "preemptions", "%.0f"},
    {"forks", "forks", "%.0f"},
};
// Speed, quality and the cost of reclamation.
constexpr Figure kSpeed[] = {
    {"tok/s", "throughput_tok_s", "%.1f"},
    {"TTFT p95 (s)", "ttft_p95", "%.3f"},
    {"TPOT p95 (s)", "tpot_p95", "%.4f"},
    {"E2E p95 (s)", "e2e_p95", "%.2f"},
    {"accuracy (95% CI over requests)", "task_accuracy", "%.3f", true},
    {"perplexity", "perplexity", "%.3f", true},
    {"ROUGE-L vs native", "rouge_l_vs_native", "%.4f"},
    {"ROUGE-L vs naive", "rouge_l_vs_naive", "%.4f"},
    {"ROUGE-L vs reference", "rouge_l_vs_reference", "%.4f"},
    {"moves", "moves", "%.0f"},
    {"planner (s)", "planner_s", "%.4f"},
    {"fence (s)", "fence_s", "%.4f"},
    {"wall (s)", "wall_s", "%.1f"},
};

// Config keys that are not grid axes: the mode and policy have columns of their own, and the
// experiment name is the same for every run of a sweep.
// The KV granularity and the budget allocation have columns of their own, named in every table.
const std::set<std::string> kNotAxes = {"modes", "name", "policy.name", "cache.granularity",
                                        "policy.budget_allocation"};

// Block counts a run records in group blocks (lib/engine/run_summary.h): divided by its KV
// groups, so every granularity is on the scale of token blocks, as `compare` counts them.
constexpr const char* kGroupBlockFigures[] = {"blocks_mean", "blocks_final_mean",
                                              "ideal_final_mean", "peak_allocated_blocks",
                                              "live_final_mean"};

// One run, or one point of a sweep with seeds: the mean of its runs' figures, `ci` the
// half-widths of their 95% confidence intervals (Student's t) and `run_ids` its runs.
struct ReportRun {
  engine::RunRecord record;
  engine::RunSummary summary;
  FlatConfig config;
  std::map<std::string, double> ci;
  std::vector<int64_t> run_ids;
  // The figures that are means over requests (engine::kPerRequestFigures: task accuracy,
  // ROUGE-L), by summary name: each request's value. A point's figure and its interval are taken
  // over the requests of all its runs (every seed draws other instances), not over the seeds'
  // means.
  engine::PerRequestValues per_request;
};

// The figures of `r` that are means over requests, with the 95% interval over its requests.
void OverRequests(ReportRun& r) {
  for (const auto& [name, values] : r.per_request) {
    if (values.empty()) continue;
    const engine::MeanCi m = engine::MeanCi95(values);
    r.summary.values[name] = m.mean;
    r.ci[name] = m.half_width;
  }
}

double Get(const ReportRun& r, const std::string& key) {
  auto it = r.summary.values.find(key);
  return it == r.summary.values.end() ? NAN : it->second;
}

// The runs that differ only in the seed keys (run_config.h) as one point per mode: figures
// averaged, with their confidence intervals. Points keep the order of their first run.
std::vector<ReportRun> AggregateSeeds(const std::vector<ReportRun>& runs) {
  const std::vector<std::vector<size_t>> groups = GroupSeedPoints(
      runs.size(), [&](size_t i) -> const FlatConfig& { return runs[i].config; },
      [&](size_t i) { return runs[i].record.mode; });
  std::vector<ReportRun> points;
  for (const std::vector<size_t>& group : groups) {
    ReportRun p = runs[group.front()];
    p.run_ids.clear();
    std::map<std::string, std::vector<double>> values;
    for (size_t i : group) {
      p.run_ids.push_back(runs[i].record.id);
      for (const auto& [name, v] : runs[i].summary.values) values[name].push_back(v);
    }
    for (const auto& [name, v] : values) {
      const engine::MeanCi m = engine::MeanCi95(v);
      p.summary.values[name] = m.count > 0 ? m.mean : NAN;
      p.ci[name] = m.half_width;
    }
    // Pooled only where every run of the point has its requests' values (older files store
    // no per-request ROUGE-L: their interval stays over the seeds).
    std::vector<const engine::PerRequestValues*> of_runs;
    for (size_t i : group) of_runs.push_back(&runs[i].per_request);
    p.per_request = engine::PoolPerRequest(of_runs);
    OverRequests(p);
    points.push_back(std::move(p));
  }
  return points;
}

std::string Format(double v, const char* format) {
  if (std::isnan(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

std::vector<std::string> GridKeys(const std::vector<ReportRun>& runs, bool seeds) {
  std::vector<const FlatConfig*> configs;
  std::vector<bool> native;
  for (const ReportRun& r : runs) {
    configs.push_back(&r.config);
    native.push_back(r.record.mode == "native");
  }
  std::set<std::string> ignore = kNotAxes;
  if (seeds) ignore.insert(kSeedKeys.begin(), kSeedKeys.end());
  return VaryingKeys(configs, native, ignore);
}

std::string ConfigValue(const ReportRun& r, const std::string& key,
                        const std::string& missing = "-") {
  return cli::ConfigValue(r.config, key, missing);
}

// A figure of a run, or of a point as "mean ± half-width" (the 95% confidence interval over its
// seeds; the accuracy's over its requests, also for a single run).
std::string Cell(const ReportRun& r, const Figure& f) {
  const std::string mean = Format(Get(r, f.key), f.format);
  auto ci = r.ci.find(f.key);
  if (mean == "-" || ci == r.ci.end() || std::isnan(ci->second)) return mean;
  return mean + " ± " + Format(ci->second, f.format);
}

// One row per run, or with `seeds` one per point with its run ids and seed count.
template <size_t N>
void PrintTable(const char* title, const std::vector<ReportRun>& runs,
                const std::vector<std::string>& axes, const Figure (&all)[N], bool seeds) {
  std::vector<Figure> figures;
  for (const Figure& f : all) {
    const bool measured = std::any_of(
        runs.begin(), runs.end(), [&](const ReportRun& r) { return !std::isnan(Get(r, f.key)); });
    if (!f.only_if_measured || measured) figures.push_back(f);
  }
  std::printf("\n### %s\n\n| %s | mode | policy | granularity | allocation |", title,
              seeds ? "runs | seeds" : "run");
  for (const std::string& k : axes) std::printf(" %s |", k.c_str());
  for (const Figure& f : figures) std::printf(" %s |", f.header);
  std::printf("\n|%s---|---|---|---|", seeds ? "---|---:|" : "---:|");
  for (size_t i = 0; i < axes.size(); ++i) std::printf("---:|");
  for (size_t i = 0; i < figures.size(); ++i) std::printf("---:|");
  std::printf("\n");
  for (const ReportRun& r : runs) {
    if (seeds) {
      std::string ids;
      for (int64_t id : r.run_ids) ids += (ids.empty() ? "" : " ") + std::to_string(id);
      std::printf("| %s | %zu |", ids.c_str(), r.run_ids.size());
    } else {
      std::printf("| %lld |", static_cast<long long>(r.record.id));
    }
    std::printf(" %s | %s | %s | %s |", r.record.mode.c_str(),
                r.record.policy.empty() ? "-" : r.record.policy.c_str(),
                ConfigValue(r, "cache.granularity", "token").c_str(),
                r.record.policy.empty()
                    ? "-"
                    : ConfigValue(r, "policy.budget_allocation", "uniform").c_str());
    for (const std::string& k : axes) std::printf(" %s |", ConfigValue(r, k).c_str());
    for (const Figure& f : figures) std::printf(" %s |", Cell(r, f).c_str());
    std::printf("\n");
  }
}

// The sweep's runs grouped into curves over engine.max_num_seqs: one per mode and setting of
// the other axes, points in ascending concurrency.
std::map<std::string, std::vector<std::pair<double, const ReportRun*>>> Curves(
    const std::vector<ReportRun>& runs, const std::vector<std::string>& axes) {
  std::map<std::string, std::vector<std::pair<double, const ReportRun*>>> curves;
  for (const ReportRun& r : runs) {
    std::string label = r.record.mode + (r.record.policy.empty() ? "" : " / " + r.record.policy);
    for (const std::string& k : axes) {
      if (k != "engine.max_num_seqs") label += ", " + k + "=" + ConfigValue(r, k);
    }
    curves[label].emplace_back(std::atof(ConfigValue(r, "engine.max_num_seqs").c_str()), &r);
  }
  for (auto& [label, points] : curves) {
    std::sort(points.begin(), points.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
  }
  return curves;
}

// docs/METRICS.md: SLA = 1.05 x naive's p95 E2E at C_ref = 8 (the nearest swept C when 8 is not
// swept); C_sel = the C with the highest throughput whose p95 meets it. Capacity = the largest
// concurrency reached (peak running requests) by a run without preemption.
void PrintFrontiers(const std::vector<ReportRun>& runs, const std::vector<std::string>& axes) {
  if (std::find(axes.begin(), axes.end(), "engine.max_num_seqs") == axes.end()) return;
  double c_ref = NAN, ref_sum = 0;
  int ref_n = 0;
  for (const ReportRun& r : runs) {
    if (r.record.mode != "naive") continue;
    const double c = std::atof(ConfigValue(r, "engine.max_num_seqs").c_str());
    const double d = std::fabs(c - 8), best = std::fabs(c_ref - 8);
    if (std::isnan(c_ref) || d < best || (d == best && c < c_ref)) c_ref = c;
  }
  for (const ReportRun& r : runs) {
    if (r.record.mode == "naive" &&
        std::atof(ConfigValue(r, "engine.max_num_seqs").c_str()) == c_ref) {
      ref_sum += Get(r, "e2e_p95");
      ++ref_n;
    }
  }
  const double sla = ref_n > 0 ? 1.05 * ref_sum / ref_n : NAN;
  std::printf("\n### Frontiers over engine.max_num_seqs\n\n");
  if (ref_n > 0) {
    std::printf("SLA = 1.05 x naive p95 E2E at C_ref = %g: %.3f s\n\n", c_ref, sla);
  } else {
    std::printf("No naive runs: no SLA.\n\n");
  }
  std::printf(
      "| curve | C_sel (SLA) | tok/s at C_sel | p95 E2E at C_sel (s) | capacity (peak "
      "concurrency, no preemption) |\n|---|---:|---:|---:|---:|\n");
  for (const auto& [label, points] : Curves(runs, axes)) {
    const ReportRun* sel = nullptr;
    double c_sel = NAN, capacity = NAN;
    for (const auto& [c, r] : points) {
      if (!std::isnan(sla) && Get(*r, "e2e_p95") <= sla &&
          (sel == nullptr || Get(*r, "throughput_tok_s") > Get(*sel, "throughput_tok_s"))) {
        sel = r;
        c_sel = c;
      }
      // The concurrency actually reached: admission may hold a run below its limit.
      if (Get(*r, "preemptions") == 0 &&
          (std::isnan(capacity) || Get(*r, "peak_running") > capacity)) {
        capacity = Get(*r, "peak_running");
      }
    }
    std::printf("| %s | %s | %s | %s | %s |\n", label.c_str(), Format(c_sel, "%g").c_str(),
                sel ? Format(Get(*sel, "throughput_tok_s"), "%.1f").c_str() : "-",
                sel ? Format(Get(*sel, "e2e_p95"), "%.2f").c_str() : "-",
                Format(capacity, "%g").c_str());
  }
}

// Runs `python plot.py --db DB --sweep NAME --out DIR` and returns its exit status.
Status RunPlot(const std::string& db, const std::string& sweep, const std::string& out) {
  const char* source = std::getenv("VTOKEN_SOURCE_DIR");
  const std::filesystem::path script =
      std::filesystem::path(source != nullptr && *source ? source : ".") / "experiments" /
      "plot.py";
  if (!std::filesystem::exists(script)) {
    return NotFoundError(script.string() +
                         " not found (run from the source tree or set VTOKEN_SOURCE_DIR)");
  }
  const char* python_env = std::getenv("VTOKEN_PYTHON");
  // Debian's interpreter is the one scripts/setup.sh installs python3-matplotlib for; a python3
  // earlier on PATH (pyenv, a venv) may lack it.
  const std::string python = python_env != nullptr && *python_env          ? python_env
                             : std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3"
                                                                           : "python3";
  std::vector<std::string> args = {python,    script.string(), "--db",  db,
                                   "--sweep", sweep,           "--out", out};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, python.c_str(), nullptr, nullptr, argv.data(), environ);
  if (err != 0) {
    return NotFoundError("cannot start " + python + " for " + script.string() + ": " +
                         std::strerror(err));
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return InternalError("waitpid failed for " + python);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return InternalError(script.string() + " failed (exit status " +
                         std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ")");
  }
  return Status::Ok();
}

Status Report(const std::string& db, const std::string& sweep, std::string out, bool figures) {
  // By default beside the database (results/vtoken.db: results/figures/NAME), never into the
  // working directory when the database is elsewhere.
  if (out.empty()) {
    out = (std::filesystem::path(db).parent_path() / "figures" / sweep).string();
  }
  // Before any table is printed: plot.py would fail on it with a traceback.
  if (figures && std::filesystem::exists(out) && !std::filesystem::is_directory(out)) {
    return InvalidArgumentError("--out " + out + " is a file, not a directory for the figures");
  }
  VTOKEN_ASSIGN_OR_RETURN(engine::ResultStore store, engine::ResultStore::OpenReadOnly(db));
  VTOKEN_ASSIGN_OR_RETURN(std::vector<engine::RunRecord> records,
                          store.ListRuns({.ids = {}, .sweep = sweep, .status = "", .last = 0}));
  std::vector<ReportRun> runs;
  int64_t not_completed = 0;
  for (engine::RunRecord& rec : records) {
    if (rec.status != "completed") {
      ++not_completed;
      continue;
    }
    ReportRun r;
    VTOKEN_ASSIGN_OR_RETURN(r.summary, store.GetSummary(rec.id));
    VTOKEN_ASSIGN_OR_RETURN(r.config,
                            FlattenConfig(rec.config_toml, db + ": run " + std::to_string(rec.id)));
    r.summary.values["util_below_50"] = Get(r, "util_hist_0") + Get(r, "util_hist_1");
    if (const double groups = Get(r, "kv_groups"); groups > 1) {
      for (const char* key : kGroupBlockFigures) {
        auto it = r.summary.values.find(key);
        if (it != r.summary.values.end()) it->second /= groups;
      }
    }
    if (engine::HasPerRequestFigure(r.summary.values)) {
      VTOKEN_ASSIGN_OR_RETURN(const std::vector<engine::RequestRecord> requests,
                              store.GetRequests(rec.id));
      r.per_request = engine::CollectPerRequest(requests, r.summary.values);
      OverRequests(r);
    }
    r.run_ids = {rec.id};
    r.record = std::move(rec);
    runs.push_back(std::move(r));
  }
  if (runs.empty()) {
    VTOKEN_ASSIGN_OR_RETURN(const std::string known, KnownSweepsText(store));
    return NotFoundError("no completed runs of sweep '" + sweep + "' in " + db + known);
  }
  // A sweep with `[sweep] seeds` is reported per point (the mean over its seeds and the 95%
  // confidence interval); the frontiers then use the means.
  const size_t num_runs = runs.size();
  std::vector<ReportRun> points = AggregateSeeds(runs);
  const bool seeds = points.size() < runs.size();
  if (seeds) runs = std::move(points);
  const std::vector<std::string> axes = GridKeys(runs, seeds);
  std::set<std::string> models, workloads;
  for (const ReportRun& r : runs) {
    models.insert(r.record.model);
    workloads.insert(r.record.workload);
  }
  auto join = [](const std::set<std::string>& s) {
    std::string out;
    for (const std::string& v : s) out += (out.empty() ? "" : ", ") + v;
    return out;
  };
  std::printf("## Sweep %s\n\n%zu completed runs", sweep.c_str(), num_runs);
  if (seeds) std::printf(" (%zu points over their seeds: mean ± 95%% CI)", runs.size());
  if (not_completed > 0) {
    std::printf(" (%lld more not completed: running, failed or interrupted)",
                static_cast<long long>(not_completed));
  }
  std::printf(" in %s; model %s; workload %s", db.c_str(), join(models).c_str(),
              join(workloads).c_str());
  std::printf("; grid keys: ");
  if (axes.empty()) std::printf("none");
  for (size_t i = 0; i < axes.size(); ++i) std::printf("%s%s", i ? ", " : "", axes[i].c_str());
  std::printf(".\n");
  PrintTable("Memory", runs, axes, kMemory, seeds);
  std::printf(
      "\nBlocks are token blocks (block_size tokens of every layer's K and V): at layer or "
      "head granularity a run's group blocks divided by its KV groups, as `compare` "
      "counts them. Peak blocks include the sources of relocation copies in flight.\n");
  PrintTable("Speed, quality, reclamation cost", runs, axes, kSpeed, seeds);
  std::printf(
      "\nAccuracy and ROUGE-L: the mean over the requests ± the 95%% interval over them (Student's "
      "t; a point's requests of all its seeds pooled, as each seed draws other requests)%s.\n",
      seeds ? "; the other figures: the mean over the seeds ± the 95% interval over the seeds' "
              "values (and ROUGE-L of result files older than schema 5, which store no "
              "per-request ROUGE-L)"
            : "");
  if (std::any_of(runs.begin(), runs.end(),
                  [](const ReportRun& r) { return Get(r, "prefill_restored_tokens") > 0; })) {
    std::printf(
        "\nRuns that restored their prompts' prefill from an earlier run (prefill memo) "
        "record no request times (-); rerun with --no-prefill-memo to time them.\n");
  }
  PrintFrontiers(runs, axes);
  std::printf("\n");
  if (!figures) return Status::Ok();
  std::printf("Figures (%s):\n", out.c_str());
  return RunPlot(db, sweep, out);
}

CLI::App* SetupReport(CLI::App& app) {
  struct Args {
    std::string db = "results/vtoken.db";
    std::string sweep;
    std::string out;
    bool no_figures = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "report", "Markdown tables and figures (experiments/plot.py) of one sweep's runs");
  cmd->add_option("--db", a->db, "Result database")->capture_default_str();
  cmd->add_option("--sweep", a->sweep, "Sweep name (runs tagged by `vtoken-cli sweep`)")
      ->required();
  cmd->add_option("--out", a->out,
                  "Directory for the figures (default: figures/NAME beside the database, e.g. "
                  "results/figures/NAME)");
  cmd->add_flag("--no-figures", a->no_figures, "Print the tables only; do not run plot.py");
  cmd->callback([a] { FinishWith(Report(a->db, a->sweep, a->out, !a->no_figures)); });
  return cmd;
}

}  // namespace

VTOKEN_REGISTER_COMMAND("report", SetupReport);

}  // namespace vtoken::cli
