// `vtoken-cli compare`: side-by-side summary of runs from the result store, with ratios against
// the first run, and a row for every config key whose value differs between them (runs of one
// `run` differ only in the mode, which has its own row). Also the table `run` prints when it
// finishes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/vtoken-cli/commands/cli_checks.h"
#include "apps/vtoken-cli/commands/command.h"
#include "apps/vtoken-cli/config/run_config.h"
#include "apps/vtoken-cli/run/run_experiment.h"
#include "lib/engine/result_store.h"
#include "lib/engine/run_summary.h"

namespace vtoken::cli {
namespace {

// How a row's value follows from the summary.
enum class Derive {
  kValue,       // summary[key]
  kOneMinus,    // 1 - summary[key]
  kBelowHalf,   // util_hist_0 + util_hist_1: blocks under 50% utilization
  kMillionths,  // summary[key] / 1e6
  // summary[key] / kv_groups: block and entry counts of per-layer / per-head runs on the scale
  // of token granularity (the same KV bytes; docs/METRICS.md).
  kPerToken,
};

struct Row {
  const char* label;
  const char* key;
  const char* format;
  bool ratio;  // Show the ratio against the first run.
  Derive derive = Derive::kValue;
  bool only_if_measured = false;  // Left out when no run has the figure (e.g. task accuracy).
};

// The figures of docs/METRICS.md, in reading order.
constexpr Row kRows[] = {
    {"requests", "requests", "%.0f", false},
    {"blocks held / request (mean)", "blocks_mean", "%.1f", true, Derive::kPerToken},
    {"blocks held / request (final)", "blocks_final_mean", "%.1f", true, Derive::kPerToken},
    {"ideal packed blocks (final)", "ideal_final_mean", "%.1f", false, Derive::kPerToken},
    {"live tokens / request (final)", "live_final_mean", "%.0f", false, Derive::kPerToken},
    {"waste ratio F (mean)", "waste_ratio_mean", "%.3f", true},
    {"memory utilization 1-F", "waste_ratio_mean", "%.3f", true, Derive::kOneMinus},
    {"blocks < 50% utilized", "", "%.3f", false, Derive::kBelowHalf},
    {"peak allocated blocks (with copy sources)", "peak_allocated_blocks", "%.0f", true,
     Derive::kPerToken},
    {"peak concurrency", "peak_running", "%.0f", true},
    {"preemptions", "preemptions", "%.0f", false},
    {"throughput (tok/s)", "throughput_tok_s", "%.1f", true},
    {"TTFT p95 (s)", "ttft_p95", "%.3f", true},
    {"TPOT p95 (s)", "tpot_p95", "%.4f", true},
    {"E2E p95 (s)", "e2e_p95", "%.2f", true},
    {"task accuracy", "task_accuracy", "%.3f", false, Derive::kValue, true},
    {"task accuracy 95% CI (+-)", "task_accuracy_ci95", "%.3f", false, Derive::kValue, true},
    {"perplexity", "perplexity", "%.3f", true, Derive::kValue, true},
    {"NLL / token (nats)", "nll_mean", "%.4f", false, Derive::kValue, true},
    {"ROUGE-L vs native", "rouge_l_vs_native", "%.4f", false},
    {"ROUGE-L vs native 95% CI (+-)", "rouge_l_vs_native_ci95", "%.4f", false, Derive::kValue,
     true},
    {"ROUGE-L vtoken vs naive", "rouge_l_vs_naive", "%.4f", false},
    {"ROUGE-L vs reference", "rouge_l_vs_reference", "%.4f", false},
    {"tokens evicted", "evictions", "%.0f", false},
    {"prefix forks", "forks", "%.0f", false},
    {"relocation plans", "plans", "%.0f", false},
    {"tokens moved", "moves", "%.0f", false},
    {"MB copied", "bytes_moved", "%.2f", false, Derive::kMillionths},
    {"planner time (s)", "planner_s", "%.4f", false},
    {"fence waits", "fence_waits", "%.0f", false},
    {"prefill restored (tokens)", "prefill_restored_tokens", "%.0f", false, Derive::kValue, true},
};

// Whether the run's prompt prefills were (partly) restored from an earlier run.
bool RestoredPrefill(const engine::RunSummary& s) {
  auto it = s.values.find("prefill_restored_tokens");
  return it != s.values.end() && it->second > 0;
}

double Value(const engine::RunSummary& s, const Row& row) {
  auto get = [&](const std::string& k) {
    auto it = s.values.find(k);
    return it == s.values.end() ? NAN : it->second;
  };
  switch (row.derive) {
    case Derive::kValue:
      return get(row.key);
    case Derive::kOneMinus:
      return 1.0 - get(row.key);
    case Derive::kBelowHalf:
      return get("util_hist_0") + get("util_hist_1");
    case Derive::kMillionths:
      return get(row.key) / 1e6;
    case Derive::kPerToken: {
      const double groups = get("kv_groups");
      return get(row.key) / (std::isnan(groups) || groups < 1 ? 1.0 : groups);
    }
  }
  return NAN;
}

// Column widths: every column is right-aligned and at least kColumnGap wider than its widest
// cell, so neighbouring cells never run together; a cell longer than kMaxColumnWidth allows keeps
// its tail (a model path's directory name, a policy name) behind "...".
constexpr size_t kMinLabelWidth = 32, kMinColumnWidth = 22, kMaxColumnWidth = 42, kColumnGap = 2;

std::string Fit(const std::string& text, size_t width) {
  if (text.size() <= width) return text;
  return "..." + text.substr(text.size() - (width - 3));
}

std::string Cell(double v, const char* format, double base, bool ratio) {
  if (std::isnan(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  std::string out = buf;
  if (ratio && !std::isnan(base) && base != 0) {
    std::snprintf(buf, sizeof(buf), " (%.2fx)", v / base);
    out += buf;
  }
  return out;
}

// The runs: `ids` as given, or the completed runs of `sweep` (every one, or its last `last`), or
// the last `last` completed runs of the database.
int RunCompare(const std::string& db, std::vector<int64_t> ids, int64_t last,
               const std::string& sweep) {
  if (ids.empty() == (last == 0 && sweep.empty())) {
    std::fprintf(stderr, "vtoken-cli: error: give run ids, or --last N and/or --sweep NAME\n");
    return 2;
  }
  if (ids.empty()) {
    StatusOr<engine::ResultStore> store = engine::ResultStore::OpenReadOnly(db);
    if (!store.ok()) {
      PrintError(store.status());
      return 1;
    }
    StatusOr<std::vector<engine::RunRecord>> runs =
        store->ListRuns({.ids = {}, .sweep = sweep, .status = "completed", .last = last});
    if (!runs.ok()) {
      PrintError(runs.status());
      return 1;
    }
    if (runs->empty() && !sweep.empty()) {
      std::fprintf(stderr, "vtoken-cli: error: sweep '%s' has no completed run in %s\n",
                   sweep.c_str(), db.c_str());
      return 1;
    }
    for (const engine::RunRecord& r : *runs) ids.push_back(r.id);
    std::sort(ids.begin(), ids.end());
  }
  Status s = PrintComparison(db, ids);
  if (!s.ok()) {
    PrintError(s);
    return 1;
  }
  return 0;
}

CLI::App* SetupCompare(CLI::App& app) {
  struct Args {
    std::string db = "results/vtoken.db";
    std::vector<int64_t> ids;
    int64_t last = 0;
    std::string sweep;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd =
      app.add_subcommand("compare", "Side-by-side summary of runs, ratios vs the first");
  cmd->add_option("--db", a->db, "Result database")->capture_default_str();
  cmd->add_option("ids", a->ids, "Run ids");
  cmd->add_option("--last", a->last, "The last N completed runs (of --sweep, when given)")
      ->check(IntIn(1));
  cmd->add_option("--sweep", a->sweep, "The completed runs of this sweep (`vtoken-cli sweep`)");
  cmd->callback([a] { SetExitCode(RunCompare(a->db, a->ids, a->last, a->sweep)); });
  return cmd;
}

}  // namespace

Status PrintComparison(const std::string& db_path, const std::vector<int64_t>& run_ids) {
  VTOKEN_ASSIGN_OR_RETURN(engine::ResultStore store, engine::ResultStore::OpenReadOnly(db_path));
  std::vector<engine::RunRecord> runs;
  std::vector<engine::RunSummary> summaries;
  std::vector<FlatConfig> configs;
  for (int64_t id : run_ids) {
    VTOKEN_ASSIGN_OR_RETURN(engine::RunRecord r, store.GetRun(id));
    if (r.status != "completed") {
      return FailedPreconditionError("run " + std::to_string(id) + " is " + r.status +
                                     (r.error.empty() ? "" : ": " + r.error));
    }
    VTOKEN_ASSIGN_OR_RETURN(engine::RunSummary s, store.GetSummary(id));
    VTOKEN_ASSIGN_OR_RETURN(
        FlatConfig c,
        FlattenConfig(r.config_toml, "result db " + db_path + ": run " + std::to_string(id)));
    runs.push_back(std::move(r));
    summaries.push_back(std::move(s));
    configs.push_back(std::move(c));
  }
  if (runs.empty()) return NotFoundError("no runs to compare");

  // The table as text first, so the columns can be sized to their widest cell.
  std::vector<std::vector<std::string>> table;  // label, then one cell per run
  auto add_row = [&](std::string label, auto cell) {
    std::vector<std::string> row = {std::move(label)};
    for (size_t i = 0; i < runs.size(); ++i) row.push_back(cell(i));
    table.push_back(std::move(row));
  };
  add_row("run", [&](size_t i) { return std::to_string(runs[i].id); });
  add_row("mode / policy", [&](size_t i) {
    return runs[i].mode + (runs[i].policy.empty() ? "" : " / " + runs[i].policy);
  });
  add_row("model", [&](size_t i) { return runs[i].model; });
  add_row("blocks x block size", [&](size_t i) {
    return std::to_string(runs[i].num_blocks) + " x " + std::to_string(runs[i].block_size);
  });
  // Named in every table: what a block and a budget are (docs/METRICS.md).
  add_row("granularity / allocation", [&](size_t i) {
    return ConfigValue(configs[i], "cache.granularity", "token") + " / " +
           (runs[i].policy.empty()
                ? "-"
                : ConfigValue(configs[i], "policy.budget_allocation", "uniform"));
  });
  // The mode has its row above, granularity and allocation theirs; every other config key that
  // differs gets one.
  std::vector<const FlatConfig*> config_ptrs;
  for (const FlatConfig& c : configs) config_ptrs.push_back(&c);
  for (const std::string& key :
       VaryingKeys(config_ptrs, {"modes", "cache.granularity", "policy.budget_allocation"})) {
    add_row(key, [&](size_t i) { return ConfigValue(configs[i], key); });
  }
  for (const Row& row : kRows) {
    if (row.only_if_measured &&
        std::all_of(summaries.begin(), summaries.end(),
                    [&](const engine::RunSummary& s) { return std::isnan(Value(s, row)); })) {
      continue;
    }
    // A request time of a run that restored prompt prefills from an earlier run (summary
    // prefill_restored_tokens > 0, lib/engine/prefill_memo.h) is "n/a": the run did not time the
    // model (engine::DropRequestTimes).
    const bool timing = engine::IsRequestTime(row.key);
    const double base = RestoredPrefill(summaries[0]) && timing ? NAN : Value(summaries[0], row);
    add_row(row.label, [&](size_t i) {
      if (timing && RestoredPrefill(summaries[i])) return std::string("n/a");
      return Cell(Value(summaries[i], row), row.format, base, row.ratio && i > 0);
    });
  }

  size_t label_width = kMinLabelWidth, width = kMinColumnWidth;
  for (const auto& row : table) {
    label_width = std::max(label_width, row[0].size() + kColumnGap);
    for (size_t i = 1; i < row.size(); ++i) width = std::max(width, row[i].size() + kColumnGap);
  }
  width = std::min(width, kMaxColumnWidth);
  for (const auto& row : table) {
    std::printf("%-*s", static_cast<int>(label_width), row[0].c_str());
    for (size_t i = 1; i < row.size(); ++i) {
      std::printf("%*s", static_cast<int>(width), Fit(row[i], width - kColumnGap).c_str());
    }
    std::printf("\n");
  }
  if (std::any_of(summaries.begin(), summaries.end(), RestoredPrefill)) {
    std::printf(
        "\nn/a: the run restored its prompts' prefill from an earlier run of the same "
        "invocation (prefill memo), so its times are not the model's; time it with "
        "--no-prefill-memo.\n");
  }
  return Status::Ok();
}

VTOKEN_REGISTER_COMMAND("compare", SetupCompare);

}  // namespace vtoken::cli
