// Token signals (lib/core/token_signal.h): the registry, the bundled signals against a double
// reference, the reduction over a group's rows, and the evictor's bookkeeping of the values (given
// once per token, kept through evictions, refused when unknown or of the wrong length).
#include "lib/core/token_signal.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "lib/core/policy.h"
#include "lib/core/policy_evictor.h"
#include "tests/core/policy_test_util.h"

namespace vtoken {
namespace {

using testing_util::Range;

TEST(TokenSignalTest, EveryRegisteredSignalIsOneFileUnderSignalsWithADoc) {
  ASSERT_FALSE(RegisteredTokenSignals().empty());
  std::string last;
  for (const TokenSignalInfo* info : RegisteredTokenSignals()) {
    SCOPED_TRACE(info->name);
    EXPECT_LT(last, info->name);  // Sorted, distinct.
    last = info->name;
    EXPECT_NE(info->fn, nullptr);
    EXPECT_FALSE(info->doc.empty());
    EXPECT_EQ(std::filesystem::path(info->source_file).parent_path().filename(), "signals");
    EXPECT_EQ(std::filesystem::path(info->source_file).stem(), info->name);
    StatusOr<const TokenSignalInfo*> found = FindTokenSignal(info->name);
    ASSERT_TRUE(found.ok());
    EXPECT_EQ(*found, info);
  }
  StatusOr<const TokenSignalInfo*> missing = FindTokenSignal("no_such_signal");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("unknown token signal 'no_such_signal' (registered: "),
            std::string::npos)
      << missing.status().ToString();
  EXPECT_NE(missing.status().message().find("value_norm"), std::string::npos);
}

TEST(TokenSignalTest, ValueNormsMatchADoubleReference) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  const TokenSignalFn l2 = (*FindTokenSignal("value_norm"))->fn;
  const TokenSignalFn l1 = (*FindTokenSignal("value_l1_norm"))->fn;
  for (int round = 0; round < 50; ++round) {
    std::vector<float> key(64), value(64);
    for (float& x : key) x = normal(rng);
    for (float& x : value) x = normal(rng);
    double sq = 0, abs = 0;
    for (float x : value) sq += double{x} * x, abs += std::abs(double{x});
    EXPECT_NEAR(l2(key, value), std::sqrt(sq), 1e-5 * std::sqrt(sq)) << "seed " << seed;
    EXPECT_NEAR(l1(key, value), abs, 1e-5 * abs) << "seed " << seed;
    // A function of the value alone: the key does not change it.
    std::vector<float> other(64, 3.0f);
    EXPECT_EQ(l2(other, value), l2(key, value));
  }
}

TEST(TokenSignalTest, ReductionIsTheMeanOverTheGroupsRows) {
  const TokenSignalFn l1 = (*FindTokenSignal("value_l1_norm"))->fn;
  const TokenSignalFn fns[] = {l1, l1};
  // 2 layers x 3 heads of 2 floats: row r's value is (r + 1, 0), so its L1 norm is r + 1.
  std::vector<float> keys(12, 0.0f), values(12, 0.0f);
  for (int r = 0; r < 6; ++r) values[2 * r] = static_cast<float>(r + 1);
  float out[2] = {-1, -1};
  ReduceTokenSignals(fns, keys.data(), values.data(), 2, 3, 2, out);
  EXPECT_FLOAT_EQ(out[0], 3.5f);  // (1 + ... + 6) / 6
  EXPECT_EQ(out[0], out[1]);
  ReduceTokenSignals(fns, keys.data(), values.data(), 1, 1, 2, out);  // One row: itself.
  EXPECT_EQ(out[0], 1.0f);
}

class ReadsUnknownSignal final : public Policy {
 public:
  std::vector<std::string> token_signals() const override { return {"value_norm", "nope"}; }
  void Score(std::span<const TokenView>, PolicyContext&, std::span<float>) const override {}
};

// Scores each token by its first token signal, and checks that its second, when it has one,
// is its first plus one (so a value that moved to another token's entry fails).
class ScoresByTokenSignal final : public Policy {
 public:
  std::vector<std::string> token_signals() const override {
    return {"value_norm", "value_l1_norm"};
  }
  uint8_t signals() const override { return 0; }
  void Score(std::span<const TokenView> tokens, PolicyContext&,
             std::span<float> scores) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      EXPECT_EQ(tokens[i].token_signals.size(), 2u);
      EXPECT_EQ(tokens[i].token_signals[1], tokens[i].token_signals[0] + 1);
      EXPECT_EQ(tokens[i].token_signals[0], static_cast<float>(tokens[i].position % 7));
      scores[i] = tokens[i].token_signals[0];
    }
  }
};

TEST(TokenSignalTest, EvictorResolvesNamesAndRefusesUnknownOnes) {
  const StatusOr<std::vector<const TokenSignalInfo*>> bad =
      ResolveTokenSignals(ReadsUnknownSignal(), "reader");
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound);
  EXPECT_NE(bad.status().message().find("policy reader reads unknown token signal 'nope'"),
            std::string::npos)
      << bad.status().ToString();
  const StatusOr<std::vector<const TokenSignalInfo*>> good =
      ResolveTokenSignals(ScoresByTokenSignal(), "scorer");
  ASSERT_TRUE(good.ok());
  ASSERT_EQ(good->size(), 2u);
  EXPECT_EQ((*good)[0]->name, "value_norm");
  EXPECT_EQ((*good)[1]->name, "value_l1_norm");
}

// Values are given once, when a token is first observed, and follow their token through
// evictions and the compaction of the evictor's arrays, over many steps.
TEST(TokenSignalTest, ValuesFollowTheirTokensThroughEvictions) {
  PolicyEvictor e("scorer", std::make_unique<ScoresByTokenSignal>(),
                  {.budget_tokens = 12, .num_sink = 1, .num_recent = 2});
  auto values_of = [](std::span<const TokenId> ids) {
    std::vector<float> v;
    for (TokenId id : ids) {
      v.push_back(static_cast<float>(id % 7));
      v.push_back(static_cast<float>(id % 7) + 1);
    }
    return v;
  };
  std::vector<TokenId> live = Range(0, 40);
  EXPECT_EQ(e.UnseenFrom(3, 0), 0);
  ASSERT_TRUE(e.Observe(3, live, {}, {}, values_of(live)).ok());
  EXPECT_EQ(e.UnseenFrom(3, 0), 40);
  for (TokenId next = 40; next < 100; ++next) {
    StatusOr<std::vector<TokenId>> victims = e.Victims(3);
    ASSERT_TRUE(victims.ok());
    std::erase_if(
        live, [&](TokenId t) { return std::binary_search(victims->begin(), victims->end(), t); });
    ASSERT_EQ(live.size(), 12u);
    live.push_back(next);
    const std::vector<TokenId> fresh = {next};
    const Status s = next % 2 == 0 ? e.Observe(3, live, {}, {}, values_of(fresh))
                                   : e.ObserveAppended(3, 0, fresh, values_of(fresh));
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  // Missing values for a new token, and a non-finite one, are errors.
  live.push_back(100);
  EXPECT_EQ(e.Observe(3, live, {}, {}).code(), StatusCode::kInvalidArgument);
  const std::vector<float> nan = {NAN, 1.0f};
  EXPECT_EQ(e.Observe(3, live, {}, {}, nan).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vtoken
