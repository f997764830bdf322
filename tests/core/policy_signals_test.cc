// Policy::signals() is honest for every registered policy: over many steps of random signals, a
// policy given only the signals it declares (the others zero, as the model leaves them) keeps
// exactly the state and gives exactly the scores it gives with every signal. A policy that reads
// a signal it did not declare fails here. The list of policies comes from the registry.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <vector>

#include "lib/core/policy.h"
#include "lib/core/policy_registry.h"

namespace vtoken {
namespace {

TEST(PolicySignalsTest, EveryPolicyScoresTheSameWithOnlyTheSignalsItDeclares) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  for (const PolicyInfo* info : RegisteredPolicies()) {
    SCOPED_TRACE(info->name + ", seed " + std::to_string(seed));
    StatusOr<std::unique_ptr<Policy>> policy = CreatePolicy(info->name, {});
    ASSERT_TRUE(policy.ok()) << policy.status().ToString();
    const Policy& p = **policy;
    const uint8_t declared = p.signals();
    ASSERT_EQ(declared & ~(kAttnSignal | kKeyNormSignal), 0) << "unknown signal bits";
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
    constexpr size_t kTokens = 48;
    const size_t state_size = static_cast<size_t>(p.state_size());
    // Two copies of every token's signals and state: `full` sees every signal, `declared` only
    // the declared ones.
    std::vector<float> full_state(kTokens * state_size, 0.0f), declared_state(full_state);
    std::vector<float> attn_sum(kTokens, 0.0f);
    PolicyRng full_rng(seed), declared_rng(seed);
    for (int64_t step = 0; step < 12; ++step) {
      std::vector<TokenView> full(kTokens), only(kTokens);
      for (size_t i = 0; i < kTokens; ++i) {
        const float attn = uniform(rng) / kTokens;
        attn_sum[i] += attn;
        const float norm = 1.0f + 4.0f * uniform(rng);
        full[i] = {.position = static_cast<TokenId>(i), .age = step, .attn = attn,
                   .attn_sum = attn_sum[i], .key_norm = norm,
                   .state = std::span<float>(full_state).subspan(i * state_size, state_size)};
        only[i] = full[i];
        if (!(declared & kAttnSignal)) only[i].attn = only[i].attn_sum = 0;
        if (!(declared & kKeyNormSignal)) only[i].key_norm = 0;
        only[i].state = std::span<float>(declared_state).subspan(i * state_size, state_size);
      }
      PolicyContext full_ctx{.step = step, .budget = 16, .rng = full_rng};
      PolicyContext only_ctx{.step = step, .budget = 16, .rng = declared_rng};
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
  EXPECT_EQ(signals("h2o"), kAttnSignal);
  EXPECT_EQ(signals("knorm"), kKeyNormSignal);
  EXPECT_EQ(signals("streaming_llm"), 0);
  EXPECT_EQ(signals("random"), 0);
}

}  // namespace
}  // namespace vtoken
