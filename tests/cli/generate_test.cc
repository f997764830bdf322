// `vtoken-cli generate` on the bundled model: the three output formats agree with each other and
// with the tokenizer (text is the output ids decoded without special tokens, bytes exact);
// --drop evicts exactly the listed positions right after prefill; --policy-param reaches the
// policy.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lib/model/io/tokenizer.h"
#include "tests/cli/cli_test_util.h"

namespace vtoken::cli {
namespace {

const char* kPrompt =
    "And it came to pass, when the king heard the words of the law, that he rent his clothes.";

class GenerateTest : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    if (!VTOKEN_CLI_HAS_TORCH) GTEST_SKIP() << "generate needs a vtoken-cli with libtorch";
    const char* src = std::getenv("VTOKEN_SOURCE_DIR");
    model_ = std::string(src != nullptr ? src : ".") + "/models/vt-tiny";
  }
  CliResult Generate(std::vector<std::string> more) const {
    std::vector<std::string> args = {"generate", "--model", model_, "--prompt", kPrompt,
                                     "--max-tokens", "12", "--no-stop-at-eos"};
    args.insert(args.end(), more.begin(), more.end());
    return Cli(args);
  }
  nlohmann::json Json(std::vector<std::string> more) const {
    more.push_back("--output");
    more.push_back("json");
    const CliResult r = Generate(more);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  }
  std::string model_;
};

TEST_F(GenerateTest, TextIdsAndJsonAgreeWithTheTokenizer) {
  StatusOr<model::Tokenizer> tok = model::Tokenizer::Load(model_ + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const nlohmann::json j = Json({});
  const auto ids = j["output_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), 12u);
  EXPECT_EQ(j["prompt_ids"].get<std::vector<int32_t>>(), tok->Encode(kPrompt));
  EXPECT_EQ(j["bos"], 2046);
  EXPECT_EQ(j["text"], tok->Decode(ids, /*skip_special=*/true));
  EXPECT_EQ(j["evictions"], 0);

  const CliResult as_ids = Generate({"--output", "ids"});
  ASSERT_EQ(as_ids.exit_code, 0) << as_ids.err;
  std::string joined;
  for (size_t i = 0; i < ids.size(); ++i) joined += (i ? " " : "") + std::to_string(ids[i]);
  EXPECT_EQ(as_ids.out, joined + "\n");

  const CliResult as_text = Generate({});
  ASSERT_EQ(as_text.exit_code, 0) << as_text.err;
  EXPECT_EQ(as_text.out, std::string(kPrompt) + tok->Decode(ids, true) + "\n");
}

TEST_F(GenerateTest, DropEvictsExactlyTheListedPositions) {
  const nlohmann::json full = Json({});
  const nlohmann::json dropped = Json({"--drop", "1,2,3,4,5,6,7,8,9,10"});
  EXPECT_EQ(dropped["dropped"], nlohmann::json({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  EXPECT_EQ(dropped["policy"], "drop");
  EXPECT_EQ(dropped["evictions"], 10);  // Once, after prefill: decode steps evict nothing.
  EXPECT_NE(dropped["output_ids"], full["output_ids"]) << "the context lost ten tokens";
  // naive and vtoken hold the same live tokens: the same continuation.
  EXPECT_EQ(Json({"--drop", "1,2,3,4,5,6,7,8,9,10", "--mode", "naive"})["output_ids"],
            dropped["output_ids"]);
}

TEST_F(GenerateTest, PolicyParamReachesThePolicy) {
  const nlohmann::json j = Json({"--policy", "h2o", "--budget", "12", "--policy-param",
                                 "recent_ratio=0.25"});
  EXPECT_EQ(j["policy"], "h2o");
  EXPECT_GT(j["evictions"].get<int64_t>(), 0);
  const CliResult bad = Generate({"--policy", "h2o", "--budget", "12", "--policy-param",
                                  "recent_ratio=7"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("recent_ratio"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace vtoken::cli
