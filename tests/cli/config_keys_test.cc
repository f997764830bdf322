// The config key table (apps/vtoken-cli/config/config_keys.h): docs/EXPERIMENTS.md's key reference
// is its output, and config errors name the file, the key, the line or the --set, the range, and
// the nearest key of a typo.
#include "apps/vtoken-cli/config/config_keys.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "apps/vtoken-cli/config/config_sweep.h"
#include "apps/vtoken-cli/config/experiment_config.h"
#include "tests/cli/cli_test_util.h"

namespace vtoken::cli {
namespace {

namespace fs = std::filesystem;

TEST(ConfigKeys, DocsEqualTheGeneratedReference) {
  const std::string doc = ReadFile(SourceDir() + "/docs/EXPERIMENTS.md");
  const std::string begin = "<!-- BEGIN config-keys";
  const size_t b = doc.find(begin);
  const size_t e = doc.find("<!-- END config-keys -->");
  ASSERT_NE(b, std::string::npos);
  ASSERT_NE(e, std::string::npos);
  const size_t table = doc.find('\n', b) + 1;
  EXPECT_EQ(doc.substr(table, e - table), ConfigKeysMarkdown())
      << "regenerate docs/EXPERIMENTS.md's key reference with `vtoken-cli config-keys`";
}

// [sweep] is parsed outside the table; docs/SWEEPS.md documents its keys (as `key = `, a
// [sweep.key] table or a [[sweep.key]] array of tables).
TEST(ConfigKeys, SweepKeysAreInSweepsDoc) {
  const std::string doc = ReadFile(SourceDir() + "/docs/SWEEPS.md");
  for (const std::string_view k : kSweepKeys) {
    const std::string key(k);
    const bool documented = doc.find("\n" + key + " = ") != std::string::npos ||
                            doc.find("`" + key + " = ") != std::string::npos ||
                            doc.find("[sweep." + key + "]") != std::string::npos;
    EXPECT_TRUE(documented) << key;
  }
}

TEST(ConfigKeys, OneEntryPerKeyWithDocAndValue) {
  const ExperimentConfig defaults;
  for (const ConfigKey& k : ConfigKeys()) {
    EXPECT_EQ(FindConfigKey(k.name), &k) << k.name << " declared twice";
    EXPECT_FALSE(k.doc.empty()) << k.name;
    EXPECT_EQ(static_cast<size_t>(k.type), k.get(defaults).index()) << k.name;
    EXPECT_TRUE(CheckRange(k, k.get(defaults)).empty() || k.name == "policy.keep_ratio")
        << k.name << ": the default is outside the key's range";
  }
  EXPECT_EQ(FindConfigKey("policy.keep_ration"), nullptr);
  EXPECT_TRUE(IsConfigSection("sim.hardware"));
  EXPECT_FALSE(IsConfigSection("policy.keep_ratio"));
}

TEST(ConfigKeys, FlagNamesFollowTheKey) {
  EXPECT_EQ(FindConfigKey("reclaim.frag_threshold")->FlagName(), "--frag-threshold");
  EXPECT_EQ(FindConfigKey("policy.num_sink")->FlagName(), "--num-sink");
  EXPECT_EQ(FindConfigKey("policy.budget_tokens")->FlagName(), "--budget-tokens");
  EXPECT_EQ(FindConfigKey("reclaim.max_moves_per_step")->FlagName(), "--max-moves-per-step");
}

TEST(ConfigKeys, NearestKeyOfATypo) {
  EXPECT_EQ(NearestConfigKey("policy.keep_ration"), "policy.keep_ratio");
  EXPECT_EQ(NearestConfigKey("engine.num_blockz"), "engine.num_blocks");
  EXPECT_EQ(NearestConfigKey("budget_tokens"), "policy.budget_tokens");
  EXPECT_EQ(NearestConfigKey("completely_different"), "");
}

class ConfigErrorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("config_errors_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Loads `text` as x.toml with `sets`; returns the error message ("" when it loads).
  std::string Error(const std::string& text, std::vector<std::string> sets = {}) {
    const std::string path = (dir_ / "x.toml").string();
    std::ofstream(path) << text;
    StatusOr<ExperimentConfig> c = LoadExperimentConfig(path, sets);
    return c.ok() ? "" : c.status().message();
  }
  std::string File() const { return (dir_ / "x.toml").string(); }

  fs::path dir_;
};

constexpr const char* kConfig =
    "name = \"x\"\n"
    "[model]\n"
    "path = \"sim:llama-3.1-8b\"\n"
    "[policy]\n"
    "keep_ratio = 0.25\n";

TEST_F(ConfigErrorsTest, UnknownKeyNamesFileLineAndNearestKey) {
  EXPECT_EQ(Error("name = \"x\"\n[policy]\nname = \"h2o\"\nkeep_ration = 0.3\n"),
            File() + ":4: unknown key 'policy.keep_ration'; did you mean 'policy.keep_ratio'?");
}

TEST_F(ConfigErrorsTest, UnknownKeyOfASetNamesTheSet) {
  EXPECT_EQ(Error(kConfig, {"policy.keep_ration=0.3"}),
            File() +
                " (--set policy.keep_ration=0.3): unknown key 'policy.keep_ration'; did "
                "you mean 'policy.keep_ratio'?");
}

TEST_F(ConfigErrorsTest, KeepRatioOutOfRangeNamesFileKeyLineAndRange) {
  const std::string above = Error("[policy]\nkeep_ratio = 1.5\n");
  EXPECT_EQ(above, File() +
                       ":2: key 'policy.keep_ratio' must be in (0, 1] (is 1.5); for an "
                       "absolute budget give policy.budget_tokens");
  const std::string zero = Error("[policy]\nkeep_ratio = 0\n");
  EXPECT_NE(zero.find(File() + ":2: key 'policy.keep_ratio' must be in (0, 1] (is 0)"),
            std::string::npos)
      << zero;
  EXPECT_NE(Error(kConfig, {"policy.keep_ratio=0"})
                .find("(--set policy.keep_ratio=0): key "
                      "'policy.keep_ratio' must be in (0, 1]"),
            std::string::npos);
  // Beside budget_tokens, 0 is the old spelling of "no ratio" and still loads.
  EXPECT_EQ(Error(kConfig, {"policy.keep_ratio=0", "policy.budget_tokens=100"}), "");
}

TEST_F(ConfigErrorsTest, WrongTypeAndChoicesNameTheLine) {
  EXPECT_EQ(Error("[engine]\nblock_size = 16\nnum_blocks = 'many'\n"),
            File() + ":3: key 'engine.num_blocks' must be an integer");
  EXPECT_EQ(Error("[engine]\nadmission = 'fifo'\n"),
            File() + ":2: key 'engine.admission' must be \"reserve\" or \"greedy\" (is \"fifo\")");
  EXPECT_EQ(Error("[engine]\nnum_blocks = 2147483648\n"),
            File() + ":2: key 'engine.num_blocks' is out of range");
}

TEST_F(ConfigErrorsTest, ASetTableOverAValueIsRefused) {
  EXPECT_NE(Error(kConfig, {"model.path.x=1"}).find("--set model.path.x: 'path' in"),
            std::string::npos);
}

}  // namespace
}  // namespace vtoken::cli
