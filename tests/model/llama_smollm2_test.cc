// SmolLM2-135M-Instruct (the Q4_1 GGUF file scripts/fetch-model.sh fetches; ctest's fixture
// `smollm2` runs it first; smollm2_path.h finds it) through the whole runtime:
//   - greedy continuations equal llama.cpp's on the same file (tests/fixtures/smollm2_llamacpp,
//     produced by scripts/make-llamacpp-fixture.py), token for token, up to a near-tie: where a
//     case diverges, llama.cpp's own top-2 logit margin at that step must be below kNearTie;
//   - naive and vtoken eviction give identical tokens at token and head granularity (the same
//     tokens are evicted; only their physical placement differs), with tokens really moved.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lib/engine/engine.h"
#include "lib/model/io/model_files.h"
#include "lib/model/llama_runner.h"
#include "tests/model/smollm2_path.h"

namespace vtoken::model {
namespace {

// llama.cpp multiplies Q4_1 weights with activations quantized to Q8_1; we multiply the
// dequantized weights in fp32. Both round, differently: a step whose top-2 logits are closer than
// this may pick either token.
constexpr double kNearTie = 0.5;

std::string ModelPath() {
  StatusOr<std::string> path = testing::SmolLm2Path();
  return path.ok() ? *path : "";
}

nlohmann::json Fixture() {
  const char* src = std::getenv("VTOKEN_SOURCE_DIR");
  std::ifstream in(std::string(src != nullptr ? src : ".") +
                   "/tests/fixtures/smollm2_llamacpp/greedy.json");
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

class SmolLm2Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(testing::SmolLm2Path().ok()) << testing::SmolLm2Path().status().ToString();
  }

  // A runner over `slots` KV slots at `granularity`.
  static std::unique_ptr<LlamaRunner> Runner(int64_t slots, Granularity granularity) {
    StatusOr<LlamaModel> model = LoadModel(ModelPath(), 1);
    EXPECT_TRUE(model.ok()) << model.status().ToString();
    if (!model.ok()) return nullptr;
    StatusOr<std::unique_ptr<LlamaRunner>> runner =
        LlamaRunner::Create(std::move(*model), {.num_slots = slots, .granularity = granularity});
    EXPECT_TRUE(runner.ok()) << runner.status().ToString();
    return runner.ok() ? std::move(*runner) : nullptr;
  }
};

TEST_F(SmolLm2Test, GreedyTokensMatchLlamaCpp) {
  const nlohmann::json fixture = Fixture();
  ASSERT_TRUE(fixture.is_object() && fixture.contains("cases")) << "greedy.json unreadable";
  const int64_t n_predict = fixture["n_predict"].get<int64_t>();
  std::vector<engine::Request> requests;
  int64_t tokens = 0;
  for (const auto& c : fixture["cases"]) {
    engine::Request r;
    r.id = static_cast<int64_t>(requests.size());
    r.prompt_tokens = c["prompt_ids"].get<std::vector<int32_t>>();
    r.max_tokens = n_predict;
    tokens += static_cast<int64_t>(r.prompt_tokens.size()) + n_predict;
    requests.push_back(std::move(r));
  }
  ASSERT_GE(requests.size(), 16u);
  engine::EngineOptions o;
  o.mode = Mode::kNative;
  o.pool = {.num_blocks = static_cast<int32_t>(tokens / 16 + 2 * requests.size() + 8),
            .block_size = 16,
            .headroom_blocks = 0};
  o.max_num_seqs = static_cast<int32_t>(requests.size());
  o.stop_at_eos = false;
  std::unique_ptr<LlamaRunner> runner =
      Runner(int64_t{o.pool.num_blocks} * o.pool.block_size, Granularity::kToken);
  ASSERT_NE(runner, nullptr);
  ASSERT_FALSE(runner->bos_token_id().has_value()) << "SmolLM2's file says add_bos_token false";
  StatusOr<engine::EngineResult> result = engine::RunEngine(o, *runner, requests);
  ASSERT_TRUE(result.ok()) << result.status().ToString();

  int64_t identical = 0, matched_tokens = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& c = fixture["cases"][i];
    const auto want = c["output_ids"].get<std::vector<int32_t>>();
    const auto margins = c["margins"].get<std::vector<double>>();
    const std::vector<int32_t>& got = result->requests[i].output_tokens;
    ASSERT_EQ(got.size(), want.size()) << c["name"];
    size_t k = 0;
    while (k < want.size() && got[k] == want[k]) ++k;
    matched_tokens += static_cast<int64_t>(k);
    if (k == want.size()) {
      ++identical;
      std::printf("%-28s %-6s identical (%zu tokens)\n", c["name"].get<std::string>().c_str(),
                  c["format"].get<std::string>().c_str(), want.size());
      continue;
    }
    std::printf("%-28s %-6s diverges at token %zu: ours %d, llama.cpp %d (its top-2 margin %.4f)\n",
                c["name"].get<std::string>().c_str(), c["format"].get<std::string>().c_str(), k,
                got[k], want[k], margins[k]);
    EXPECT_LT(margins[k], kNearTie) << c["name"] << " diverges at token " << k
                                    << " where llama.cpp's choice is not a near-tie";
  }
  std::printf("%lld of %zu cases identical; %lld of %zu tokens before the first divergence\n",
              static_cast<long long>(identical), requests.size(),
              static_cast<long long>(matched_tokens), requests.size() * n_predict);
}

TEST_F(SmolLm2Test, NaiveAndVtokenGiveIdenticalTokens) {
  const nlohmann::json fixture = Fixture();
  ASSERT_TRUE(fixture.is_object() && fixture.contains("cases"));
  std::vector<engine::Request> requests;
  for (const auto& c : fixture["cases"]) {
    if (c["format"] != "chatml" || requests.size() == 4) continue;
    engine::Request r;
    r.id = static_cast<int64_t>(requests.size());
    r.prompt_tokens = c["prompt_ids"].get<std::vector<int32_t>>();
    r.max_tokens = 96;
    requests.push_back(std::move(r));
  }
  ASSERT_EQ(requests.size(), 4u);
  for (Granularity granularity : {Granularity::kToken, Granularity::kHead}) {
    std::vector<std::vector<int32_t>> outputs[2];
    int64_t moves[2] = {0, 0};
    for (Mode mode : {Mode::kNaive, Mode::kVtoken}) {
      engine::EngineOptions o;
      o.mode = mode;
      o.policy = "h2o";
      o.evictor = {.budget_tokens = 48, .num_sink = 4, .num_recent = 16};
      o.evictor.granularity = granularity;
      o.evictor.num_layers = 30;
      o.evictor.num_kv_heads = 3;
      // 96 blocks of every layer and head, split into blocks of one KV group as vtoken-cli does.
      const int32_t groups = granularity == Granularity::kToken ? 1 : 30 * 3;
      o.pool = {.num_blocks = 96 * groups, .block_size = 16, .headroom_blocks = 2 * groups};
      o.reclaim.trigger = ReclaimOptions::Trigger::kAlways;
      o.reclaim.max_moves_per_step *= groups;
      o.stop_at_eos = false;
      std::unique_ptr<LlamaRunner> runner =
          Runner(int64_t{o.pool.num_blocks} * o.pool.block_size, granularity);
      ASSERT_NE(runner, nullptr);
      StatusOr<engine::EngineResult> result = engine::RunEngine(o, *runner, requests);
      ASSERT_TRUE(result.ok()) << result.status().ToString();
      const int m = mode == Mode::kNaive ? 0 : 1;
      for (const auto& r : result->requests) outputs[m].push_back(r.output_tokens);
      moves[m] = result->moves;
      EXPECT_GT(result->evictions, 0) << GranularityName(granularity);
    }
    EXPECT_EQ(outputs[0], outputs[1]) << GranularityName(granularity);
    EXPECT_EQ(moves[0], 0);
    EXPECT_GT(moves[1], 0) << GranularityName(granularity) << ": vtoken moved no token";
  }
}

}  // namespace
}  // namespace vtoken::model
