// The libtorch runtime under the engine: TorchCopyEngine moves the right K/V rows (sync and on a
// worker thread), and for the same eviction decisions naive and vtoken produce identical greedy
// tokens while vtoken relocates real K/V tensors.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <functional>

#include "lib/core/policy.h"
#include "lib/engine/engine.h"
#include "lib/model/llama_runner.h"
#include "lib/model/torch_copy_engine.h"
#include "tests/model/small_model_config.h"

namespace vtoken::model {
namespace {

using test_configs::SmallConfig;

class TorchCopyEngineTest : public ::testing::TestWithParam<bool> {};

TEST_P(TorchCopyEngineTest, MovesEveryLayersRowsAndKeepsHashes) {
  StatusOr<KvTensors> kv =
      KvTensors::Create({.num_layers = 3, .num_slots = 64, .num_kv_heads = 2, .head_dim = 5});
  ASSERT_TRUE(kv.ok());
  torch::manual_seed(7);
  for (int64_t l = 0; l < 3; ++l) {
    kv->k(l).copy_(torch::randn_like(kv->k(l)));
    kv->v(l).copy_(torch::randn_like(kv->v(l)));
  }
  std::vector<uint64_t> before(64);
  for (SlotIndex s = 0; s < 64; ++s) before[s] = TokenKvHash(*kv, s);
  TorchCopyEngine engine(*kv, /*async=*/GetParam());
  const std::vector<SlotCopy> copies = {{0, 40}, {1, 41}, {17, 50}, {33, 63}};
  CopyTicket t1 = engine.Submit(copies);
  CopyTicket t2 = engine.Submit({{5, 6}});
  engine.Wait(t2);
  EXPECT_TRUE(engine.Poll(t1));
  EXPECT_TRUE(engine.status().ok());
  for (const SlotCopy& c : copies) EXPECT_EQ(TokenKvHash(*kv, c.dst), before[c.src]);
  EXPECT_EQ(TokenKvHash(*kv, 6), before[5]);
  EXPECT_EQ(TokenKvHash(*kv, 2), before[2]);
  EXPECT_NE(before[0], before[1]);
  EXPECT_EQ(engine.bytes_copied(), 5 * 2 * 3 * 2 * 5 * 4);
}

INSTANTIATE_TEST_SUITE_P(SyncAndAsync, TorchCopyEngineTest, ::testing::Bool());

TEST(TorchCopyEngineTest, OutOfRangeSlotIsReportedNotCopied) {
  StatusOr<KvTensors> kv =
      KvTensors::Create({.num_layers = 1, .num_slots = 8, .num_kv_heads = 1, .head_dim = 4});
  ASSERT_TRUE(kv.ok());
  TorchCopyEngine engine(*kv, false);
  engine.Wait(engine.Submit({{0, 8}}));
  EXPECT_EQ(engine.status().code(), StatusCode::kInvalidArgument);
}

TEST(KvTensorsTest, ScratchSlotsAreAllocatedButNotTheCallers) {
  StatusOr<KvTensors> kv = KvTensors::Create(
      {.num_layers = 2, .num_slots = 8, .num_kv_heads = 1, .head_dim = 4, .scratch_slots = 2});
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  EXPECT_EQ(kv->num_slots(), 8);
  EXPECT_EQ(kv->allocated_slots(), 10);
  for (const torch::Tensor& t : kv->k_tensors()) EXPECT_EQ(t.size(0), 10);
  for (const torch::Tensor& t : kv->v_tensors()) EXPECT_EQ(t.size(0), 10);
  EXPECT_TRUE(kv->CheckSlots(std::vector<int64_t>{0, 7}).ok());
  const Status scratch = kv->CheckSlots(std::vector<int64_t>{8});
  EXPECT_EQ(scratch.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(scratch.message().find("slot 8 out of range [0, 8)"), std::string::npos)
      << scratch.message();
  EXPECT_EQ(kv->CopySlots({9}, {0}).code(), StatusCode::kInvalidArgument);

  StatusOr<KvTensors> negative = KvTensors::Create(
      {.num_layers = 1, .num_slots = 8, .num_kv_heads = 1, .head_dim = 4, .scratch_slots = -1});
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("scratch_slots"), std::string::npos)
      << negative.status().message();
}

// ReadSlots / WriteSlots (the prefill memo's copy out and back in): what is read from some slots
// and written to others reads back equal, TokenKvHash included, at every granularity and dtype.
TEST(KvTensorsTest, SlotsReadOutWriteBackIntoOtherSlotsExactly) {
  for (const Granularity g : {Granularity::kToken, Granularity::kLayer, Granularity::kHead}) {
    for (const torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
      StatusOr<KvTensors> kv = KvTensors::Create({.num_layers = 3,
                                                  .num_slots = 16,
                                                  .num_kv_heads = 2,
                                                  .head_dim = 4,
                                                  .dtype = dtype,
                                                  .granularity = g});
      ASSERT_TRUE(kv.ok()) << kv.status().ToString();
      torch::manual_seed(7);
      for (const torch::Tensor& t : kv->k_tensors()) t.copy_(torch::randn_like(t));
      for (const torch::Tensor& t : kv->v_tensors()) t.copy_(torch::randn_like(t));
      const std::vector<int64_t> from = {3, 0, 9}, to = {12, 5, 15};
      std::vector<std::byte> bytes;
      ASSERT_TRUE(kv->ReadSlots(from, bytes).ok());
      ASSERT_EQ(static_cast<int64_t>(bytes.size()), 3 * kv->bytes_per_slot());
      ASSERT_TRUE(kv->WriteSlots(to, bytes).ok());
      for (size_t i = 0; i < from.size(); ++i) {
        EXPECT_EQ(TokenKvHash(*kv, from[i]), TokenKvHash(*kv, to[i]))
            << GranularityName(g) << " slot " << from[i];
      }
      bytes.pop_back();
      EXPECT_EQ(kv->WriteSlots(to, bytes).code(), StatusCode::kInvalidArgument);
      EXPECT_EQ(kv->ReadSlots(std::vector<int64_t>{16}, bytes).code(),
                StatusCode::kInvalidArgument);
    }
  }
}

std::vector<engine::Request> Requests(int n, int64_t prompt, int64_t max_tokens) {
  return test_configs::Requests(n, prompt, 13, max_tokens, 99);
}

StatusOr<engine::EngineResult> RunMode(Mode mode, bool async,
                                       const std::vector<engine::Request>& requests,
                                       const SamplingParams& sampling = {}) {
  engine::EngineOptions o = test_configs::H2oEngineOptions(mode, 160, 96);
  o.sampling = sampling;
  VTOKEN_ASSIGN_OR_RETURN(LlamaModel m, LlamaModel::RandomInit(SmallConfig(), 3));
  VTOKEN_ASSIGN_OR_RETURN(
      std::unique_ptr<LlamaRunner> runner,
      LlamaRunner::Create(std::move(m), {.num_slots = 160 * 16, .async_copies = async}));
  return engine::RunEngine(o, *runner, requests);
}

TEST(TorchRuntimeTest, NaiveAndVtokenGiveIdenticalGreedyTokensOnRealTensors) {
  const std::vector<engine::Request> requests = Requests(5, 180, 24);
  StatusOr<engine::EngineResult> naive = RunMode(Mode::kNaive, false, requests);
  ASSERT_TRUE(naive.ok()) << naive.status().ToString();
  for (bool async : {false, true}) {
    StatusOr<engine::EngineResult> vt = RunMode(Mode::kVtoken, async, requests);
    ASSERT_TRUE(vt.ok()) << vt.status().ToString();
    EXPECT_GT(vt->moves, 0);
    EXPECT_EQ(vt->hash_checks, vt->moves);
    EXPECT_EQ(vt->violations, 0) << vt->first_violations[0];
    EXPECT_EQ(vt->evictions, naive->evictions);
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(vt->requests[i].output_tokens, naive->requests[i].output_tokens)
          << "request " << i << (async ? " async" : " sync");
    }
  }
}

TEST(TorchRuntimeTest, LoadModelErrorsNameTheProblem) {
  StatusOr<LlamaModel> unknown = LoadModel("synthetic:gpt-9", 1);
  EXPECT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("gpt-9"), std::string::npos);
  StatusOr<LlamaModel> missing = LoadModel("/nonexistent/model-dir", 1);
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/model-dir"), std::string::npos);
}

// Sampling (temperature and nucleus) through relocations: each request draws from its own stream,
// so naive and vtoken, which compute the same logits, draw the same tokens; and the draws are not
// the greedy tokens.
TEST(TorchRuntimeTest, NaiveAndVtokenSampleIdenticalTokens) {
  const std::vector<engine::Request> requests = Requests(5, 180, 24);
  StatusOr<engine::EngineResult> greedy = RunMode(Mode::kNaive, false, requests);
  ASSERT_TRUE(greedy.ok()) << greedy.status().ToString();
  for (double top_p : {0.9, 1.0}) {
    const SamplingParams sampling{.temperature = 0.8, .top_p = top_p, .seed = 7};
    StatusOr<engine::EngineResult> naive = RunMode(Mode::kNaive, false, requests, sampling);
    StatusOr<engine::EngineResult> vt = RunMode(Mode::kVtoken, true, requests, sampling);
    ASSERT_TRUE(naive.ok()) << naive.status().ToString();
    ASSERT_TRUE(vt.ok()) << vt.status().ToString();
    EXPECT_GT(vt->moves, 0);
    EXPECT_EQ(vt->violations, 0) << vt->first_violations[0];
    int not_greedy = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(vt->requests[i].output_tokens, naive->requests[i].output_tokens)
          << "request " << i << " top_p " << top_p;
      not_greedy += naive->requests[i].output_tokens != greedy->requests[i].output_tokens;
    }
    EXPECT_GE(not_greedy, 4) << "top_p " << top_p;
  }
}

}  // namespace
}  // namespace vtoken::model

namespace vtoken::model {
namespace {

// Counts the token signals the engine asks the runner for (ModelRunner::TokenSignals).
class CountingRunner final : public ForwardingRunner {
 public:
  using ForwardingRunner::ForwardingRunner;
  Status TokenSignals(std::span<const SlotIndex> slots,
                      std::span<const TokenSignalInfo* const> signals,
                      const TokenSignalScope& scope, std::vector<float>& out) const override {
    slots_ += static_cast<int64_t>(slots.size());
    return inner_.TokenSignals(slots, signals, scope, out);
  }
  mutable int64_t slots_ = 0;
};

// Runs `requests` under `o` on the small random model (evicting, without violations) and
// expects the engine to ask the runner for the token signals of `slots(prompt, outputs)` slots
// per request (prompt with BOS, outputs generated) in all; returns the outputs.
std::vector<std::vector<int32_t>> ExpectSignalSlots(
    const engine::EngineOptions& o, const std::vector<engine::Request>& requests,
    const std::function<int64_t(int64_t prompt, int64_t outputs)>& slots) {
  StatusOr<LlamaModel> m = LlamaModel::RandomInit(SmallConfig(), 3);
  EXPECT_TRUE(m.ok());
  if (!m.ok()) return {};
  StatusOr<std::unique_ptr<LlamaRunner>> runner =
      LlamaRunner::Create(*std::move(m), {.num_slots = 160 * 16});
  EXPECT_TRUE(runner.ok());
  if (!runner.ok()) return {};
  CountingRunner counting(**runner);
  StatusOr<engine::EngineResult> r = engine::RunEngine(o, counting, requests);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return {};
  EXPECT_GT(r->evictions, 0);
  EXPECT_EQ(r->violations, 0);
  int64_t expected = 0;
  std::vector<std::vector<int32_t>> outputs;
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& out = r->requests[i].output_tokens;
    EXPECT_FALSE(out.empty());
    expected += slots(1 + static_cast<int64_t>(requests[i].prompt_tokens.size()),
                      static_cast<int64_t>(out.size()));
    outputs.push_back(out);
  }
  EXPECT_EQ(counting.slots_, expected);
  return outputs;
}

// A policy reading a token signal (vatp: attn_sum x value_l1_norm) on real tensors: every token's
// value is asked for once (prompt and generated tokens but the last, which is never observed),
// with a whole or a chunked prefill; naive and vtoken (which relocates the rows the values were
// read from) give the same tokens.
TEST(TorchRuntimeTest, TokenSignalsAreReadOncePerTokenAndFollowRelocations) {
  const std::vector<engine::Request> requests = Requests(4, 150, 12);
  std::vector<std::vector<int32_t>> first;
  for (const auto& [mode, chunk] :
       {std::pair{Mode::kNaive, int64_t{200}}, std::pair{Mode::kNaive, int64_t{48}},
        std::pair{Mode::kVtoken, int64_t{48}}}) {
    SCOPED_TRACE(std::string(ModeName(mode)) + " chunk " + std::to_string(chunk));
    engine::EngineOptions o = test_configs::H2oEngineOptions(mode, 160, chunk);
    o.policy = "vatp";
    // The prompt (with BOS) and every output token but the last, once each.
    const std::vector<std::vector<int32_t>> outputs = ExpectSignalSlots(
        o, requests, [](int64_t prompt, int64_t out) { return prompt + out - 1; });
    if (chunk != 48) continue;  // Other chunk shapes may round differently.
    if (first.empty()) first = outputs;
    EXPECT_EQ(outputs, first);
  }
}

// A policy reading a relative token signal (keydiff: key_anchor_cosine; expected_attention: a set
// function over the runner's query statistics, kept for every request through its chunked
// prefill) on real tensors: on every eviction step the runner is asked for every live token (the
// prompt at the prefill, then the budget plus the new token), and naive and vtoken (which
// relocates the rows) give the same tokens. layer_union reads expected_attention per layer (a
// view: one column per layer of the model).
TEST(TorchRuntimeTest, RelativeTokenSignalsAreReadForEveryLiveTokenWhenThePolicyEvicts) {
  const std::vector<engine::Request> requests = Requests(4, 150, 12);
  std::vector<std::vector<int32_t>> expected_attention;
  for (const char* policy : {"keydiff", "expected_attention", "layer_union"}) {
    std::vector<std::vector<int32_t>> first;
    for (const Mode mode : {Mode::kNaive, Mode::kVtoken}) {
      SCOPED_TRACE(std::string(policy) + " " + ModeName(mode));
      engine::EngineOptions o = test_configs::H2oEngineOptions(mode, 160, 48);
      o.policy = policy;
      o.evictor.num_layers = static_cast<int32_t>(SmallConfig().num_hidden_layers);
      o.evictor.num_kv_heads = static_cast<int32_t>(SmallConfig().num_key_value_heads);
      // The prefill's live tokens, then budget + 1 at each observed decode step.
      const double keep = o.evictor.keep_ratio;
      const std::vector<std::vector<int32_t>> outputs =
          ExpectSignalSlots(o, requests, [keep](int64_t prompt, int64_t out) {
            const auto budget = static_cast<int64_t>(keep * static_cast<double>(prompt));
            return prompt + (out - 1) * (budget + 1);
          });
      if (first.empty()) first = outputs;
      EXPECT_EQ(outputs, first);
    }
    if (std::string(policy) == "expected_attention") expected_attention = first;
    if (std::string(policy) == "layer_union") EXPECT_NE(first, expected_attention);
  }
}

// Reads attn (the engine's: at the prefill, the last obs_window prompt queries' attention averaged
// over layers and query heads) and window_attention (the runner's window of the last 32 queries,
// from the cache) and records, on each sequence's prefill step, how far apart they are.
class ComparesWindowWithAttn final : public Policy {
 public:
  uint8_t signals() const override { return kAttnSignal; }
  std::vector<std::string> token_signals() const override { return {"window_attention"}; }
  void Score(std::span<const TokenView> tokens, PolicyContext& ctx,
             std::span<float> scores) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      scores[i] = tokens[i].attn;
      if (ctx.step != 0) continue;
      const float gap = std::abs(tokens[i].attn - tokens[i].token_signals[0]);
      float seen = max_gap.load();
      while (gap > seen && !max_gap.compare_exchange_weak(seen, gap)) {
      }
      compared.fetch_add(1);
    }
  }
  static inline std::atomic<float> max_gap{0.0f};
  static inline std::atomic<int64_t> compared{0};
};
VTOKEN_REGISTER_POLICY(ComparesWindowWithAttn, "test_window_vs_attn",
                       "test: attn against window_attention at the prefill");

// window_attention at a whole prefill is the attention pass's attn over the last 32 queries (the
// engine's obs_window): the same attention, one read from the cache at scoring time.
TEST(TorchRuntimeTest, WindowAttentionIsTheObservationWindowsAttention) {
  const std::vector<engine::Request> requests = Requests(3, 150, 4);
  engine::EngineOptions o = test_configs::H2oEngineOptions(Mode::kNaive, 160, 400);
  o.policy = "test_window_vs_attn";
  ASSERT_EQ(o.obs_window, kQueryWindow);
  ExpectSignalSlots(o, requests, [&](int64_t prompt, int64_t out) {
    const auto budget = static_cast<int64_t>(o.evictor.keep_ratio * static_cast<double>(prompt));
    return prompt + (out - 1) * (budget + 1);
  });
  int64_t prompts = 0;  // Every prompt token and BOS, once.
  for (const engine::Request& r : requests) {
    prompts += 1 + static_cast<int64_t>(r.prompt_tokens.size());
  }
  EXPECT_EQ(ComparesWindowWithAttn::compared.load(), prompts);
  EXPECT_LT(ComparesWindowWithAttn::max_gap.load(), 2e-6f);
}

// An evictor whose KV groups span other layers than the model's cannot lay out a view's columns:
// the run is refused before it starts, naming the signal.
TEST(TorchRuntimeTest, AViewNeedsTheModelsLayers) {
  StatusOr<LlamaModel> m = LlamaModel::RandomInit(SmallConfig(), 3);
  ASSERT_TRUE(m.ok());
  StatusOr<std::unique_ptr<LlamaRunner>> runner =
      LlamaRunner::Create(*std::move(m), {.num_slots = 160 * 16});
  ASSERT_TRUE(runner.ok());
  engine::EngineOptions o = test_configs::H2oEngineOptions(Mode::kNaive, 160, 48);
  o.policy = "layer_union";  // evictor.num_layers: 1, the model has 2.
  const StatusOr<engine::EngineResult> r = engine::RunEngine(o, **runner, Requests(1, 40, 4));
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "policy layer_union reads token signal expected_attention@layer: the evictor's KV "
            "groups span 1 layer(s) of 1 KV head(s), the model's 2 of 2 (evictor num_layers / "
            "num_kv_heads)");
}

}  // namespace
}  // namespace vtoken::model
