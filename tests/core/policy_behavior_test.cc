// Each policy's rule, shown with crafted signals: what it keeps and what it lets go.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <set>

#include "lib/core/policy_evictor.h"
#include "lib/core/token_signal.h"
#include "tests/core/policy_test_util.h"

namespace vtoken {
namespace {

using testing_util::Make;
using testing_util::Range;

// Observes one step and returns the victims.
std::vector<TokenId> Step(PolicyEvictor& e, SeqId seq, const std::vector<TokenId>& live,
                          const std::vector<float>& attn, std::vector<float> norm = {}) {
  if (norm.empty()) norm.assign(live.size(), 1.0f);
  Status s = e.Observe(seq, live, attn, norm);
  EXPECT_TRUE(s.ok()) << s.ToString();
  StatusOr<std::vector<TokenId>> v = e.Victims(seq);
  EXPECT_TRUE(v.ok()) << v.status().ToString();
  return v.ok() ? *v : std::vector<TokenId>{};
}

// Live minus victims.
std::vector<TokenId> Kept(const std::vector<TokenId>& live, const std::vector<TokenId>& victims) {
  std::vector<TokenId> kept;
  std::set_difference(live.begin(), live.end(), victims.begin(), victims.end(),
                      std::back_inserter(kept));
  return kept;
}

TEST(H2OTest, KeepsTheHeavyHittersAndTheRecentWindow) {
  // Budget 8, recent_ratio 0.5: the 4 newest tokens plus the 4 heaviest of the rest.
  std::unique_ptr<PolicyEvictor> e = Make("h2o", {.budget_tokens = 8});
  std::vector<float> attn(20, 0.4f / 16);
  for (int t : {2, 5, 9, 11}) attn[t] = 0.15f;
  const std::vector<TokenId> live = Range(0, 20);
  EXPECT_EQ(Kept(live, Step(*e, 1, live, attn)),
            (std::vector<TokenId>{2, 5, 9, 11, 16, 17, 18, 19}));
}

// Token 0 drew most attention at step 0 and little at step 1: H2O (accumulated) keeps it, TOVA
// (last step only) drops it.
void TwoSteps(PolicyEvictor& e, std::vector<TokenId>* victims) {
  EXPECT_TRUE(Step(e, 1, Range(0, 4), {0.7f, 0.1f, 0.1f, 0.1f}).empty());
  *victims = Step(e, 1, Range(0, 5), {0.05f, 0.3f, 0.2f, 0.25f, 0.2f});
  // attn_sum after step 1: 0.75, 0.4, 0.3, 0.35, 0.2.
}

TEST(H2OTest, RanksByAccumulatedAttention) {
  std::vector<TokenId> victims;
  TwoSteps(*Make("h2o", {.budget_tokens = 4}, {{"recent_ratio", 0.0}}), &victims);
  EXPECT_EQ(victims, (std::vector<TokenId>{4}));
  TwoSteps(*Make("h2o", {.budget_tokens = 4}), &victims);  // Tokens 3 and 4 are recent.
  EXPECT_EQ(victims, (std::vector<TokenId>{2}));
}

// VATP weighs H2O's accumulated attention by the value's L1 norm (the token signal
// value_l1_norm, given once per token when it is first observed).
TEST(VatpTest, WeighsAccumulatedAttentionByTheValueNorm) {
  std::unique_ptr<PolicyEvictor> e = Make("vatp", {.budget_tokens = 4}, {{"recent_ratio", 0.0}});
  ASSERT_NE(e, nullptr);
  ASSERT_EQ(e->token_signals().size(), 1u);
  EXPECT_EQ(e->token_signals()[0]->name, "value_l1_norm");
  // Step 0: tokens 0..3 (no eviction, 4 live). Token 0 draws most attention but its value is
  // tiny; token 2's value is large.
  const std::vector<float> norms0 = {0.1f, 1.0f, 4.0f, 1.0f}, attn0 = {0.7f, 0.1f, 0.1f, 0.1f};
  const std::vector<float> ones(5, 1.0f), attn1 = {0.05f, 0.3f, 0.2f, 0.25f, 0.2f};
  ASSERT_TRUE(e->Observe(1, Range(0, 4), attn0, std::span(ones).first(4), norms0).ok());
  ASSERT_TRUE(e->Victims(1)->empty());
  // Step 1: token 4 arrives with its value norm alone (the others' were given at step 0).
  // attn_sum: 0.75, 0.4, 0.3, 0.35, 0.2; times the norms: 0.075, 0.4, 1.2, 0.35, 0.2.
  const std::vector<float> norm4 = {1.0f};
  ASSERT_TRUE(e->Observe(1, Range(0, 5), attn1, ones, norm4).ok());
  EXPECT_EQ(*e->Victims(1), (std::vector<TokenId>{0}));  // H2O would drop token 4.
  // Token signals are given for new tokens only: values for old ones are refused.
  const std::vector<float> too_many = {1.0f, 1.0f};
  const Status wrong = e->Observe(1, Range(1, 6), attn1, ones, too_many);
  EXPECT_EQ(wrong.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.message().find("value_l1_norm): 1 values expected for 1 new tokens, got 2"),
            std::string::npos)
      << wrong.ToString();
}

// KeyDiff keeps the keys least like the others: with most keys along x, the budget goes to the
// odd ones out; and the anchor moves with the live set: once the x keys are gone, a new x key is
// no longer the most alike (under the first step's anchor it would be).
TEST(KeyDiffTest, EvictsTheKeysMostSimilarToTheMeanUnitKey) {
  std::unique_ptr<PolicyEvictor> e = Make("keydiff", {.budget_tokens = 3});
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->signals(), 0);  // Query-agnostic: no attention is computed for it.
  ASSERT_EQ(e->relative_token_signals().size(), 1u);
  ASSERT_TRUE(e->absolute_token_signals().empty());
  // One KV row of 2 floats per token: the cosine to the mean unit key, as the runner computes it.
  auto cosines = [&](const std::vector<float>& keys) {
    const int64_t n = static_cast<int64_t>(keys.size() / 2);
    const std::vector<float> anchors =
        TokenSignalAnchors(e->relative_token_signals(), keys.data(), keys.data(), n, 1, 2);
    std::vector<float> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      ReduceTokenSignals(e->relative_token_signals(), keys.data() + 2 * i, keys.data() + 2 * i, 1,
                         1, 2, &out[static_cast<size_t>(i)], anchors.data());
    }
    return out;
  };
  // t0: x, t1: y, t2: x, t3: about -y, t4: x, t5: x + y. Cosines 0.98, 0.19, 0.99, -0.38, 0.96,
  // 0.83.
  const std::vector<float> keys = {1, 0, 0, 1, 2, 0.1f, -0.2f, -1, 1, -0.1f, 1, 1};
  ASSERT_TRUE(e->Observe(1, Range(0, 6), {}, {}).ok());
  ASSERT_TRUE(e->ObserveRelative(1, 0, cosines(keys)).ok());
  EXPECT_EQ(*e->Victims(1), (std::vector<TokenId>{0, 2, 4}));  // The x keys.
  // Step 1: tokens 1, 3, 5 and a new x key 6. Cosines 0.43, -0.60, 0.94, 0.90: token 5 goes.
  const std::vector<float> keys1 = {0, 1, -0.2f, -1, 1, 1, 1, 0};
  ASSERT_TRUE(e->ObserveAppended(1, 0, std::vector<TokenId>{6}).ok());
  const std::vector<float> c = cosines(keys1);
  EXPECT_GT(c[2], c[3]);
  ASSERT_TRUE(e->ObserveRelative(1, 0, c).ok());
  EXPECT_EQ(*e->Victims(1), (std::vector<TokenId>{5}));
}

TEST(TovaTest, KeepsTheTopAttentionOfTheLastStep) {
  std::vector<TokenId> victims;
  TwoSteps(*Make("tova", {.budget_tokens = 4}), &victims);
  EXPECT_EQ(victims, (std::vector<TokenId>{0}));
  std::unique_ptr<PolicyEvictor> e = Make("tova", {.budget_tokens = 3});
  EXPECT_EQ(Kept(Range(0, 8),
                 Step(*e, 1, Range(0, 8), {0.05f, 0.2f, 0.05f, 0.3f, 0.05f, 0.05f, 0.25f, 0.05f})),
            (std::vector<TokenId>{1, 3, 6}));
}

TEST(StreamingLlmTest, KeepsExactlyTheSinksAndTheRecentWindow) {
  std::mt19937 rng(11);
  std::unique_ptr<PolicyEvictor> e = Make("streaming_llm", {.budget_tokens = 10});
  std::vector<TokenId> live = Range(0, 30);
  for (TokenId next = 30; next < 40; ++next) {
    std::vector<float> attn(live.size());
    for (float& a : attn) a = static_cast<float>(rng() % 100) / 100.0f;
    const std::vector<TokenId> kept = Kept(live, Step(*e, 1, live, attn));
    std::vector<TokenId> expected = {0, 1, 2, 3};
    for (TokenId t = next - 6; t < next; ++t) expected.push_back(t);
    ASSERT_EQ(kept, expected) << "after token " << next - 1;
    live = kept;
    live.push_back(next);
  }
}

TEST(ScissorhandsTest, KeepsPersistentTokensOverAOneOffSpike) {
  // Prompt 0..7 fits the budget; tokens 8..11 arrive at steps 1..4; eviction at step 4. Token 2
  // spikes at step 0 (0.6) and is ignored after; the rest stay above average from step 1 on.
  const RawParams params = {{"recent_window", int64_t{0}}, {"history_window", int64_t{8}}};
  const EvictorOptions options{.budget_tokens = 8, .evict_interval = 4};
  std::unique_ptr<PolicyEvictor> scissorhands = Make("scissorhands", options, params);
  std::unique_ptr<PolicyEvictor> h2o = Make("h2o", options, {{"recent_ratio", 0.0}});
  std::vector<TokenId> victims_s, victims_h;
  for (int step = 0; step <= 4; ++step) {
    const std::vector<TokenId> live = Range(0, 8 + step);
    std::vector<float> attn(live.size());
    for (size_t i = 0; i < live.size(); ++i) {
      attn[i] = step == 0 ? (i == 2 ? 0.6f : 0.4f / 7) : (i == 2 ? 0.001f : 0.999f / (7 + step));
    }
    victims_s = Step(*scissorhands, 1, live, attn);
    victims_h = Step(*h2o, 1, live, attn);
    if (step < 4) ASSERT_TRUE(victims_s.empty() && victims_h.empty());
  }
  // Hits: token 2 one; persistent prompt tokens four; new tokens 8..11: four, three, two, one.
  EXPECT_EQ(victims_s, (std::vector<TokenId>{2, 9, 10, 11}));
  // H2O ranks by accumulated attention, where the spike (0.6) beats every other token.
  EXPECT_EQ(std::count(victims_h.begin(), victims_h.end(), 2), 0);
}

TEST(SnapKvTest, PoolingKeepsTheNeighboursOfHighAttentionTokens) {
  // Window 1 (only the newest token is protected), kernel 5: each peak keeps itself and two
  // neighbours on each side.
  std::vector<float> attn(30, 0.005f);
  for (size_t i = 0; i < attn.size(); ++i) attn[i] += 0.0001f * static_cast<float>(i % 7);
  attn[10] = 0.5f;
  attn[20] = 0.3f;
  const std::vector<TokenId> live = Range(0, 30);
  const std::vector<TokenId> expected = {8, 9, 10, 11, 12, 18, 19, 20, 21, 22, 29};
  for (const char* pooling : {"max", "avg"}) {
    std::unique_ptr<PolicyEvictor> e =
        Make("snapkv", {.budget_tokens = 11}, {{"window", int64_t{1}}, {"pooling", pooling}});
    EXPECT_EQ(Kept(live, Step(*e, 1, live, attn)), expected) << pooling;
  }
  // Without pooling (kernel 1) the neighbours go: only raw attention counts.
  std::unique_ptr<PolicyEvictor> raw =
      Make("snapkv", {.budget_tokens = 11}, {{"window", int64_t{1}}, {"kernel", int64_t{1}}});
  const std::vector<TokenId> kept = Kept(live, Step(*raw, 1, live, attn));
  EXPECT_EQ(std::count(kept.begin(), kept.end(), 9), 0);
  EXPECT_EQ(std::count(kept.begin(), kept.end(), 10), 1);
}

TEST(SnapKvTest, KeepsTheObservationWindow) {
  std::vector<float> attn(20, 0.0f);
  attn[0] = 1.0f;
  std::unique_ptr<PolicyEvictor> e =
      Make("snapkv", {.budget_tokens = 5}, {{"window", int64_t{4}}, {"kernel", int64_t{1}}});
  EXPECT_EQ(Kept(Range(0, 20), Step(*e, 1, Range(0, 20), attn)),
            (std::vector<TokenId>{0, 16, 17, 18, 19}));
}

TEST(KNormTest, KeepsTheLowestKeyNorms) {
  std::unique_ptr<PolicyEvictor> e = Make("knorm", {.budget_tokens = 3});
  const std::vector<float> attn(8, 0.125f);
  const std::vector<float> norm = {2.0f, 0.5f, 3.0f, 1.5f, 0.7f, 2.5f, 0.9f, 1.1f};
  EXPECT_EQ(Kept(Range(0, 8), Step(*e, 1, Range(0, 8), attn, norm)),
            (std::vector<TokenId>{1, 4, 6}));
}

TEST(DecayedAttentionTest, ForgetsOldAttention) {
  // Token 0 had a big spike long ago; token 1 gets steady moderate attention. With decay 0.5
  // the spike fades and token 1 wins; with decay 1 (H2O's sum) the spike still wins.
  for (double decay : {0.5, 1.0}) {
    std::unique_ptr<PolicyEvictor> e =
        Make("decayed_attention", {.budget_tokens = 2, .evict_interval = 5}, {{"decay", decay}});
    std::vector<TokenId> victims;
    for (int step = 0; step <= 5; ++step) {
      const std::vector<TokenId> live = Range(0, step == 5 ? 3 : 2);
      std::vector<float> attn =
          step == 0 ? std::vector<float>{0.9f, 0.1f} : std::vector<float>{0.05f, 0.35f, 0.6f};
      attn.resize(live.size());
      victims = Step(*e, 1, live, attn);
    }
    // After step 5: decay 0.5 -> token 0 0.125, token 1 0.68, token 2 0.6: token 0 goes.
    // decay 1 -> token 0 1.15, token 1 1.85, token 2 0.6: token 2 goes.
    EXPECT_EQ(victims, (std::vector<TokenId>{decay < 1 ? 0 : 2})) << "decay " << decay;
  }
}

TEST(RandomTest, ReproduciblePerSeedAndDifferentAcrossSeeds) {
  const std::vector<float> attn(40, 0.025f);
  const auto run = [&](uint64_t seed) {
    return Step(*Make("random", {.budget_tokens = 10, .seed = seed}), 1, Range(0, 40), attn);
  };
  EXPECT_EQ(run(7), run(7));
  EXPECT_NE(run(7), run(8));
  EXPECT_NE(run(7), (std::vector<TokenId>(Range(0, 30))));  // Not the tie-break order.
}

TEST(RandomTest, KeepsEveryPositionAboutEquallyOften) {
  // 2000 sequences of 20 tokens, budget 10: each position is kept with probability 1/2. Pearson
  // statistic with the hypergeometric variance correction, 19 degrees of freedom: mean 19, and
  // above 50 with probability below 1e-4.
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::unique_ptr<PolicyEvictor> e = Make("random", {.budget_tokens = 10, .seed = seed});
  const int trials = 2000, n = 20;
  std::vector<int> kept(n, 0);
  const std::vector<float> attn(n, 1.0f / n);
  for (SeqId seq = 0; seq < trials; ++seq) {
    for (TokenId t : Kept(Range(0, n), Step(*e, seq, Range(0, n), attn))) ++kept[t];
  }
  const double expected = trials * 0.5;
  const double variance = trials * 0.25 * n / (n - 1);
  double chi2 = 0;
  for (int count : kept) chi2 += (count - expected) * (count - expected) / variance;
  EXPECT_LT(chi2, 50.0) << "seed " << seed;
}

}  // namespace
}  // namespace vtoken
