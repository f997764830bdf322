// Config hashes stay: the hash `run` and `sweep` record (ConfigHash of the resolved config of each
// mode) of every .toml under experiments/ and tests/, at every point of its sweep grid, and of a
// few variants that set the keys the resolved config records only when set, equals the hash in
// tests/fixtures/config_hashes.txt, which the loader before the config key table wrote. A run
// recorded by an older build is then found again by `sweep --resume` and shared by new points.
//
// Regenerate the fixture (only for a deliberate change of the resolved config):
//   VTOKEN_WRITE_CONFIG_HASHES=1 build/.../tests/config_hashes_test
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "apps/vtoken-cli/config/experiment_config.h"
#include "apps/vtoken-cli/config/sweep_grid.h"
#include "tests/cli/cli_test_util.h"

namespace vtoken::cli {
namespace {

namespace fs = std::filesystem;

// Overrides that make the resolved config record its conditional keys, each applied to the base
// config named first.
struct Variant {
  const char* base;
  const char* name;
  std::vector<std::string> sets;
};

const std::vector<Variant>& Variants() {
  static const std::vector<Variant> variants = {
      {"experiments/quickstart.toml", "device", {"model.device='cuda'", "model.dtype='bfloat16'"}},
      {"experiments/quickstart.toml", "threads", {"model.threads=4"}},
      {"experiments/quickstart.toml",
       "cuda_graphs",
       {"model.device='cuda:0'", "engine.cuda_graphs=true"}},
      {"experiments/quickstart.toml", "batched", {"engine.max_batched_tokens=512"}},
      {"experiments/quickstart.toml",
       "jsonl_reading",
       {"workload.kind='jsonl'", "workload.jsonl='data/long.jsonl'",
        "workload.jsonl_default_max_tokens=64", "workload.prompt_template='Q: {prompt}'",
        "workload.truncate='middle'", "workload.chat=true"}},
      {"experiments/quickstart.toml",
       "perplexity",
       {"workload.kind='perplexity'", "workload.context_tokens=512"}},
      {"experiments/quickstart.toml",
       "budget",
       {"policy.budget_tokens=200", "policy.keep_ratio=0", "policy.evict_interval=4"}},
      {"experiments/quickstart.toml",
       "params",
       {"policy.name='tova'", "reclaim.trigger='always'", "reclaim.max_moves_per_step=64"}},
      {"experiments/quickstart.toml",
       "layer_pyramid",
       {"cache.granularity='layer'", "policy.budget_allocation='pyramid'",
        "policy.pyramid_beta=4.0"}},
      {"experiments/quickstart.toml",
       "head_adaptive",
       {"cache.granularity='head'", "policy.budget_allocation='adaptive'",
        "policy.adaptive_floor=0.2"}},
      {"experiments/quickstart.toml",
       "sampling",
       {"sampling.temperature=0.7", "sampling.top_p=0.9", "sampling.seed=3"}},
      {"experiments/granularity_sim.toml",
       "sim_measured",
       {"sim.policy_time='measured'", "sim.schedule_time='measured'",
        "sim.planner_time='measured'"}},
      {"experiments/granularity_sim.toml",
       "sim_token",
       {"cache.granularity='token'", "sim.parametric.noise_sigma=0.5"}},
  };
  return variants;
}

// One fixture line per mode: "FILE POINT MODE HASH", or "FILE POINT error" when the config does
// not load (so that a config that starts or stops loading shows too).
void AppendHashes(const std::string& file, const std::string& point,
                  const std::vector<std::string>& sets, std::vector<std::string>& lines) {
  StatusOr<ExperimentConfig> c = LoadExperimentConfig(SourceDir() + "/" + file, sets);
  if (!c.ok()) {
    lines.push_back(file + " " + point + " error");
    return;
  }
  for (size_t m = 0; m < c->modes.size(); ++m) {
    lines.push_back(file + " " + point + " " + std::string(ModeName(c->modes[m])) + " " +
                    ConfigHash(c->resolved_toml[m]));
  }
}

std::vector<std::string> CurrentHashes() {
  std::vector<std::string> files;
  for (const char* dir : {"experiments", "tests"}) {
    for (const fs::directory_entry& e :
         fs::recursive_directory_iterator(fs::path(SourceDir()) / dir)) {
      if (e.is_regular_file() && e.path().extension() == ".toml") {
        files.push_back(fs::relative(e.path(), SourceDir()).string());
      }
    }
  }
  std::sort(files.begin(), files.end());
  std::vector<std::string> lines;
  for (const std::string& file : files) {
    StatusOr<ExperimentConfig> base = LoadExperimentConfig(SourceDir() + "/" + file, {});
    if (!base.ok()) {
      lines.push_back(file + " - error");
      continue;
    }
    for (const SweepPoint& p :
         ExpandSweep(base->sweep_grid, base->sweep_exclude, base->sweep_add)) {
      AppendHashes(file, "point" + std::to_string(p.index), p.overrides, lines);
    }
  }
  for (const Variant& v : Variants()) AppendHashes(v.base, v.name, v.sets, lines);
  return lines;
}

TEST(ConfigHashes, EqualTheRecordedOnes) {
  const std::vector<std::string> current = CurrentHashes();
  const std::string fixture = SourceDir() + "/tests/fixtures/config_hashes.txt";
  if (std::getenv("VTOKEN_WRITE_CONFIG_HASHES") != nullptr) {
    std::ofstream out(fixture);
    for (const std::string& line : current) out << line << "\n";
    GTEST_SKIP() << "wrote " << fixture;
  }
  std::ifstream in(fixture);
  ASSERT_TRUE(in) << fixture;
  std::vector<std::string> recorded;
  for (std::string line; std::getline(in, line);) recorded.push_back(line);
  // At least the quickstart's three modes and one sweep's points, so an empty run cannot pass.
  ASSERT_GT(recorded.size(), 100u);
  for (size_t i = 0; i < std::max(recorded.size(), current.size()); ++i) {
    EXPECT_EQ(i < recorded.size() ? recorded[i] : "(none)",
              i < current.size() ? current[i] : "(none)")
        << "line " << i + 1;
  }
}

}  // namespace
}  // namespace vtoken::cli
