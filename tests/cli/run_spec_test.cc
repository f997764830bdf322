// The run spec (apps/vtoken-cli/run/run_spec.h): what a run runs, built once from engine options
// that count blocks of every layer and head, or from a parsed experiment config, which it
// leaves as the user gave it.
#include "apps/vtoken-cli/run/run_spec.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "apps/vtoken-cli/config/experiment_config.h"
#include "apps/vtoken-cli/run/run_checks.h"
#include "tests/cli/cli_test_util.h"

namespace vtoken::cli {
namespace {

// A shape as a layer / head run sees it: 4 layers, 2 KV heads.
model::ModelConfig Shape() {
  model::ModelConfig m;
  m.num_hidden_layers = 4;
  m.num_key_value_heads = 2;
  return m;
}

engine::EngineOptions Pool(int32_t blocks) {
  engine::EngineOptions o;
  o.pool.num_blocks = blocks;
  o.pool.block_size = 16;
  o.pool.headroom_blocks = 3;
  o.reclaim.max_moves_per_step = 100;
  return o;
}

TEST(MakeRunSpecTest, HeadGranularitySplitsThePoolIntoBlocksOfOneKvGroup) {
  const model::ModelConfig m = Shape();
  const Mode modes[] = {Mode::kNaive, Mode::kVtoken};
  StatusOr<RunSpec> spec = MakeRunSpec(Pool(50), Granularity::kHead, &m, modes);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->kv_groups, 8);
  EXPECT_EQ(spec->num_slots, 50 * 8 * 16);
  ASSERT_EQ(spec->runs.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const engine::EngineOptions& o = spec->runs[i];
    EXPECT_EQ(o.mode, modes[i]);
    EXPECT_EQ(o.pool.num_blocks, 400);
    EXPECT_EQ(o.pool.headroom_blocks, 24);
    EXPECT_EQ(o.reclaim.max_moves_per_step, 800);
    EXPECT_EQ(o.evictor.granularity, Granularity::kHead);
    EXPECT_EQ(o.evictor.num_layers, 4);
    EXPECT_EQ(o.evictor.num_kv_heads, 2);
  }
}

TEST(MakeRunSpecTest, TokenGranularityKeepsThePoolAndMayGoWithoutAShape) {
  const Mode modes[] = {Mode::kNative};
  StatusOr<RunSpec> spec = MakeRunSpec(Pool(50), Granularity::kToken, nullptr, modes);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->kv_groups, 1);
  EXPECT_EQ(spec->num_slots, 50 * 16);
  EXPECT_EQ(spec->runs[0].pool.num_blocks, 50);
  EXPECT_EQ(spec->runs[0].reclaim.max_moves_per_step, 100);
}

TEST(MakeRunSpecTest, RefusesASplitPastTheBlockIndexRangeAndALayerRunWithoutAShape) {
  const model::ModelConfig m = Shape();
  const Mode modes[] = {Mode::kVtoken};
  StatusOr<RunSpec> big = MakeRunSpec(Pool(1 << 30), Granularity::kLayer, &m, modes);
  EXPECT_EQ(big.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(big.status().message(),
            "1073741824 blocks at granularity layer are 4294967296 blocks of one KV group (4 "
            "groups); at most 2147483647");
  StatusOr<RunSpec> blind = MakeRunSpec(Pool(8), Granularity::kLayer, nullptr, modes);
  EXPECT_EQ(blind.status().code(), StatusCode::kInvalidArgument);
}

class ExperimentSpecTest : public ::testing::Test {
 protected:
  StatusOr<ExperimentConfig> Load(const std::string& toml) {
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("run_spec_test_" + std::to_string(getpid()) + ".toml"))
                                 .string();
    std::ofstream(path) << toml;
    StatusOr<ExperimentConfig> c = LoadExperimentConfig(path, {});
    std::remove(path.c_str());
    return c;
  }
  static StatusOr<int64_t> NoGpu() { return int64_t{-1}; }
};

// The parsed config is not rewritten: runs record the user's num_blocks and run the split one.
TEST_F(ExperimentSpecTest, RecordsTheConfigAsGivenAndRunsTheSplitPool) {
  StatusOr<ExperimentConfig> c =
      Load("modes = [\"native\", \"vtoken\"]\nseed = 7\n[model]\npath = \"" + SourceDir() +
           "/models/vt-tiny-gqa\"\n"
           "[engine]\nnum_blocks = 64\nblock_size = 8\n[cache]\ngranularity = \"layer\"\n"
           "[policy]\nname = \"h2o\"\nkeep_ratio = 0.5\n");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  StatusOr<ExperimentSpec> spec = BuildExperimentSpec(*c, NoGpu);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(c->engine.pool.num_blocks, 64);
  ASSERT_TRUE(spec->shape.has_value());
  const int32_t groups = spec->run.kv_groups;
  EXPECT_EQ(groups, spec->shape->num_hidden_layers);
  ASSERT_EQ(spec->run.runs.size(), 2u);
  ASSERT_EQ(spec->records.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(spec->run.runs[i].mode, c->modes[i]);
    EXPECT_EQ(spec->run.runs[i].pool.num_blocks, 64 * groups);
    const engine::RunRecord& r = spec->records[i];
    EXPECT_EQ(r.num_blocks, 64);
    EXPECT_EQ(r.block_size, 8);
    EXPECT_EQ(r.config_toml, c->resolved_toml[i]);
    EXPECT_EQ(r.config_hash, ConfigHash(c->resolved_toml[i]));
    EXPECT_EQ(r.mode, ModeName(c->modes[i]));
    EXPECT_EQ(r.seed, 7u);
  }
  EXPECT_EQ(spec->records[0].policy, "");  // native evicts nothing
  EXPECT_EQ(spec->records[1].policy, "h2o");
  EXPECT_DOUBLE_EQ(spec->records[1].budget, 0.5);
}

TEST_F(ExperimentSpecTest, APerplexityWorkloadNeedsAnAbsoluteBudget) {
  StatusOr<ExperimentConfig> c =
      Load("modes = [\"vtoken\"]\n[model]\npath = \"" + SourceDir() +
           "/models/vt-tiny\"\n[workload]\nkind = \"perplexity\"\n[policy]\nname = \"h2o\"\n"
           "keep_ratio = 0.5\n");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  StatusOr<ExperimentSpec> spec = BuildExperimentSpec(*c, NoGpu);
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(spec.status().message().find("policy.budget_tokens"), std::string::npos)
      << spec.status().message();
}

}  // namespace
}  // namespace vtoken::cli
