// Token signals (lib/core/token_signal.h): the registry, the bundled signals against a double
// reference, the reduction over a group's rows, and the evictor's bookkeeping of the values (given
// once per token, kept through evictions, refused when unknown or of the wrong length).
#include "lib/core/token_signal.h"

#include <gtest/gtest.h>

#include <algorithm>
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

// A fresh random seed, printed (a failing randomized case can then be replayed).
uint64_t PrintedSeed() {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

TEST(TokenSignalTest, EveryRegisteredSignalIsOneFileUnderSignalsWithADoc) {
  ASSERT_FALSE(RegisteredTokenSignals().empty());
  std::string last;
  for (const TokenSignalInfo* info : RegisteredTokenSignals()) {
    SCOPED_TRACE(info->name);
    EXPECT_LT(last, info->name);  // Sorted, distinct.
    last = info->name;
    EXPECT_NE(info->fn == nullptr, info->set == nullptr);  // One form: per row, or a set.
    EXPECT_TRUE(!info->queries || info->set != nullptr);
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
  const uint64_t seed = PrintedSeed();
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
    EXPECT_NEAR(l2(key, value, {}), std::sqrt(sq), 1e-5 * std::sqrt(sq)) << "seed " << seed;
    EXPECT_NEAR(l1(key, value, {}), abs, 1e-5 * abs) << "seed " << seed;
    // A function of the value alone: the key does not change it.
    std::vector<float> other(64, 3.0f);
    EXPECT_EQ(l2(other, value, {}), l2(key, value, {}));
  }
}

// kvpress's KeyDiffPress in double: anchor = mean over tokens of normalize(key), score =
// cosine(key, anchor), per row; a token's value is the mean of its rows' cosines.
std::vector<double> KeyDiffCosines(const std::vector<float>& keys, int64_t n, int64_t rows,
                                   int64_t dim) {
  auto at = [&](int64_t i, int64_t r) { return keys.data() + (i * rows + r) * dim; };
  auto norm = [&](const double* x) {
    double s = 0;
    for (int64_t d = 0; d < dim; ++d) s += x[d] * x[d];
    return std::sqrt(s);
  };
  std::vector<double> out(static_cast<size_t>(n), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> anchor(static_cast<size_t>(dim), 0.0), k(static_cast<size_t>(dim));
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(at(i, r), dim, k.begin());
      const double inv = 1.0 / norm(k.data());
      for (int64_t d = 0; d < dim; ++d) anchor[d] += k[d] * inv / static_cast<double>(n);
    }
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(at(i, r), dim, k.begin());
      double dot = 0;
      for (int64_t d = 0; d < dim; ++d) dot += k[d] * anchor[d];
      out[i] += dot / (norm(k.data()) * norm(anchor.data())) / static_cast<double>(rows);
    }
  }
  return out;
}

TEST(TokenSignalTest, KeyAnchorCosineIsKvpressKeyDiffOverTheLiveTokens) {
  const uint64_t seed = PrintedSeed();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.5f, 1.0f);
  const TokenSignalInfo* cosine = *FindTokenSignal("key_anchor_cosine");
  const TokenSignalInfo* l1 = *FindTokenSignal("value_l1_norm");
  ASSERT_TRUE(cosine->relative());
  ASSERT_FALSE(l1->relative());
  const TokenSignalInfo* infos[] = {l1, cosine};
  // 2 layers x 3 heads of 16 floats, 37 live tokens.
  const int64_t n = 37, layers = 2, heads = 3, dim = 16, rows = layers * heads;
  std::vector<float> keys(static_cast<size_t>(n * rows * dim)), values(keys.size());
  for (float& x : keys) x = normal(rng);
  for (float& x : values) x = normal(rng);
  const std::vector<float> anchors =
      TokenSignalAnchors(infos, keys.data(), values.data(), n, rows, dim);
  ASSERT_EQ(anchors.size(), static_cast<size_t>(2 * rows * dim));
  for (size_t i = 0; i < static_cast<size_t>(rows * dim); ++i) EXPECT_EQ(anchors[i], 0.0f);
  const std::vector<double> want = KeyDiffCosines(keys, n, rows, dim);
  for (int64_t i = 0; i < n; ++i) {
    const size_t at = static_cast<size_t>(i * rows * dim);
    float out[2];
    ReduceTokenSignals(infos, keys.data() + at, values.data() + at, layers, heads, dim, out,
                       anchors.data());
    EXPECT_NEAR(out[1], want[i], 1e-5) << "token " << i << " seed " << seed;
    float alone;
    ReduceTokenSignals(std::span(infos).first(1), keys.data() + at, values.data() + at, layers,
                       heads, dim, &alone);
    EXPECT_EQ(out[0], alone);  // The absolute signal ignores the anchors.
  }
  // A zero key has cosine 0, not NaN.
  const std::vector<float> zero(static_cast<size_t>(dim), 0.0f), unit(zero.size(), 1.0f);
  EXPECT_EQ(cosine->fn(zero, zero, unit), 0.0f);
}

// kvpress's ExpectedAttentionPress.score for one KV row, in double with its own construction:
// R = the mean over positions next..next+511 of the d x d RoPE matrices (cos I + sin P, P the
// rotate_half permutation), mu' = R mu, S' = R S R^T, logit = k.mu' / sqrt(d) + k^T S' k / (2d),
// softmax over the tokens past the 4 sinks per query head, mean over heads, times |v|; the sinks
// get the maximum.
std::vector<double> KvpressExpectedAttention(const std::vector<std::vector<float>>& keys,
                                             const std::vector<std::vector<float>>& values,
                                             const std::vector<int64_t>& positions,
                                             const QueryMoments& q, int64_t d) {
  const int64_t n = static_cast<int64_t>(keys.size()), half = d / 2;
  std::vector<double> r(static_cast<size_t>(d * d), 0.0);
  for (int64_t p = q.next_position; p < q.next_position + 512; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(p) * q.inv_freq[i];
      r[i * d + i] += std::cos(a) / 512, r[(i + half) * d + i + half] += std::cos(a) / 512;
      r[i * d + i + half] -= std::sin(a) / 512, r[(i + half) * d + i] += std::sin(a) / 512;
    }
  }
  int64_t first = 0;
  while (first < n && positions[first] < 4) ++first;
  if (first == n) first = 0;  // Only sinks: the softmax takes them all (kvpress refuses).
  std::vector<double> out(static_cast<size_t>(n), 0.0);
  for (int64_t h = 0; h < q.heads; ++h) {
    std::vector<double> mu(d, 0.0), rs(d * d, 0.0), cov(d * d, 0.0);
    for (int64_t i = 0; i < d; ++i) {
      for (int64_t j = 0; j < d; ++j) mu[i] += r[i * d + j] * q.mean[h * d + j];
    }
    for (int64_t i = 0; i < d; ++i) {
      for (int64_t j = 0; j < d; ++j) {
        for (int64_t k = 0; k < d; ++k) rs[i * d + j] += r[i * d + k] * q.cov[(h * d + k) * d + j];
      }
    }
    for (int64_t i = 0; i < d; ++i) {
      for (int64_t j = 0; j < d; ++j) {
        for (int64_t k = 0; k < d; ++k) cov[i * d + j] += rs[i * d + k] * r[j * d + k];
      }
    }
    std::vector<double> logit(n);
    for (int64_t t = 0; t < n; ++t) {
      double lin = 0, quad = 0;
      for (int64_t i = 0; i < d; ++i) {
        lin += keys[t][i] * mu[i];
        for (int64_t j = 0; j < d; ++j) quad += keys[t][i] * cov[i * d + j] * keys[t][j];
      }
      logit[t] = lin / std::sqrt(static_cast<double>(d)) + quad / d / 2;
    }
    double top = -1e300, sum = 0;
    for (int64_t t = first; t < n; ++t) top = std::max(top, logit[t]);
    for (int64_t t = first; t < n; ++t) sum += std::exp(logit[t] - top);
    for (int64_t t = first; t < n; ++t) out[t] += std::exp(logit[t] - top) / sum / q.heads;
  }
  double best = 0;
  for (int64_t t = first; t < n; ++t) {
    double norm = 0;
    for (float x : values[t]) norm += double{x} * x;
    out[t] *= std::sqrt(norm);
    best = std::max(best, out[t]);
  }
  for (int64_t t = 0; t < first; ++t) out[t] = best;
  return out;
}

TEST(TokenSignalTest, ExpectedAttentionIsKvpressExpectedAttentionPress) {
  const uint64_t seed = PrintedSeed();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const TokenSignalInfo* info = *FindTokenSignal("expected_attention");
  ASSERT_NE(info->set, nullptr);
  EXPECT_TRUE(info->queries);
  EXPECT_TRUE(info->relative());
  for (const int64_t d : {64, 32}) {  // The compiled head_dim and the generic path.
    for (const int64_t n : {1, 3, 9, 70}) {
      SCOPED_TRACE("head_dim " + std::to_string(d) + ", n " + std::to_string(n));
      const int64_t heads = 3;
      std::vector<float> mean(heads * d), cov(heads * d * d), inv_freq(d / 2);
      for (float& x : mean) x = normal(rng);
      for (int64_t h = 0; h < heads; ++h) {  // S = A A^T / d: a covariance.
        std::vector<float> a(d * d);
        for (float& x : a) x = normal(rng);
        for (int64_t i = 0; i < d; ++i) {
          for (int64_t j = 0; j < d; ++j) {
            double dot = 0;
            for (int64_t k = 0; k < d; ++k) dot += double{a[i * d + k]} * a[j * d + k];
            cov[(h * d + i) * d + j] = static_cast<float>(dot / d);
          }
        }
      }
      for (int64_t i = 0; i < d / 2; ++i) {
        inv_freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / d));
      }
      std::vector<std::vector<float>> keys(n, std::vector<float>(d)), values = keys;
      std::vector<int64_t> positions(n);
      for (int64_t t = 0; t < n; ++t) {
        for (float& x : keys[t]) x = 0.3f * normal(rng);
        for (float& x : values[t]) x = normal(rng);
        positions[t] = t < 2 ? t : 7 + 3 * t;  // Two sinks, then gaps (evicted tokens).
      }
      const QueryMoments q{.heads = heads,
                           .count = 100,
                           .mean = mean.data(),
                           .cov = cov.data(),
                           .inv_freq = inv_freq.data(),
                           .next_position = positions.back() + 1};
      std::vector<const float*> k(n), v(n);
      for (int64_t t = 0; t < n; ++t) k[t] = keys[t].data(), v[t] = values[t].data();
      std::vector<float> got(n, -1.0f);
      info->set(TokenSignalRowSet{.keys = k.data(),
                                  .values = v.data(),
                                  .positions = positions.data(),
                                  .n = n,
                                  .head_dim = d,
                                  .queries = &q},
                got.data());
      const std::vector<double> want = KvpressExpectedAttention(keys, values, positions, q, d);
      for (int64_t t = 0; t < n; ++t) {
        EXPECT_NEAR(got[t], want[t], 2e-4 * std::abs(want[t]) + 1e-7)
            << "token " << t << " seed " << seed;
      }
      if (n > 3) {  // Sinks get the row's maximum.
        EXPECT_EQ(got[0], *std::max_element(got.begin() + 2, got.end()));
      }
    }
  }
}

TEST(TokenSignalTest, ReductionIsTheMeanOverTheGroupsRows) {
  const TokenSignalInfo* l1 = *FindTokenSignal("value_l1_norm");
  const TokenSignalInfo* fns[] = {l1, l1};
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

// Reads value_l1_norm (absolute) and key_anchor_cosine (relative), and checks on each eviction
// that the absolute value is the one given for its token and the relative one is this step's.
class ReadsBothKinds final : public Policy {
 public:
  std::vector<std::string> token_signals() const override {
    return {"key_anchor_cosine", "value_l1_norm"};
  }
  uint8_t signals() const override { return 0; }
  void Score(std::span<const TokenView> tokens, PolicyContext& ctx,
             std::span<float> scores) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      EXPECT_EQ(tokens[i].token_signals[1], static_cast<float>(tokens[i].position % 5));
      EXPECT_EQ(tokens[i].token_signals[0],
                static_cast<float>((tokens[i].position * 3 + ctx.step) % 11));
      scores[i] = tokens[i].token_signals[0];
    }
  }
};

TEST(TokenSignalTest, RelativeValuesAreGivenForEveryLiveTokenOnEvictionSteps) {
  PolicyEvictor e("both", std::make_unique<ReadsBothKinds>(),
                  {.budget_tokens = 10, .evict_interval = 2});
  ASSERT_EQ(e.absolute_token_signals().size(), 1u);
  ASSERT_EQ(e.relative_token_signals().size(), 1u);
  EXPECT_EQ(e.relative_token_signals()[0]->name, "key_anchor_cosine");
  EXPECT_EQ(SignalSchedule(ReadsBothKinds(), 2),
            "reads no attention signals; token signals value_l1_norm once per token; relative "
            "token signals key_anchor_cosine over the live tokens when it evicts");
  auto absolute = [](std::span<const TokenId> ids) {
    std::vector<float> v;
    for (TokenId id : ids) v.push_back(static_cast<float>(id % 5));
    return v;
  };
  auto relative = [](std::span<const TokenId> ids, int64_t step) {
    std::vector<float> v;
    for (TokenId id : ids) v.push_back(static_cast<float>((id * 3 + step) % 11));
    return v;
  };
  std::vector<TokenId> live = Range(0, 20);
  EXPECT_TRUE(e.ScoresNext(4));
  ASSERT_TRUE(e.Observe(4, live, {}, {}, absolute(live)).ok());
  // An eviction step without the relative values is refused, before any victim is picked.
  const StatusOr<std::vector<TokenId>> missing = e.Victims(4);
  EXPECT_EQ(missing.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(missing.status().message().find("reads relative token signal key_anchor_cosine"),
            std::string::npos)
      << missing.status().ToString();
  EXPECT_EQ(e.ObserveRelative(4, 0, std::vector<float>(3, 1.0f)).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(e.ObserveRelative(4, 0, relative(live, 0)).ok());
  for (int64_t step = 0; step < 12; ++step) {
    StatusOr<std::vector<TokenId>> victims = e.Victims(4);
    ASSERT_TRUE(victims.ok()) << victims.status().ToString();
    EXPECT_EQ(victims->empty(), step % 2 != 0) << "step " << step;
    std::erase_if(
        live, [&](TokenId t) { return std::binary_search(victims->begin(), victims->end(), t); });
    const TokenId next = 20 + step;
    live.push_back(next);
    EXPECT_EQ(e.ScoresNext(4), (step + 1) % 2 == 0);
    const std::vector<int64_t> counts = {static_cast<int64_t>(live.size())};  // 11 > budget 10
    EXPECT_EQ(e.ScoresNext(4, counts), (step + 1) % 2 == 0);
    const std::vector<TokenId> fresh = {next};
    ASSERT_TRUE(e.ObserveAppended(4, 0, fresh, absolute(fresh)).ok());
    if ((step + 1) % 2 == 0) ASSERT_TRUE(e.ObserveRelative(4, 0, relative(live, step + 1)).ok());
  }
}

// A sequence within its budget is never scored, so it needs no relative values; ScoresNext with
// the live counts says so before the step (the engine then reads none).
TEST(TokenSignalTest, NoRelativeValuesAreNeededWithinTheBudget) {
  PolicyEvictor e("both", std::make_unique<ReadsBothKinds>(), {.budget_tokens = 10});
  std::vector<TokenId> live = Range(0, 6);
  const std::vector<float> absolute(6, 1.0f), one(1, 1.0f);
  EXPECT_TRUE(e.ScoresNext(9, std::vector<int64_t>{6}));  // Never observed: any eviction step.
  ASSERT_TRUE(e.Observe(9, live, {}, {}, absolute).ok());
  StatusOr<std::vector<TokenId>> victims = e.Victims(9);
  ASSERT_TRUE(victims.ok()) << victims.status().ToString();
  EXPECT_TRUE(victims->empty());
  for (TokenId next = 6; next < 12; ++next) {
    const std::vector<int64_t> counts = {static_cast<int64_t>(live.size()) + 1};
    EXPECT_EQ(e.ScoresNext(9, counts), counts[0] > 10) << "token " << next;
    EXPECT_TRUE(e.ScoresNext(9));  // Every step is an eviction step (evict_interval 1).
    live.push_back(next);
    ASSERT_TRUE(e.ObserveAppended(9, 0, std::vector<TokenId>{next}, one).ok());
    victims = e.Victims(9);
    if (counts[0] <= 10) {
      ASSERT_TRUE(victims.ok()) << victims.status().ToString();
      EXPECT_TRUE(victims->empty());
    } else {  // 11 live: the policy scores, and the values are missing.
      EXPECT_EQ(victims.status().code(), StatusCode::kFailedPrecondition);
    }
  }
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
