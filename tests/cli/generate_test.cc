// `vtoken-cli generate` on the bundled model: the three output formats agree with each other and
// with the tokenizer (text is the output ids decoded without special tokens, bytes exact);
// --drop evicts exactly the listed positions right after prefill; --policy-param reaches the
// policy; --dtype, --granularity and --device (errors without a GPU; on one, the GPU cases run).
#include <gtest/gtest.h>
#include <sched.h>

#include <cstdlib>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
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
    model_ = SourceDir() + "/models/vt-tiny";
  }
  CliResult Generate(std::vector<std::string> more) const {
    std::vector<std::string> args = {"generate", "--model",      model_, "--prompt",
                                     kPrompt,    "--max-tokens", "12",   "--no-stop-at-eos"};
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

// --threads sizes the model step's thread team (0, the default: OMP_NUM_THREADS when set, else
// every CPU this process may use); threads split the work, never a sum, so every count gives the
// same tokens.
TEST_F(GenerateTest, ThreadsChangeNothingButTheTeam) {
  const std::vector<std::string> args = {"--policy", "h2o", "--budget-tokens", "12", "--threads"};
  std::vector<std::string> one = args, two = args;
  one.push_back("1");
  two.push_back("2");
  const nlohmann::json a = Json(one), b = Json(two);
  const nlohmann::json by_default = Json({"--policy", "h2o", "--budget-tokens", "12"});
  EXPECT_EQ(a["threads"], 1);
  EXPECT_EQ(b["threads"], 2);
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {  // Every CPU of the affinity mask.
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    ASSERT_EQ(sched_getaffinity(0, sizeof(cpus), &cpus), 0);
    EXPECT_EQ(by_default["threads"], CPU_COUNT(&cpus));
  }
  EXPECT_EQ(a["output_ids"], b["output_ids"]);
  EXPECT_EQ(a["output_ids"], by_default["output_ids"]);
  // Without --threads, OMP_NUM_THREADS caps it (sweep --jobs sets it for its runs).
  const char* before = std::getenv("OMP_NUM_THREADS");
  const std::string saved = before != nullptr ? before : "";
  setenv("OMP_NUM_THREADS", "1", 1);
  const nlohmann::json capped = Json({"--policy", "h2o", "--budget-tokens", "12"});
  const nlohmann::json given = Json(two);
  if (before != nullptr) {
    setenv("OMP_NUM_THREADS", saved.c_str(), 1);
  } else {
    unsetenv("OMP_NUM_THREADS");
  }
  EXPECT_EQ(capped["threads"], 1);
  EXPECT_EQ(given["threads"], 2);
  EXPECT_EQ(capped["output_ids"], a["output_ids"]);
}

TEST_F(GenerateTest, PolicyParamReachesThePolicy) {
  const nlohmann::json j =
      Json({"--policy", "h2o", "--budget-tokens", "12", "--policy-param", "recent_ratio=0.25"});
  EXPECT_EQ(j["policy"], "h2o");
  EXPECT_GT(j["evictions"].get<int64_t>(), 0);
  const CliResult bad =
      Generate({"--policy", "h2o", "--budget-tokens", "12", "--policy-param", "recent_ratio=7"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("recent_ratio"), std::string::npos) << bad.err;
}

// --evict-interval mirrors policy.evict_interval: evict after prefill, then every N decode steps.
TEST_F(GenerateTest, EvictIntervalSpacesTheEvictions) {
  const nlohmann::json every = Json({"--policy", "h2o", "--budget-tokens", "12"});
  const nlohmann::json once =
      Json({"--policy", "h2o", "--budget-tokens", "12", "--evict-interval", "100000"});
  EXPECT_GT(once["evictions"].get<int64_t>(), 0);  // after prefill
  EXPECT_LT(once["evictions"].get<int64_t>(), every["evictions"].get<int64_t>());
  const CliResult bad =
      Generate({"--policy", "h2o", "--budget-tokens", "12", "--evict-interval", "0"});
  EXPECT_EQ(bad.exit_code, 2);  // refused while parsing the flags
  EXPECT_NE(bad.err.find("--evict-interval: must be an integer in [1, 2147483647], got 0"),
            std::string::npos)
      << bad.err;
}

// The flags that mirror config keys are spelled as the keys are (--budget-tokens, --num-sink,
// --num-recent); the old spellings give the same run and a one-line note that they are deprecated.
TEST_F(GenerateTest, OldFlagSpellingsStillWorkAndSaySo) {
  const std::vector<std::string> now = {"--policy",   "h2o", "--budget-tokens", "12",
                                        "--num-sink", "2",   "--num-recent",    "4",
                                        "--output",   "json"};
  const std::vector<std::string> old = {"--policy", "h2o",      "--budget", "12",       "--sink",
                                        "2",        "--recent", "4",        "--output", "json"};
  const CliResult a = Generate(now);
  const CliResult b = Generate(old);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const nlohmann::json ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  EXPECT_EQ(ja["output_ids"], jb["output_ids"]);
  EXPECT_EQ(ja["evictions"], jb["evictions"]);
  EXPECT_EQ(a.err.find("deprecated"), std::string::npos) << a.err;
  for (const char* note :
       {"--budget is deprecated; use --budget-tokens", "--sink is deprecated; use --num-sink",
        "--recent is deprecated; use --num-recent"}) {
    EXPECT_NE(b.err.find(note), std::string::npos) << b.err;
  }
  const CliResult both = Generate({"--policy", "h2o", "--budget-tokens", "12", "--budget", "8"});
  EXPECT_NE(both.exit_code, 0);
}

// The same continuation from naive and vtoken under a policy (identical live tokens), at every
// granularity, in bfloat16 on the CPU: the torch path in bf16 computes the same thing whatever
// slots the tokens sit in.
TEST_F(GenerateTest, Bfloat16NaiveAndVtokenAgreeAtEveryGranularity) {
  for (const char* granularity : {"token", "layer", "head"}) {
    SCOPED_TRACE(granularity);
    const std::vector<std::string> args = {
        "--policy", "h2o",           "--budget-tokens", "12",           "--dtype",
        "bfloat16", "--granularity", granularity,       "--block-size", "3"};
    const nlohmann::json vt = Json(args);
    std::vector<std::string> naive_args = args;
    naive_args.insert(naive_args.end(), {"--mode", "naive"});
    const nlohmann::json naive = Json(naive_args);
    EXPECT_EQ(vt["dtype"], "bfloat16");
    EXPECT_EQ(vt["granularity"], granularity);
    // vt-tiny: 6 layers, 1 KV head.
    EXPECT_EQ(vt["kv_groups"], std::string(granularity) == "token" ? 1 : 6);
    EXPECT_GT(vt["evictions"].get<int64_t>(), 0);
    EXPECT_GT(vt["tokens_moved"].get<int64_t>(), 0) << "block size 3 leaves sparse blocks to pack";
    ASSERT_EQ(vt["output_ids"].size(), 12u);
    EXPECT_EQ(vt["output_ids"], naive["output_ids"]);
  }
}

// Layer and head groups evict per group; on a one-KV-head model they are the same groups.
TEST_F(GenerateTest, LayerAndHeadGranularityCoincideOnOneKvHead) {
  const std::vector<std::string> policy = {"--policy", "h2o", "--budget-tokens", "12",
                                           "--granularity"};
  std::vector<std::string> layer_args = policy, head_args = policy;
  layer_args.push_back("layer");
  head_args.push_back("head");
  const nlohmann::json layer = Json(layer_args);
  const nlohmann::json head = Json(head_args);
  EXPECT_EQ(layer["output_ids"], head["output_ids"]);
  EXPECT_EQ(layer["evictions"], head["evictions"]);
}

// float16 on the CPU: either this libtorch runs it (12 tokens) or generate refuses it in one line
// before loading the model, naming the dtype, the device and torch's reason.
TEST_F(GenerateTest, Float16OnCpuRunsOrIsRefusedInOneLine) {
  const CliResult r = Generate({"--dtype", "float16", "--output", "ids"});
  if (r.exit_code == 0) {
    EXPECT_EQ(Lines(r.out).size(), 1u);
    std::istringstream ids(r.out);
    EXPECT_EQ(std::distance(std::istream_iterator<int>(ids), std::istream_iterator<int>()), 12);
    return;
  }
  EXPECT_EQ(r.exit_code, 1);
  const std::vector<std::string> lines = Lines(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_EQ(lines[0].rfind("vtoken-cli: error: dtype float16 on cpu: not supported by this "
                           "libtorch (",
                           0),
            0u)
      << lines[0];
}

bool GpuPresent() { return std::system("nvidia-smi -L >/dev/null 2>&1") == 0; }

TEST_F(GenerateTest, CudaWithoutADeviceIsOneLineError) {
  if (GpuPresent()) GTEST_SKIP() << "this machine has a GPU";
  for (const char* device : {"cuda", "cuda:0"}) {
    const CliResult r = Generate({"--device", device});
    EXPECT_EQ(r.exit_code, 1);
    const std::vector<std::string> lines = Lines(r.err);
    ASSERT_EQ(lines.size(), 1u) << r.err;
    EXPECT_EQ(
        lines[0].rfind(
            "vtoken-cli: error: --device \"" + std::string(device) + "\": no CUDA device (", 0),
        0u)
        << lines[0];
  }
}

TEST_F(GenerateTest, CudaGraphsOnTheCpuAreRefusedInOneLine) {
  const CliResult r = Generate({"--cuda-graphs"});
  EXPECT_EQ(r.exit_code, 1);
  const std::vector<std::string> lines = Lines(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_EQ(lines[0], "vtoken-cli: error: --cuda-graphs needs --device cuda (got --device cpu)");
}

// On a GPU (skipped without one): bf16 on CUDA, naive and vtoken give the same tokens, with the
// relocations done by the CUDA copy engine when lib/cuda is built; with --cuda-graphs too.
TEST_F(GenerateTest, CudaBfloat16NaiveAndVtokenAgree) {
  if (!GpuPresent()) GTEST_SKIP() << "no GPU (nvidia-smi -L fails)";
  for (const char* granularity : {"token", "head"}) {
    SCOPED_TRACE(granularity);
    const std::vector<std::string> args = {"--policy",     "h2o",  "--budget-tokens", "12",
                                           "--device",     "cuda", "--dtype",         "bfloat16",
                                           "--block-size", "3",    "--granularity",   granularity};
    const nlohmann::json vt = Json(args);
    std::vector<std::string> naive_args = args;
    naive_args.insert(naive_args.end(), {"--mode", "naive"});
    EXPECT_GT(vt["tokens_moved"].get<int64_t>(), 0);
    ASSERT_EQ(vt["output_ids"].size(), 12u);
    EXPECT_EQ(vt["output_ids"], Json(naive_args)["output_ids"]);
    std::vector<std::string> graph_args = args;
    graph_args.push_back("--cuda-graphs");
    const nlohmann::json graphs = Json(graph_args);
    EXPECT_EQ(graphs["cuda_graphs"], true);
    EXPECT_EQ(graphs["output_ids"], vt["output_ids"]);
  }
}

}  // namespace
}  // namespace vtoken::cli
