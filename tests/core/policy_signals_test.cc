// Policy::signals() is honest for every registered policy: over many steps of random signals, a
// policy given only the signals it declares (the others zero, as the model leaves them) keeps
// exactly the state and gives exactly the scores it gives with every signal. A policy that reads
// a signal it did not declare fails here. And the evictor that asks for signals only on the steps
// whose signals a policy reads (PolicyEvictor::SignalsWanted) picks the victims it picks with
// signals on every step. The list of policies comes from the registry.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "lib/core/policy.h"
#include "lib/core/policy_evictor.h"
#include "lib/core/policy_registry.h"
#include "lib/core/token_signal.h"
#include "tests/core/policy_test_util.h"

namespace vtoken {
namespace {

using testing_util::GiveRelativeValues;
using testing_util::TokenValueFor;
using testing_util::UnseenTokenValues;

TEST(PolicySignalsTest, EveryPolicyScoresTheSameWithOnlyTheSignalsItDeclares) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  for (const PolicyInfo* info : RegisteredPolicies()) {
    SCOPED_TRACE(info->name + ", seed " + std::to_string(seed));
    StatusOr<std::unique_ptr<Policy>> policy = CreatePolicy(info->name, {});
    ASSERT_TRUE(policy.ok()) << policy.status().ToString();
    const Policy& p = **policy;
    const uint8_t declared = p.signals();
    ASSERT_EQ(declared & ~kAllSignals, 0) << "unknown signal bits";
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
    constexpr size_t kTokens = 48;
    const size_t state_size = static_cast<size_t>(p.state_size());
    // Two copies of every token's signals and state: `full` sees every signal, `declared` only
    // the declared ones.
    std::vector<float> full_state(kTokens * state_size, 0.0f), declared_state(full_state);
    std::vector<float> attn_sum(kTokens, 0.0f);
    // The token signals it names, fixed per token (the same in both copies: it reads them all);
    // a view (NAME@layer, NAME@head) has 3 columns, as in a group of 3 layers of one KV head.
    std::vector<int32_t> offsets{0};
    for (const std::string& name : p.token_signals()) {
      offsets.push_back(offsets.back() + (name.find('@') == std::string::npos ? 1 : 3));
    }
    const auto nv = static_cast<size_t>(offsets.back());
    std::vector<float> token_values(kTokens * nv);
    for (size_t i = 0; i < kTokens; ++i) {
      for (size_t j = 0; j < nv; ++j) token_values[i * nv + j] = TokenValueFor(i, j);
    }
    PolicyRng full_rng(seed), declared_rng(seed);
    for (int64_t step = 0; step < 12; ++step) {
      std::vector<TokenView> full(kTokens), only(kTokens);
      for (size_t i = 0; i < kTokens; ++i) {
        const float attn = uniform(rng) / kTokens;
        attn_sum[i] += attn;
        const float norm = 1.0f + 4.0f * uniform(rng);
        full[i] = {.position = static_cast<TokenId>(i),
                   .age = step,
                   .attn = attn,
                   .attn_sum = attn_sum[i],
                   .key_norm = norm,
                   .state = std::span<float>(full_state).subspan(i * state_size, state_size),
                   .token_signals = std::span<const float>(token_values).subspan(i * nv, nv)};
        only[i] = full[i];
        if (!(declared & kAttnSignal)) only[i].attn = 0;
        if (!(declared & kAttnSumSignal)) only[i].attn_sum = 0;
        if (!(declared & kKeyNormSignal)) only[i].key_norm = 0;
        only[i].state = std::span<float>(declared_state).subspan(i * state_size, state_size);
      }
      PolicyContext full_ctx{
          .step = step, .budget = 16, .rng = full_rng, .token_signal_offsets = offsets};
      PolicyContext only_ctx{
          .step = step, .budget = 16, .rng = declared_rng, .token_signal_offsets = offsets};
      p.Observe(full, full_ctx);
      p.Observe(only, only_ctx);
      ASSERT_EQ(full_state, declared_state) << "state differs at step " << step;
      std::vector<float> full_scores(kTokens), only_scores(kTokens);
      p.Score(full, full_ctx, full_scores);
      p.Score(only, only_ctx, only_scores);
      for (size_t i = 0; i < kTokens; ++i) {
        // NaN scores count as lowest: equal when both are NaN.
        if (std::isnan(full_scores[i]) && std::isnan(only_scores[i])) continue;
        ASSERT_EQ(full_scores[i], only_scores[i]) << "token " << i << " at step " << step;
      }
    }
  }
}

// The declarations themselves: a policy that scores by attention declares it, and one that needs
// no signal declares none (so the model skips that work for it).
TEST(PolicySignalsTest, DeclarationsOfTheBundledPolicies) {
  auto signals = [](const char* name) {
    StatusOr<std::unique_ptr<Policy>> p = CreatePolicy(name, {});
    EXPECT_TRUE(p.ok()) << name;
    return p.ok() ? (*p)->signals() : uint8_t{0xff};
  };
  EXPECT_EQ(signals("h2o"), kAttnSumSignal);
  EXPECT_EQ(signals("tova"), kAttnSignal);
  EXPECT_EQ(signals("knorm"), kKeyNormSignal);
  EXPECT_EQ(signals("streaming_llm"), 0);
  EXPECT_EQ(signals("random"), 0);
  EXPECT_EQ(signals("keydiff"), 0);
}

}  // namespace
}  // namespace vtoken

namespace vtoken {
namespace {

// One sequence decoding under two evictors of the same policy: `eager` is given signals on every
// step, `lazy` only when SignalsWanted says the step's signals are read (else the live tokens
// alone, or only the step's new token: ObserveAppended, each on alternate steps). The victims
// must be the same on every step, and lazy must be asked for signals on every step exactly when
// the policy reads signals every step (ReadsSignalsEveryStep), else only on its eviction steps.
void ExpectLazySignalsPickTheSameVictims(const std::string& name, const EvictorOptions& options,
                                         uint64_t seed) {
  auto eager = PolicyEvictor::Create(name, {}, options);
  auto lazy = PolicyEvictor::Create(name, {}, options);
  ASSERT_TRUE(eager.ok() && lazy.ok()) << name;
  const int32_t groups = NumGroups(options);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<std::vector<TokenId>> live(static_cast<size_t>(groups));
  TokenId next = 0;
  for (; next < 96; ++next) {
    for (auto& l : live) l.push_back(next);
  }
  const bool every_step =
      ReadsSignalsEveryStep((*lazy)->signals(), CreatePolicy(name, {}).value()->state_size());
  int64_t wanted = 0;
  constexpr int64_t kSteps = 40;
  for (int64_t step = 0; step < kSteps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const bool want = (*lazy)->SignalsWanted(1);
    wanted += want;
    const bool due = step % options.evict_interval == 0;
    ASSERT_EQ(want, (*lazy)->signals() != 0 && (every_step || due));
    const bool scores = (*lazy)->ScoresNext(1);
    ASSERT_EQ(scores, due);
    for (int32_t g = 0; g < groups; ++g) {
      std::vector<float> attn(live[g].size()), norm(live[g].size());
      float total = 0;
      for (float& a : attn) total += a = uniform(rng);
      for (float& a : attn) a /= total;
      for (float& k : norm) k = 1 + 3 * uniform(rng);
      ASSERT_TRUE(
          (*eager)
              ->Observe(1, g, live[g], attn, norm, UnseenTokenValues(**eager, 1, g, live[g]))
              .ok());
      const std::vector<TokenId> appended = {live[g].back()};
      const std::vector<float> values = UnseenTokenValues(**lazy, 1, g, live[g]);
      const Status s = want            ? (*lazy)->Observe(1, g, live[g], attn, norm, values)
                       : step % 2 == 0 ? (*lazy)->Observe(1, g, live[g], {}, {}, values)
                                       : (*lazy)->ObserveAppended(1, g, appended, values);
      ASSERT_TRUE(s.ok()) << s.ToString();
      ASSERT_TRUE(GiveRelativeValues(**eager, 1, g, live[g], scores, step).ok());
      ASSERT_TRUE(GiveRelativeValues(**lazy, 1, g, live[g], scores, step).ok());
    }
    auto ve = (*eager)->GroupVictims(1);
    auto vl = (*lazy)->GroupVictims(1);
    ASSERT_TRUE(ve.ok() && vl.ok());
    ASSERT_EQ(*ve, *vl);
    for (int32_t g = 0; g < groups; ++g) {
      std::erase_if(live[g], [&](TokenId t) {
        return std::binary_search((*ve)[g].begin(), (*ve)[g].end(), t);
      });
      live[g].push_back(next);
    }
    ++next;
  }
  if ((*lazy)->signals() != 0 && !every_step) {
    EXPECT_EQ(wanted, (kSteps + options.evict_interval - 1) / options.evict_interval);
  }
}

TEST(PolicySignalsTest, SignalsOnlyWhenReadPickTheVictimsOfSignalsOnEveryStep) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::vector<EvictorOptions> variants;
  variants.push_back({.budget_tokens = 48, .num_sink = 2, .num_recent = 4, .evict_interval = 1});
  variants.push_back({.budget_tokens = 48, .num_sink = 2, .num_recent = 4, .evict_interval = 3});
  variants.push_back({.keep_ratio = 0.4,
                      .num_sink = 1,
                      .num_recent = 2,
                      .evict_interval = 4,
                      .granularity = Granularity::kHead,
                      .num_layers = 2,
                      .num_kv_heads = 2,
                      .allocation = BudgetAllocation::kAdaptive});
  for (const PolicyInfo* info : RegisteredPolicies()) {
    for (size_t v = 0; v < variants.size(); ++v) {
      SCOPED_TRACE(info->name + ", variant " + std::to_string(v) + ", seed " +
                   std::to_string(seed));
      ExpectLazySignalsPickTheSameVictims(info->name, variants[v], seed + v);
    }
  }
}

// Observing a step whose signals the policy reads without them is an error naming the policy;
// the step after it can still be observed with them.
TEST(PolicySignalsTest, MissingSignalsOnAStepThatReadsThemAreAnError) {
  auto evictor = PolicyEvictor::Create(
      "tova", {}, {.budget_tokens = 4, .num_sink = 1, .num_recent = 1, .evict_interval = 2});
  ASSERT_TRUE(evictor.ok());
  const std::vector<TokenId> live = {0, 1, 2, 3, 4, 5};
  const std::vector<float> attn(6, 1.0f / 6), norm(6, 1.0f);
  ASSERT_TRUE((*evictor)->SignalsWanted(7));  // Unknown: its first step (prefill) evicts.
  const Status missing = (*evictor)->Observe(7, live, {}, {});
  EXPECT_EQ(missing.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.message().find("policy tova reads this step's signals"), std::string::npos)
      << missing.ToString();
  EXPECT_FALSE((*evictor)->HasSequence(7));  // A failed first Observe leaves it unknown.
  ASSERT_TRUE((*evictor)->Observe(7, live, attn, norm).ok());
  auto victims = (*evictor)->Victims(7);
  ASSERT_TRUE(victims.ok());
  EXPECT_EQ(victims->size(), 2u);
  // Step 1 is not an eviction step (interval 2): no signals needed, and none computed.
  std::vector<TokenId> kept;
  std::set_difference(live.begin(), live.end(), victims->begin(), victims->end(),
                      std::back_inserter(kept));
  kept.push_back(6);
  EXPECT_FALSE((*evictor)->SignalsWanted(7));
  EXPECT_TRUE((*evictor)->Observe(7, kept, {}, {}).ok());
  EXPECT_TRUE((*evictor)->Victims(7).ok());
  kept.push_back(7);
  EXPECT_TRUE((*evictor)->SignalsWanted(7));
  EXPECT_EQ((*evictor)->Observe(7, kept, {}, {}).code(), StatusCode::kInvalidArgument);
  const std::vector<TokenId> eight = {8};
  EXPECT_EQ((*evictor)->ObserveAppended(7, 0, eight).code(), StatusCode::kInvalidArgument);
}

// ObserveAppended: after the group's first Observe only, new increasing ids only, and the
// appended tokens are live for the next Observe (which must list them).
TEST(PolicySignalsTest, ObserveAppendedChecksItsTokens) {
  auto evictor = PolicyEvictor::Create("streaming_llm", {},
                                       {.budget_tokens = 4, .num_sink = 1, .num_recent = 3});
  ASSERT_TRUE(evictor.ok());
  const std::vector<TokenId> four = {4}, three = {3}, down = {6, 5}, up = {5, 6};
  EXPECT_EQ((*evictor)->ObserveAppended(1, 0, four).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*evictor)->ObserveAppended(1, 1, four).code(), StatusCode::kInvalidArgument);
  const std::vector<TokenId> live = {0, 1, 2, 3};
  ASSERT_TRUE((*evictor)->Observe(1, live, {}, {}).ok());
  EXPECT_EQ((*evictor)->ObserveAppended(1, 0, three).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*evictor)->ObserveAppended(1, 0, down).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE((*evictor)->ObserveAppended(1, 0, up).ok());
  StatusOr<std::vector<TokenId>> victims = (*evictor)->Victims(1);  // 6 live, budget 4.
  ASSERT_TRUE(victims.ok());
  EXPECT_EQ(*victims, (std::vector<TokenId>{1, 2}));
  EXPECT_EQ(*(*evictor)->Victims(1), std::vector<TokenId>{});  // Once per step.
  const std::vector<TokenId> after = {0, 3, 5, 6, 7};
  EXPECT_TRUE((*evictor)->Observe(1, after, {}, {}).ok());
  const std::vector<TokenId> relisted = {0, 1, 3, 5, 6, 7, 8};
  EXPECT_EQ((*evictor)->Observe(1, relisted, {}, {}).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vtoken

namespace vtoken {
namespace {

// The run header's line says, for every registered policy, what SignalsWanted does.
TEST(PolicySignalsTest, SignalScheduleSaysWhenTheModelComputesSignals) {
  for (const PolicyInfo* info : RegisteredPolicies()) {
    SCOPED_TRACE(info->name);
    StatusOr<std::unique_ptr<Policy>> policy = CreatePolicy(info->name, {});
    ASSERT_TRUE(policy.ok());
    const Policy& p = **policy;
    const std::string every = SignalSchedule(p, 1), eighth = SignalSchedule(p, 8);
    for (const std::string& name : p.token_signals()) {
      EXPECT_NE(every.find(name), std::string::npos) << every;
      EXPECT_NE(
          every.find((*FindTokenSignal(name))->relative() ? " over the live tokens when it evicts"
                                                          : " once per token"),
          std::string::npos)
          << every;
    }
    if (p.signals() == 0 && !p.token_signals().empty()) {
      EXPECT_EQ(every.rfind("reads no attention signals; ", 0), 0u) << every;
    } else if (p.signals() == 0) {
      EXPECT_EQ(every, "reads no signals: the model computes none");
      EXPECT_EQ(eighth, every);
    } else if (ReadsSignalsEveryStep(p.signals(), p.state_size())) {
      EXPECT_NE(eighth.find(": signals on every step"), std::string::npos) << eighth;
    } else {
      EXPECT_NE(every.find("when it evicts: signals on every step"), std::string::npos) << every;
      EXPECT_NE(eighth.find("when it evicts: signals on the prefill and every 8th step"),
                std::string::npos)
          << eighth;
    }
    if (p.signals() & kAttnSumSignal) EXPECT_NE(every.find("attn_sum"), std::string::npos);
    if (p.signals() & kKeyNormSignal) EXPECT_NE(every.find("key_norm"), std::string::npos);
  }
}

}  // namespace
}  // namespace vtoken
