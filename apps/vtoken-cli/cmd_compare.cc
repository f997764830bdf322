// `vtoken-cli compare`: side-by-side summary of runs from the result store, with ratios against
// the first run. Also the table `run` prints when it finishes.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/vtoken-cli/command.h"
#include "apps/vtoken-cli/run_experiment.h"
#include "lib/engine/result_store.h"

namespace vtoken::cli {
namespace {

// How a row's value follows from the summary.
enum class Derive {
  kValue,         // summary[key]
  kOneMinus,      // 1 - summary[key]
  kBelowHalf,     // util_hist_0 + util_hist_1: blocks under 50% utilization
  kMillionths,    // summary[key] / 1e6
};

struct Row {
  const char* label;
  const char* key;
  const char* format;
  bool ratio;  // Show the ratio against the first run.
  Derive derive = Derive::kValue;
};

// The figures DESIGN.md §8 names, in reading order.
constexpr Row kRows[] = {
    {"requests", "requests", "%.0f", false},
    {"blocks held / request (mean)", "blocks_mean", "%.1f", true},
    {"blocks held / request (final)", "blocks_final_mean", "%.1f", true},
    {"ideal packed blocks (final)", "ideal_final_mean", "%.1f", false},
    {"live tokens / request (final)", "live_final_mean", "%.0f", false},
    {"waste ratio F (mean)", "waste_ratio_mean", "%.3f", true},
    {"memory utilization 1-F", "waste_ratio_mean", "%.3f", true, Derive::kOneMinus},
    {"blocks < 50% utilized", "", "%.3f", false, Derive::kBelowHalf},
    {"peak allocated blocks", "peak_allocated_blocks", "%.0f", true},
    {"peak concurrency", "peak_running", "%.0f", true},
    {"preemptions", "preemptions", "%.0f", false},
    {"throughput (tok/s)", "throughput_tok_s", "%.1f", true},
    {"TTFT p95 (s)", "ttft_p95", "%.3f", true},
    {"TPOT p95 (s)", "tpot_p95", "%.4f", true},
    {"E2E p95 (s)", "e2e_p95", "%.2f", true},
    {"ROUGE-L vs native", "rouge_l_vs_native", "%.4f", false},
    {"ROUGE-L vtoken vs naive", "rouge_l_vs_naive", "%.4f", false},
    {"ROUGE-L vs reference", "rouge_l_vs_reference", "%.4f", false},
    {"tokens evicted", "evictions", "%.0f", false},
    {"prefix forks", "forks", "%.0f", false},
    {"relocation plans", "plans", "%.0f", false},
    {"tokens moved", "moves", "%.0f", false},
    {"MB copied", "bytes_moved", "%.2f", false, Derive::kMillionths},
    {"planner time (s)", "planner_s", "%.4f", false},
    {"fence waits", "fence_waits", "%.0f", false},
};

double Value(const engine::RunSummary& s, const Row& row) {
  auto get = [&](const std::string& k) {
    auto it = s.values.find(k);
    return it == s.values.end() ? NAN : it->second;
  };
  switch (row.derive) {
    case Derive::kValue: return get(row.key);
    case Derive::kOneMinus: return 1.0 - get(row.key);
    case Derive::kBelowHalf: return get("util_hist_0") + get("util_hist_1");
    case Derive::kMillionths: return get(row.key) / 1e6;
  }
  return NAN;
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

int RunCompare(const std::string& db, std::vector<int64_t> ids, int64_t last) {
  if (ids.empty() == (last == 0)) {
    std::fprintf(stderr, "vtoken-cli: error: give run ids or --last N (not both)\n");
    return 2;
  }
  if (last > 0) {
    StatusOr<engine::ResultStore> store = engine::ResultStore::Open(db);
    if (!store.ok()) {
      std::fprintf(stderr, "vtoken-cli: error: %s\n", store.status().message().c_str());
      return 1;
    }
    StatusOr<std::vector<engine::RunRecord>> runs =
        store->ListRuns({.ids = {}, .sweep = "", .status = "completed", .last = last});
    if (!runs.ok()) {
      std::fprintf(stderr, "vtoken-cli: error: %s\n", runs.status().message().c_str());
      return 1;
    }
    for (const engine::RunRecord& r : *runs) ids.push_back(r.id);
    std::sort(ids.begin(), ids.end());
  }
  Status s = PrintComparison(db, ids);
  if (!s.ok()) {
    std::fprintf(stderr, "vtoken-cli: error: %s\n", s.message().c_str());
    return 1;
  }
  return 0;
}

CLI::App* SetupCompare(CLI::App& app) {
  struct Args {
    std::string db = "results/vtoken.db";
    std::vector<int64_t> ids;
    int64_t last = 0;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("compare", "Side-by-side summary of runs, ratios vs the first");
  cmd->add_option("--db", a->db, "Result database")->capture_default_str();
  cmd->add_option("ids", a->ids, "Run ids");
  cmd->add_option("--last", a->last, "The last N completed runs")->check(CLI::PositiveNumber);
  cmd->callback([a] { SetExitCode(RunCompare(a->db, a->ids, a->last)); });
  return cmd;
}

}  // namespace

Status PrintComparison(const std::string& db_path, const std::vector<int64_t>& run_ids) {
  if (!std::filesystem::exists(db_path)) return NotFoundError("database " + db_path + " not found");
  VTOKEN_ASSIGN_OR_RETURN(engine::ResultStore store, engine::ResultStore::Open(db_path));
  std::vector<engine::RunRecord> runs;
  std::vector<engine::RunSummary> summaries;
  for (int64_t id : run_ids) {
    VTOKEN_ASSIGN_OR_RETURN(engine::RunRecord r, store.GetRun(id));
    if (r.status != "completed") {
      return FailedPreconditionError("run " + std::to_string(id) + " is " + r.status +
                                     (r.error.empty() ? "" : ": " + r.error));
    }
    VTOKEN_ASSIGN_OR_RETURN(engine::RunSummary s, store.GetSummary(id));
    runs.push_back(r);
    summaries.push_back(s);
  }
  if (runs.empty()) return NotFoundError("no runs to compare");
  const int label_width = 32, col = 22;
  std::printf("%-*s", label_width, "run");
  for (const auto& r : runs) std::printf("%*lld", col, static_cast<long long>(r.id));
  std::printf("\n%-*s", label_width, "mode / policy");
  for (const auto& r : runs) {
    std::string m = r.mode + (r.policy.empty() ? "" : " / " + r.policy);
    std::printf("%*s", col, m.c_str());
  }
  std::printf("\n%-*s", label_width, "model");
  for (const auto& r : runs) {
    std::string m = r.model.size() > col - 2 ? "..." + r.model.substr(r.model.size() - col + 5)
                                             : r.model;
    std::printf("%*s", col, m.c_str());
  }
  std::printf("\n%-*s", label_width, "blocks x block size");
  for (const auto& r : runs) {
    std::printf("%*s", col, (std::to_string(r.num_blocks) + " x " + std::to_string(r.block_size)).c_str());
  }
  std::printf("\n");
  for (const Row& row : kRows) {
    std::printf("%-*s", label_width, row.label);
    const double base = Value(summaries[0], row);
    for (size_t i = 0; i < runs.size(); ++i) {
      std::printf("%*s", col, Cell(Value(summaries[i], row), row.format, base, row.ratio && i > 0).c_str());
    }
    std::printf("\n");
  }
  return Status::Ok();
}

VTOKEN_REGISTER_COMMAND("compare", SetupCompare);

}  // namespace vtoken::cli
