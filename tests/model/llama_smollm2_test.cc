// SmolLM2-135M-Instruct (the Q4_1 GGUF file scripts/fetch-model.sh fetches; ctest's fixture
// `smollm2` runs it first; smollm2_path.h finds it) through the whole runtime, against llama.cpp
// (tests/fixtures/smollm2_llamacpp, produced by scripts/make-llamacpp-fixture.py):
//   - greedy_f32.json: llama.cpp on the same weights as ours (the file dequantized to F32, F32 KV
//     cache). Teacher-forced on its continuations our argmax is its argmax at every step whose
//     top-2 margin is at least kF32Tie, and our free-running greedy continuations (through the
//     paged engine) equal its own token for token until a step whose margin is below kF32Tie;
//   - greedy.json: llama.cpp on the Q4_1 file as it stands, which quantizes activations to Q8_1
//     and the KV cache to F16 (logits up to ~2 away from fp32): the same comparisons with
//     kQ4Tie; and both again over an fp16 KV store; with 8-bit activations or bf16 weights,
//     greedy.json's comparison alone;
//   - naive and vtoken eviction give identical tokens at token, layer and head granularity
//     (the same tokens are evicted; only their physical placement differs), tokens really moved.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "lib/engine/engine.h"
#include "lib/model/io/model_files.h"
#include "lib/model/llama_runner.h"
#include "tests/model/smollm2_path.h"

namespace vtoken::model {
namespace {

// Margins below which either token may win: fp32 in another summation order (logits within
// 1e-4 of a float64 reference), and llama.cpp's own Q8_1 activations and F16 KV cache.
constexpr double kF32Tie = 0.01;
constexpr double kQ4Tie = 0.5;

std::string ModelPath() {
  StatusOr<std::string> path = testing::SmolLm2Path();
  return path.ok() ? *path : "";
}

nlohmann::json Fixture(const std::string& name = "greedy_f32.json") {
  const char* src = std::getenv("VTOKEN_SOURCE_DIR");
  std::ifstream in(std::string(src != nullptr ? src : ".") + "/tests/fixtures/smollm2_llamacpp/" +
                   name);
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

class SmolLm2Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(testing::SmolLm2Path().ok()) << testing::SmolLm2Path().status().ToString();
  }

  // A runner over `slots` KV slots at `granularity`.
  static std::unique_ptr<LlamaRunner> Runner(int64_t slots, Granularity granularity,
                                             const LlamaOptions& options = {}) {
    StatusOr<LlamaModel> model = LoadModel(ModelPath(), 1, options);
    EXPECT_TRUE(model.ok()) << model.status().ToString();
    if (!model.ok()) return nullptr;
    StatusOr<std::unique_ptr<LlamaRunner>> runner =
        LlamaRunner::Create(std::move(*model), {.num_slots = slots, .granularity = granularity});
    EXPECT_TRUE(runner.ok()) << runner.status().ToString();
    return runner.ok() ? std::move(*runner) : nullptr;
  }
};

// Teacher-forced on `fixture`'s continuations: our argmax must be llama.cpp's wherever its margin
// is at least `tie`. Returns the steps compared.
int64_t CompareTeacherForced(const LlamaModel& model, const nlohmann::json& fixture, double tie) {
  int64_t checked = 0, agreed = 0;
  for (const auto& c : fixture["cases"]) {
    const auto prompt = c["prompt_ids"].get<std::vector<int64_t>>();
    const auto want = c["output_ids"].get<std::vector<int64_t>>();
    const auto margins = c["margins"].get<std::vector<double>>();
    // The prompt and every output token but the last: row prompt.size() - 1 + k predicts want[k].
    std::vector<int64_t> ids = prompt;
    ids.insert(ids.end(), want.begin(), want.end() - 1);
    torch::NoGradGuard no_grad;
    const torch::Tensor ours = model.ForwardDense(torch::tensor(ids, torch::kInt64).unsqueeze(0))[0]
                                   .slice(0, static_cast<int64_t>(prompt.size()) - 1)
                                   .argmax(-1);
    for (size_t k = 0; k < want.size(); ++k) {
      if (margins[k] < tie) continue;
      ++checked;
      const int64_t got = ours[static_cast<int64_t>(k)].item<int64_t>();
      agreed += got == want[k];
      EXPECT_EQ(got, want[k]) << c["name"] << "/" << c["format"] << " step " << k
                              << " (llama.cpp's margin " << margins[k] << ")";
    }
  }
  std::printf("teacher-forced: %lld of %lld steps with llama.cpp margin >= %g agree\n",
              static_cast<long long>(agreed), static_cast<long long>(checked), tie);
  return checked;
}

TEST_F(SmolLm2Test, TeacherForcedArgmaxMatchesLlamaCpp) {
  StatusOr<LlamaModel> model = LoadModel(ModelPath(), 1);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  for (const auto& [file, tie] :
       {std::pair{"greedy_f32.json", kF32Tie}, std::pair{"greedy.json", kQ4Tie}}) {
    const nlohmann::json fixture = Fixture(file);
    ASSERT_TRUE(fixture.is_object() && fixture.contains("cases")) << file << " unreadable";
    std::printf("%s: ", file);
    EXPECT_GT(CompareTeacherForced(*model, fixture, tie), 1500) << file;
  }
}

// Our greedy continuations against each fixture's: equal until a step whose llama.cpp margin is
// below the fixture's tie.
void CompareGreedy(
    const std::vector<engine::Request>& requests, const engine::EngineResult& result,
    int64_t n_predict,
    const std::vector<std::tuple<const char*, const nlohmann::json*, double>>& fixtures) {
  for (const auto& [name, fixture, tie] : fixtures) {
    int64_t identical = 0, matched_tokens = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      const auto& c = (*fixture)["cases"][i];
      ASSERT_EQ(c["prompt_ids"].get<std::vector<int32_t>>(), requests[i].prompt_tokens);
      const auto want = c["output_ids"].get<std::vector<int32_t>>();
      const auto margins = c["margins"].get<std::vector<double>>();
      const std::vector<int32_t>& got = result.requests[i].output_tokens;
      ASSERT_EQ(got.size(), want.size()) << c["name"];
      size_t k = 0;
      while (k < want.size() && got[k] == want[k]) ++k;
      matched_tokens += static_cast<int64_t>(k);
      if (k == want.size()) {
        ++identical;
        continue;
      }
      std::printf(
          "  %-12s %-6s diverges at token %3zu: ours %5d, llama.cpp %5d (its margin %.4f)\n",
          c["name"].get<std::string>().c_str(), c["format"].get<std::string>().c_str(), k, got[k],
          want[k], margins[k]);
      EXPECT_LT(margins[k], tie) << c["name"] << "/" << c["format"] << " diverges at token " << k
                                 << " where llama.cpp's choice is not a near-tie";
    }
    std::printf(
        "%s: %lld of %zu cases identical; %lld of %zu tokens before the first "
        "divergence\n",
        name, static_cast<long long>(identical), requests.size(),
        static_cast<long long>(matched_tokens), requests.size() * n_predict);
  }
}

TEST_F(SmolLm2Test, GreedyTokensMatchLlamaCpp) {
  const nlohmann::json f32 = Fixture("greedy_f32.json"), q4 = Fixture("greedy.json");
  ASSERT_TRUE(f32.is_object() && f32.contains("cases")) << "greedy_f32.json unreadable";
  ASSERT_TRUE(q4.is_object() && q4.contains("cases")) << "greedy.json unreadable";
  const int64_t n_predict = f32["n_predict"].get<int64_t>();
  std::vector<engine::Request> requests;
  int64_t tokens = 0;
  for (const auto& c : f32["cases"]) {
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
  // Weights as stored: decode reads the file's Q4_1 blocks (CpuQuantLinear), with the fp32
  // weights' bits (llama_gguf_test), so llama.cpp's choices must hold for both. Then the same
  // over an fp16 KV store (LlamaOptions::kv_dtype), llama.cpp's default cache type, to the same
  // ties (on 2026-12-06 its tokens were the fp32 store's, all 16 cases identical to the F32
  // fixture's).
  // Then llama.cpp's own arithmetic on this file: 8-bit activations (CpuQ8Linear) and an fp16
  // KV store, against greedy.json alone (the F32 fixture's near-ties are not its near-ties).
  // Last, weights and activations in bf16 (CpuBf16Linear) over an fp16 KV store: another lossy
  // arithmetic, against greedy.json's ties too.
  enum Weights { kStored, kQ8, kBf16 };
  for (const auto& [kv16, weights] :
       {std::pair{false, kStored}, {true, kStored}, {true, kQ8}, {true, kBf16}}) {
    const char* label = weights == kQ8 ? ", q8 activations" : weights == kBf16 ? ", bf16" : "";
    SCOPED_TRACE(std::string(kv16 ? "fp16 KV" : "fp32 KV") + label);
    std::printf("KV store in %s%s\n", kv16 ? "fp16" : "fp32", label);
    LlamaOptions options{.weights_as_stored = weights != kBf16,
                         .q8_activations = weights == kQ8,
                         .bf16_weights = weights == kBf16};
    if (kv16) options.kv_dtype = torch::kHalf;
    std::unique_ptr<LlamaRunner> runner =
        Runner(int64_t{o.pool.num_blocks} * o.pool.block_size, Granularity::kToken, options);
    ASSERT_NE(runner, nullptr);
    ASSERT_EQ(runner->kv().options().dtype, kv16 ? torch::kHalf : torch::kFloat32);
    ASSERT_FALSE(runner->bos_token_id().has_value()) << "SmolLM2's file says add_bos_token false";
    StatusOr<engine::EngineResult> result = engine::RunEngine(o, *runner, requests);
    ASSERT_TRUE(result.ok()) << result.status().ToString();
    if (weights != kStored) {
      CompareGreedy(requests, *result, n_predict, {{"greedy.json", &q4, kQ4Tie}});
    } else {
      CompareGreedy(requests, *result, n_predict,
                    {{"greedy_f32.json", &f32, kF32Tie}, {"greedy.json", &q4, kQ4Tie}});
    }
  }
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
  for (Granularity granularity : {Granularity::kToken, Granularity::kLayer, Granularity::kHead}) {
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
      const int32_t groups = granularity == Granularity::kToken   ? 1
                             : granularity == Granularity::kLayer ? 30
                                                                  : 30 * 3;
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
