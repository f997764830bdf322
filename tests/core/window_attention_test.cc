// The window_attention token signal (signals/window_attention.cc) against a direct computation
// in double: each window query rotated by an explicit RoPE matrix at its position, attention over
// the live keys it can see, averaged over the queries and heads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "lib/core/token_signal.h"

namespace vtoken {
namespace {

std::vector<double> DirectWindowAttention(const std::vector<std::vector<float>>& keys,
                                          const std::vector<int64_t>& positions,
                                          const QueryMoments& q, int64_t d) {
  const auto n = static_cast<int64_t>(keys.size());
  std::vector<double> out(static_cast<size_t>(n), 0.0);
  for (int64_t h = 0; h < q.heads; ++h) {
    for (int64_t j = 0; j < q.recent; ++j) {
      const float* x = q.recent_queries + (h * kQueryWindow + j) * d;
      const double p = static_cast<double>(q.recent_positions[j]);
      // R(p) x with R(p) the d x d rotate_half RoPE matrix, built entry by entry.
      std::vector<double> r(static_cast<size_t>(d * d), 0.0), y(static_cast<size_t>(d), 0.0);
      for (int64_t i = 0; i < d / 2; ++i) {
        const double a = p * q.inv_freq[i];
        r[i * d + i] = std::cos(a), r[i * d + i + d / 2] = -std::sin(a);
        r[(i + d / 2) * d + i] = std::sin(a), r[(i + d / 2) * d + i + d / 2] = std::cos(a);
      }
      for (int64_t i = 0; i < d; ++i) {
        for (int64_t k = 0; k < d; ++k) y[i] += r[i * d + k] * x[k];
      }
      std::vector<double> e;
      double sum = 0;
      for (int64_t t = 0; t < n && positions[t] <= q.recent_positions[j]; ++t) {
        double dot = 0;
        for (int64_t i = 0; i < d; ++i) dot += y[i] * keys[t][i];
        e.push_back(std::exp(dot / std::sqrt(static_cast<double>(d))));
        sum += e.back();
      }
      for (size_t t = 0; t < e.size(); ++t) out[t] += e[t] / sum / (q.heads * q.recent);
    }
  }
  return out;
}

TEST(WindowAttentionTest, IsTheWindowsAttentionOverTheLiveTokens) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const TokenSignalInfo* info = *FindTokenSignal("window_attention");
  ASSERT_NE(info->set, nullptr);
  EXPECT_TRUE(info->queries);
  EXPECT_TRUE(info->reads_keys());
  EXPECT_FALSE(info->reads_values());
  const int64_t d = 16, heads = 3;
  std::vector<float> inv_freq(d / 2);
  for (int64_t i = 0; i < d / 2; ++i) {
    inv_freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / d));
  }
  for (const int64_t n : {1, 5, 40}) {
    for (const int64_t recent : {int64_t{0}, int64_t{3}, kQueryWindow}) {
      SCOPED_TRACE("n " + std::to_string(n) + ", window " + std::to_string(recent));
      std::vector<std::vector<float>> keys(n, std::vector<float>(d));
      std::vector<int64_t> positions(n);
      for (int64_t t = 0; t < n; ++t) {
        for (float& x : keys[t]) x = 0.5f * normal(rng);
        positions[t] = 2 * t + (t > 2 ? 5 : 0);  // Gaps: evicted tokens.
      }
      // The window's queries at the last positions, in ring order (not sorted), some of them
      // before the last live tokens (they see a prefix).
      std::vector<float> queries(heads * kQueryWindow * d, 7.0f);
      std::vector<int64_t> query_positions(kQueryWindow, -1);
      for (int64_t j = 0; j < recent; ++j) {
        query_positions[j] = std::max(positions[0], positions.back() - (j * 5) % 17);
        for (int64_t h = 0; h < heads; ++h) {
          for (int64_t i = 0; i < d; ++i) queries[(h * kQueryWindow + j) * d + i] = normal(rng);
        }
      }
      const QueryMoments q{.heads = heads,
                           .inv_freq = inv_freq.data(),
                           .next_position = positions.back() + 1,
                           .recent = recent,
                           .recent_queries = queries.data(),
                           .recent_positions = query_positions.data()};
      std::vector<const float*> k(n);
      for (int64_t t = 0; t < n; ++t) k[t] = keys[t].data();
      std::vector<float> got(n, -1.0f);
      info->set(TokenSignalRowSet{.keys = k.data(),
                                  .positions = positions.data(),
                                  .n = n,
                                  .head_dim = d,
                                  .queries = &q},
                got.data());
      const std::vector<double> want = DirectWindowAttention(keys, positions, q, d);
      double total = 0;
      for (int64_t t = 0; t < n; ++t) {
        EXPECT_NEAR(got[t], want[t], 1e-5 + 1e-4 * want[t]) << "token " << t << " seed " << seed;
        total += got[t];
      }
      // Every query sees the first live token: the values sum to 1 (0 without queries).
      EXPECT_NEAR(total, recent > 0 ? 1.0 : 0.0, 1e-5);
    }
  }
}

}  // namespace
}  // namespace vtoken
