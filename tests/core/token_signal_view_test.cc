// Token signal views (lib/core/token_signal.h, NAME@layer and NAME@head): their entries, their
// columns in the reference reduction, the evictor's layout of them (PolicyContext::token_signal)
// and layer_union, the policy that ranks a signal per layer, against a naive reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "lib/core/policy.h"
#include "lib/core/policy_evictor.h"
#include "lib/core/policy_registry.h"
#include "lib/core/token_signal.h"
#include "tests/core/policy_test_util.h"

namespace vtoken {
namespace {

using testing_util::Range;

TEST(TokenSignalViewTest, ViewsAreEntriesOfTheRegisteredSignal) {
  const TokenSignalInfo* base = *FindTokenSignal("value_norm");
  StatusOr<const TokenSignalInfo*> layer = FindTokenSignal("value_norm@layer");
  StatusOr<const TokenSignalInfo*> head = FindTokenSignal("value_norm@head");
  ASSERT_TRUE(layer.ok() && head.ok());
  EXPECT_EQ(*layer, *FindTokenSignal("value_norm@layer"));  // One entry per view, kept.
  EXPECT_EQ((*layer)->name, "value_norm@layer");
  EXPECT_EQ((*layer)->view, TokenSignalView::kLayer);
  EXPECT_EQ((*head)->view, TokenSignalView::kHead);
  EXPECT_EQ(base->view, TokenSignalView::kMean);
  EXPECT_EQ((*layer)->fn, base->fn);
  EXPECT_EQ((*layer)->source_file, base->source_file);
  EXPECT_EQ((*FindTokenSignal("expected_attention@head"))->queries, true);
  for (const TokenSignalInfo* info : RegisteredTokenSignals()) {
    EXPECT_EQ(info->name.find('@'), std::string::npos) << info->name;  // Views are not listed.
  }
  EXPECT_EQ(base->columns(30, 3), 1);
  EXPECT_EQ((*layer)->columns(30, 3), 30);
  EXPECT_EQ((*head)->columns(30, 3), 90);

  const Status suffix = FindTokenSignal("value_norm@row").status();
  EXPECT_EQ(suffix.code(), StatusCode::kNotFound);
  EXPECT_EQ(suffix.message(),
            "unknown token signal view 'value_norm@row' (views: value_norm@layer, "
            "value_norm@head)");
  const Status name = FindTokenSignal("nope@layer").status();
  EXPECT_EQ(name.code(), StatusCode::kNotFound);
  EXPECT_EQ(name.message().rfind("unknown token signal 'nope' (registered: ", 0), 0u)
      << name.message();
}

TEST(TokenSignalViewTest, GroupRowsFollowTheGranularity) {
  EXPECT_EQ(KvGroupRowsOf(Granularity::kToken, 30, 3).layers, 30);
  EXPECT_EQ(KvGroupRowsOf(Granularity::kToken, 30, 3).heads, 3);
  EXPECT_EQ(KvGroupRowsOf(Granularity::kLayer, 30, 3).layers, 1);
  EXPECT_EQ(KvGroupRowsOf(Granularity::kLayer, 30, 3).heads, 3);
  EXPECT_EQ(KvGroupRowsOf(Granularity::kHead, 30, 3).layers, 1);
  EXPECT_EQ(KvGroupRowsOf(Granularity::kHead, 30, 3).heads, 1);
  const TokenSignalInfo* infos[] = {*FindTokenSignal("value_norm"),
                                    *FindTokenSignal("value_norm@layer"),
                                    *FindTokenSignal("key_anchor_cosine@head")};
  EXPECT_EQ(TokenSignalWidth(infos, {30, 3}), 1 + 30 + 90);
  EXPECT_EQ(TokenSignalWidth(infos, {1, 1}), 3);
}

// Row r of 2 layers x 3 heads has value (r + 1, 0): L1 norm r + 1.
TEST(TokenSignalViewTest, ReductionGivesEachViewsColumns) {
  const TokenSignalInfo* l1 = *FindTokenSignal("value_l1_norm");
  const TokenSignalInfo* fns[] = {*FindTokenSignal("value_l1_norm@head"), l1,
                                  *FindTokenSignal("value_l1_norm@layer")};
  std::vector<float> keys(12, 0.0f), values(12, 0.0f);
  for (int r = 0; r < 6; ++r) values[2 * r] = static_cast<float>(r + 1);
  std::vector<float> out(static_cast<size_t>(TokenSignalWidth(fns, {2, 3})) + 1, -1.0f);
  ASSERT_EQ(out.size(), 6u + 1 + 2 + 1);
  ReduceTokenSignals(fns, keys.data(), values.data(), 2, 3, 2, out.data());
  const std::vector<float> want = {1, 2, 3, 4, 5, 6, 3.5f, 2, 5, -1};  // Last: untouched.
  for (size_t c = 0; c < want.size(); ++c) EXPECT_FLOAT_EQ(out[c], want[c]) << "column " << c;
  // The mean of the layer columns is the mean, up to rounding.
  EXPECT_FLOAT_EQ((out[7] + out[8]) / 2, out[6]);
}

// Reads value_norm, key_anchor_cosine@layer (relative) and value_l1_norm@head; checks each
// token's columns against the values the test gives (a function of token, signal and column).
float Given(TokenId id, size_t signal, size_t column) {
  return static_cast<float>((id * 7 + static_cast<TokenId>(signal * 100 + column * 3)) % 53);
}

class ReadsViews final : public Policy {
 public:
  std::vector<std::string> token_signals() const override {
    return {"value_norm", "key_anchor_cosine@layer", "value_l1_norm@head"};
  }
  uint8_t signals() const override { return 0; }
  void Score(std::span<const TokenView> tokens, PolicyContext& ctx,
             std::span<float> scores) const override {
    ASSERT_EQ(ctx.token_signal_offsets.size(), 4u);
    for (size_t i = 0; i < tokens.size(); ++i) {
      EXPECT_EQ(ctx.token_signal(tokens[i], 0).size(), 1u);
      EXPECT_EQ(ctx.token_signal(tokens[i], 1).size(), 3u);  // 3 layers
      EXPECT_EQ(ctx.token_signal(tokens[i], 2).size(), 6u);  // of 2 KV heads
      for (size_t j = 0; j < 3; ++j) {
        const std::span<const float> v = ctx.token_signal(tokens[i], j);
        for (size_t c = 0; c < v.size(); ++c) {
          EXPECT_EQ(v[c], Given(tokens[i].position, j, c)) << "signal " << j << " column " << c;
        }
      }
      scores[i] = ctx.token_signal(tokens[i], 1)[2];
    }
  }
};

TEST(TokenSignalViewTest, EvictorLaysOutEachViewsColumns) {
  PolicyEvictor e("views", std::make_unique<ReadsViews>(),
                  {.budget_tokens = 8, .num_layers = 3, .num_kv_heads = 2});
  EXPECT_EQ(e.absolute_width(), 1u + 6u);
  EXPECT_EQ(e.relative_width(), 3u);
  EXPECT_EQ(std::vector<int32_t>(e.token_signal_offsets().begin(), e.token_signal_offsets().end()),
            (std::vector<int32_t>{0, 1, 4, 10}));
  const std::vector<TokenId> live = Range(0, 12);
  std::vector<float> absolute, relative;
  for (const TokenId id : live) {
    absolute.push_back(Given(id, 0, 0));
    for (size_t c = 0; c < 6; ++c) absolute.push_back(Given(id, 2, c));
    for (size_t c = 0; c < 3; ++c) relative.push_back(Given(id, 1, c));
  }
  const Status short_values = e.Observe(1, live, {}, {}, std::span(absolute).first(12));
  EXPECT_EQ(short_values.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(short_values.message().find("84 values expected for 12 new tokens, got 12"),
            std::string::npos)
      << short_values.message();
  ASSERT_TRUE(e.Observe(1, live, {}, {}, absolute).ok());
  EXPECT_EQ(e.ObserveRelative(1, 0, std::span(relative).first(12)).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(e.ObserveRelative(1, 0, relative).ok());
  StatusOr<std::vector<TokenId>> victims = e.Victims(1);
  ASSERT_TRUE(victims.ok()) << victims.status().ToString();
  // Scored by the third layer's column, (7 id + 106) % 53: the four lowest.
  std::vector<TokenId> want = live;
  std::stable_sort(want.begin(), want.end(),
                   [](TokenId a, TokenId b) { return Given(a, 1, 2) < Given(b, 1, 2); });
  want.resize(4);
  std::sort(want.begin(), want.end());
  EXPECT_EQ(*victims, want);
}

// At layer granularity a group is one layer: NAME@layer has one column, NAME@head one per KV
// head; at head granularity both have one.
TEST(TokenSignalViewTest, ColumnsFollowTheGranularity) {
  for (const auto& [gran, width] :
       {std::pair{Granularity::kToken, 3u + 6u}, std::pair{Granularity::kLayer, 1u + 2u},
        std::pair{Granularity::kHead, 1u + 1u}}) {
    StatusOr<std::unique_ptr<PolicyEvictor>> e = PolicyEvictor::Create(
        "layer_union", {{"signal", "value_norm"}},
        {.budget_tokens = 8, .granularity = gran, .num_layers = 3, .num_kv_heads = 2});
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    StatusOr<std::unique_ptr<PolicyEvictor>> heads = PolicyEvictor::Create(
        "layer_union", {{"signal", "value_norm"}, {"over", "head"}},
        {.budget_tokens = 8, .granularity = gran, .num_layers = 3, .num_kv_heads = 2});
    ASSERT_TRUE(heads.ok()) << heads.status().ToString();
    EXPECT_EQ((*e)->absolute_width() + (*heads)->absolute_width(), width) << GranularityName(gran);
  }
  const Status unknown =
      PolicyEvictor::Create("layer_union", {{"signal", "nope"}}, {.budget_tokens = 8}).status();
  EXPECT_EQ(unknown.code(), StatusCode::kNotFound);
  EXPECT_EQ(unknown.message().rfind("policy layer_union reads unknown token signal 'nope'", 0), 0u)
      << unknown.message();
}

// layer_union's scores against a naive reference: a token's best rank over the columns, rank
// 1..n by value with equal values the older token first, divided by n.
TEST(TokenSignalViewTest, LayerUnionScoresTheBestRankOverTheLayers) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::unique_ptr<Policy> policy = std::move(CreatePolicy("layer_union", {})).value();
  ASSERT_EQ(policy->token_signals(), std::vector<std::string>{"expected_attention@layer"});
  for (const size_t columns : {size_t{1}, size_t{4}, size_t{30}}) {
    const size_t n = 1 + rng() % 60;
    std::vector<float> values(n * columns);
    for (float& v : values) v = static_cast<float>(rng() % 9);  // Many ties.
    std::vector<TokenView> tokens(n);
    for (size_t i = 0; i < n; ++i) {
      tokens[i].position = static_cast<TokenId>(3 * i);
      tokens[i].token_signals = std::span<const float>(values).subspan(i * columns, columns);
    }
    const std::vector<int32_t> offsets = {0, static_cast<int32_t>(columns)};
    PolicyRng prng(1);
    PolicyContext ctx{.step = 0, .budget = 1, .rng = prng, .token_signal_offsets = offsets};
    std::vector<float> scores(n, -1.0f);
    policy->Score(tokens, ctx, scores);
    for (size_t i = 0; i < n; ++i) {
      size_t best = 0;
      for (size_t c = 0; c < columns; ++c) {
        size_t rank = 1;  // Tokens ranked below i in column c, plus one.
        for (size_t k = 0; k < n; ++k) {
          const float vk = values[k * columns + c], vi = values[i * columns + c];
          rank += vk < vi || (vk == vi && k < i);
        }
        best = std::max(best, rank);
      }
      EXPECT_EQ(scores[i], static_cast<float>(best) / static_cast<float>(n))
          << "token " << i << " of " << n << ", " << columns << " columns, seed " << seed;
    }
  }
}

// Every group of every granularity takes its relative columns and is scored on them.
TEST(TokenSignalViewTest, EveryGroupTakesItsColumns) {
  for (Granularity gran : {Granularity::kToken, Granularity::kLayer, Granularity::kHead}) {
    SCOPED_TRACE(GranularityName(gran));
    StatusOr<std::unique_ptr<PolicyEvictor>> e = PolicyEvictor::Create(
        "layer_union", {{"signal", "key_anchor_cosine"}, {"over", "head"}},
        {.budget_tokens = 6, .granularity = gran, .num_layers = 3, .num_kv_heads = 2});
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    std::vector<TokenId> live = Range(0, 10);
    for (int32_t g = 0; g < NumGroups((*e)->options()); ++g) {
      ASSERT_TRUE((*e)->Observe(2, g, live, {}, {}).ok());
      std::vector<float> values(live.size() * (*e)->relative_width());
      for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 7);
      ASSERT_TRUE((*e)->ObserveRelative(2, g, values).ok());
    }
    StatusOr<std::vector<std::vector<TokenId>>> victims = (*e)->GroupVictims(2);
    ASSERT_TRUE(victims.ok()) << victims.status().ToString();
    for (const auto& v : *victims) EXPECT_EQ(v.size(), 4u);
  }
}

}  // namespace
}  // namespace vtoken
