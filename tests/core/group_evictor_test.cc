// PolicyEvictor with KV groups: per-group budgets under uniform, pyramid and adaptive allocation,
// the per-step protocol of GroupVictims, the group a policy is told, and token granularity left
// as it was.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "lib/core/budget_allocation.h"
#include "lib/core/policy_evictor.h"
#include "tests/core/policy_test_util.h"

namespace vtoken {
namespace {

using testing_util::Make;
using testing_util::Range;

constexpr int64_t kLive = 32;

EvictorOptions HeadOptions(BudgetAllocation allocation, int64_t budget) {
  return {.budget_tokens = budget,
          .granularity = Granularity::kHead,
          .num_layers = 2,
          .num_kv_heads = 2,
          .allocation = allocation};
}

// A spread-out attention: 1 + (7 i mod 13) / 13, normalised (distinct heads get distinct shifts).
std::vector<float> FlatAttn(int64_t n, int64_t shift = 0) {
  std::vector<float> a(static_cast<size_t>(n));
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    a[i] = 1.0f + static_cast<float>((i * 7 + shift) % 13) / 13.0f;
    total += a[i];
  }
  for (float& x : a) x = static_cast<float>(x / total);
  return a;
}

// Every attention on tokens 0 and 1.
std::vector<float> ConcentratedAttn(int64_t n) {
  std::vector<float> a(static_cast<size_t>(n), 0.0f);
  a[0] = a[1] = 0.5f;
  return a;
}

// Observes kLive tokens in every group of `seq` with attn[g], then returns GroupVictims.
std::vector<std::vector<TokenId>> ObserveAndEvict(PolicyEvictor& e, SeqId seq,
                                                  const std::vector<std::vector<float>>& attn) {
  const std::vector<TokenId> live = Range(0, kLive);
  const std::vector<float> norms(kLive, 1.0f);
  for (int32_t g = 0; g < static_cast<int32_t>(attn.size()); ++g) {
    const Status s = e.Observe(seq, g, live, attn[g], norms);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  StatusOr<std::vector<std::vector<TokenId>>> v = e.GroupVictims(seq);
  EXPECT_TRUE(v.ok()) << v.status().ToString();
  return v.ok() ? *v : std::vector<std::vector<TokenId>>();
}

std::vector<std::vector<float>> DistinctFlatAttn() {
  return {FlatAttn(kLive, 0), FlatAttn(kLive, 3), FlatAttn(kLive, 5), FlatAttn(kLive, 9)};
}

TEST(GroupEvictorTest, UniformKeepsTheBudgetInEveryGroup) {
  std::unique_ptr<PolicyEvictor> e = Make("h2o", HeadOptions(BudgetAllocation::kUniform, 8));
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(NumGroups(e->options()), 4);
  const std::vector<std::vector<TokenId>> victims = ObserveAndEvict(*e, 0, DistinctFlatAttn());
  ASSERT_EQ(victims.size(), 4u);
  for (int32_t g = 0; g < 4; ++g) {
    EXPECT_EQ(static_cast<int64_t>(victims[g].size()), kLive - 8) << g;
    EXPECT_EQ(*e->Budget(0, g), 8) << g;
    // H2O's recent window (half the budget) survives in every group.
    for (TokenId t : victims[g]) EXPECT_LT(t, kLive - 4) << g;
  }
  // Different signals, different victims.
  EXPECT_NE(victims[0], victims[1]);
  EXPECT_EQ(e->Budget(0, 4).status().code(), StatusCode::kNotFound);
}

TEST(GroupEvictorTest, PyramidKeepsEachLayersBudgetInBothHeads) {
  for (const auto& [budget, beta] : {std::pair<int64_t, double>{10, 2.0}, {8, 20.0}, {16, 5.0}}) {
    SCOPED_TRACE("budget " + std::to_string(budget) + " beta " + std::to_string(beta));
    EvictorOptions o = HeadOptions(BudgetAllocation::kPyramid, budget);
    o.pyramid_beta = beta;
    std::unique_ptr<PolicyEvictor> e = Make("h2o", o);
    ASSERT_NE(e, nullptr);
    const std::vector<int64_t> layer_budget = PyramidBudgets(budget, 2, beta);
    const std::vector<std::vector<TokenId>> victims = ObserveAndEvict(*e, 0, DistinctFlatAttn());
    ASSERT_EQ(victims.size(), 4u);
    for (int32_t g = 0; g < 4; ++g) {
      EXPECT_EQ(kLive - static_cast<int64_t>(victims[g].size()), layer_budget[g / 2]) << g;
      EXPECT_EQ(*e->Budget(0, g), layer_budget[g / 2]) << g;
    }
    EXPECT_GT(layer_budget[0], layer_budget[1]);
  }
  // Layer granularity: group = layer.
  EvictorOptions o = HeadOptions(BudgetAllocation::kPyramid, 10);
  o.granularity = Granularity::kLayer;
  o.pyramid_beta = 2;
  std::unique_ptr<PolicyEvictor> e = Make("h2o", o);
  ASSERT_NE(e, nullptr);
  const std::vector<std::vector<TokenId>> victims =
      ObserveAndEvict(*e, 0, {FlatAttn(kLive), FlatAttn(kLive, 1)});
  ASSERT_EQ(victims.size(), 2u);
  EXPECT_EQ(kLive - static_cast<int64_t>(victims[0].size()), 15);
  EXPECT_EQ(kLive - static_cast<int64_t>(victims[1].size()), 5);
}

TEST(GroupEvictorTest, AdaptiveSharesALayersBudgetByItsHeadsSignals) {
  // Budget 8 per head, floor 0.2 * 8 = 1. H2O scores the last 4 tokens +inf. Layer 0: head 0's
  // attention is all on tokens 0 and 1, head 1's is spread. Of the layer's 16: the floors (an inf
  // each), the other 6 infs, head 0's two heavy tokens, then 6 of head 1's spread tokens
  // (head 0's others are 0): head 0 keeps 6, head 1 keeps 10. Layer 1's heads are identical and
  // split 8 / 8.
  std::unique_ptr<PolicyEvictor> e = Make("h2o", HeadOptions(BudgetAllocation::kAdaptive, 8));
  ASSERT_NE(e, nullptr);
  const std::vector<std::vector<TokenId>> victims = ObserveAndEvict(
      *e, 0, {ConcentratedAttn(kLive), FlatAttn(kLive), FlatAttn(kLive), FlatAttn(kLive)});
  ASSERT_EQ(victims.size(), 4u);
  std::vector<int64_t> kept(4);
  for (int32_t g = 0; g < 4; ++g) kept[g] = kLive - static_cast<int64_t>(victims[g].size());
  EXPECT_EQ(kept, (std::vector<int64_t>{6, 10, 8, 8}));
  EXPECT_EQ(kept[0] + kept[1], 2 * 8);
  EXPECT_EQ(kept[2] + kept[3], 2 * 8);
  // Head 0 keeps exactly its heavy hitters and the recent window.
  std::vector<TokenId> expected_victims = Range(2, kLive - 4);
  EXPECT_EQ(victims[0], expected_victims);
  for (int32_t g = 0; g < 4; ++g) EXPECT_EQ(*e->Budget(0, g), 8) << g;
}

TEST(GroupEvictorTest, VictimsWithSeveralGroupsIsFailedPrecondition) {
  std::unique_ptr<PolicyEvictor> e = Make("h2o", HeadOptions(BudgetAllocation::kUniform, 8));
  ASSERT_NE(e, nullptr);
  const std::vector<TokenId> live = Range(0, kLive);
  const std::vector<float> norms(kLive, 1.0f);
  ASSERT_TRUE(e->Observe(0, 0, live, FlatAttn(kLive), norms).ok());
  EXPECT_EQ(e->Victims(0).status().code(), StatusCode::kFailedPrecondition);
}

TEST(GroupEvictorTest, GroupVictimsNeedsEveryGroupObservedThisStep) {
  std::unique_ptr<PolicyEvictor> e = Make("h2o", HeadOptions(BudgetAllocation::kUniform, 8));
  ASSERT_NE(e, nullptr);
  const std::vector<TokenId> live = Range(0, kLive);
  const std::vector<float> norms(kLive, 1.0f);
  const std::vector<float> attn = FlatAttn(kLive);
  EXPECT_EQ(e->GroupVictims(0).status().code(), StatusCode::kNotFound);
  for (int32_t g = 0; g < 3; ++g) ASSERT_TRUE(e->Observe(0, g, live, attn, norms).ok());
  EXPECT_EQ(e->GroupVictims(0).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(e->Observe(0, 3, live, attn, norms).ok());
  StatusOr<std::vector<std::vector<TokenId>>> v = e->GroupVictims(0);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  // Next step: only group 2 observed.
  std::vector<TokenId> after;
  for (TokenId t : live) {
    if (!std::binary_search((*v)[2].begin(), (*v)[2].end(), t)) after.push_back(t);
  }
  ASSERT_TRUE(e->Observe(0, 2, after, FlatAttn(static_cast<int64_t>(after.size())),
                         std::vector<float>(after.size(), 1.0f))
                  .ok());
  EXPECT_EQ(e->GroupVictims(0).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(e->Observe(0, 4, live, attn, norms).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->Observe(0, -1, live, attn, norms).code(), StatusCode::kInvalidArgument);
}

TEST(GroupEvictorTest, ValidateRejectsAllocationsTheGranularityCannotExpress) {
  struct Case {
    Granularity granularity;
    BudgetAllocation allocation;
    bool ok;
  };
  for (const Case& c : {Case{Granularity::kToken, BudgetAllocation::kUniform, true},
                        Case{Granularity::kToken, BudgetAllocation::kPyramid, false},
                        Case{Granularity::kToken, BudgetAllocation::kAdaptive, false},
                        Case{Granularity::kLayer, BudgetAllocation::kUniform, true},
                        Case{Granularity::kLayer, BudgetAllocation::kPyramid, true},
                        Case{Granularity::kLayer, BudgetAllocation::kAdaptive, false},
                        Case{Granularity::kHead, BudgetAllocation::kUniform, true},
                        Case{Granularity::kHead, BudgetAllocation::kPyramid, true},
                        Case{Granularity::kHead, BudgetAllocation::kAdaptive, true}}) {
    EvictorOptions o = HeadOptions(c.allocation, 8);
    o.granularity = c.granularity;
    SCOPED_TRACE(std::string(GranularityName(c.granularity)) + " / " +
                 BudgetAllocationName(c.allocation));
    const Status s = ValidateEvictorOptions(o);
    if (c.ok) {
      EXPECT_TRUE(s.ok()) << s.ToString();
    } else {
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
      EXPECT_NE(s.message().find(BudgetAllocationName(c.allocation)), std::string::npos)
          << s.message();
      EXPECT_EQ(PolicyEvictor::Create("h2o", {}, o).status().code(), StatusCode::kInvalidArgument);
    }
  }
  EvictorOptions o = HeadOptions(BudgetAllocation::kPyramid, 8);
  o.pyramid_beta = 0.5;
  EXPECT_EQ(ValidateEvictorOptions(o).code(), StatusCode::kInvalidArgument);
  o = HeadOptions(BudgetAllocation::kAdaptive, 8);
  o.adaptive_floor = 1.5;
  EXPECT_EQ(ValidateEvictorOptions(o).code(), StatusCode::kInvalidArgument);
}

// Records (what, ctx.group, ctx.budget) of every Observe ('o') and Score ('s') call; scores by
// position so the oldest tokens go.
struct Call {
  char what;
  int32_t group;
  int64_t budget;
  bool operator==(const Call&) const = default;
};

class GroupRecorder final : public Policy {
 public:
  explicit GroupRecorder(std::vector<Call>* calls) : calls_(calls) {}
  int32_t state_size() const override { return 1; }  // Observe runs for a policy with state.
  void Observe(std::span<const TokenView>, PolicyContext& ctx) const override {
    calls_->push_back({'o', ctx.group, ctx.budget});
  }
  void Score(std::span<const TokenView> tokens, PolicyContext& ctx,
             std::span<float> scores) const override {
    calls_->push_back({'s', ctx.group, ctx.budget});
    for (size_t i = 0; i < tokens.size(); ++i) scores[i] = static_cast<float>(tokens[i].position);
  }

 private:
  std::vector<Call>* calls_;
};

TEST(GroupEvictorTest, PolicySeesTheGroupItScores) {
  for (BudgetAllocation allocation :
       {BudgetAllocation::kUniform, BudgetAllocation::kPyramid, BudgetAllocation::kAdaptive}) {
    SCOPED_TRACE(BudgetAllocationName(allocation));
    std::vector<Call> calls;
    EvictorOptions o = HeadOptions(allocation, 4);
    o.pyramid_beta = 2;  // Layer budgets 6 and 2.
    PolicyEvictor e("recorder", std::make_unique<GroupRecorder>(&calls), o);
    const std::vector<TokenId> live = Range(0, 12);
    const std::vector<float> attn(12, 1.0f / 12), norms(12, 1.0f);
    for (int32_t g : {3, 1, 0, 2}) ASSERT_TRUE(e.Observe(5, g, live, attn, norms).ok());
    StatusOr<std::vector<std::vector<TokenId>>> v = e.GroupVictims(5);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    const int64_t b0 = allocation == BudgetAllocation::kPyramid ? 6 : 4;
    const int64_t b1 = allocation == BudgetAllocation::kPyramid ? 2 : 4;
    EXPECT_EQ(calls, (std::vector<Call>{{'o', 3, b1},
                                        {'o', 1, b0},
                                        {'o', 0, b0},
                                        {'o', 2, b1},
                                        {'s', 0, b0},
                                        {'s', 1, b0},
                                        {'s', 2, b1},
                                        {'s', 3, b1}}));
    // Scores by position: the oldest go first.
    EXPECT_EQ((*v)[0].front(), 0);
  }
}

// Two evictors fed the same observations, one asked through Victims, the other through
// GroupVictims, choose the same victims at token granularity.
TEST(GroupEvictorTest, TokenGranularityVictimsMatchGroupZero) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const std::string policy : {"h2o", "random", "snapkv", "tova"}) {
    SCOPED_TRACE(policy);
    const EvictorOptions o{.budget_tokens = 16, .num_sink = 1, .num_recent = 2, .seed = seed};
    std::unique_ptr<PolicyEvictor> a = Make(policy, o);
    std::unique_ptr<PolicyEvictor> b = Make(policy, o);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(NumGroups(a->options()), 1);
    std::mt19937_64 rng(seed);
    std::vector<TokenId> live = Range(0, 40);
    TokenId next = 40;
    int64_t evicted = 0;
    for (int step = 0; step < 30; ++step) {
      std::vector<float> attn(live.size()), norms(live.size());
      for (size_t i = 0; i < live.size(); ++i) {
        attn[i] = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
        norms[i] = std::uniform_real_distribution<float>(1.0f, 3.0f)(rng);
      }
      ASSERT_TRUE(a->Observe(7, live, attn, norms).ok());
      ASSERT_TRUE(b->Observe(7, 0, live, attn, norms).ok());
      StatusOr<std::vector<TokenId>> va = a->Victims(7);
      StatusOr<std::vector<std::vector<TokenId>>> vb = b->GroupVictims(7);
      ASSERT_TRUE(va.ok()) << va.status().ToString();
      ASSERT_TRUE(vb.ok()) << vb.status().ToString();
      ASSERT_EQ(vb->size(), 1u);
      EXPECT_EQ(*va, (*vb)[0]) << "step " << step;
      evicted += static_cast<int64_t>(va->size());
      std::vector<TokenId> kept;
      for (TokenId t : live) {
        if (!std::binary_search(va->begin(), va->end(), t)) kept.push_back(t);
      }
      kept.push_back(next++);
      live = std::move(kept);
    }
    EXPECT_GT(evicted, 24);  // The prefill's 24 and then one per step.
    EXPECT_EQ(*a->Budget(7), *b->Budget(7, 0));
  }
}

}  // namespace
}  // namespace vtoken
