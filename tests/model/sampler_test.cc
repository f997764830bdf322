#include "lib/model/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace vtoken::model {
namespace {

TEST(SamplerTest, GreedyPicksArgmaxLowestIdOnTies) {
  Sampler greedy;
  EXPECT_EQ(greedy.Sample(torch::tensor({0.1f, 2.0f, -1.0f, 2.0f})), 1);
  EXPECT_EQ(greedy.Sample(torch::tensor({-3.0, -2.0, -2.5}, torch::kDouble)), 1);
}

// Greedy over fp32 logits (a vectorized scan) answers what std::max_element answers: the first
// largest, wherever it lies (a vector block, the tail), ties included; lengths 1 to 128,256.
TEST(SamplerTest, GreedyIsTheFirstLargestAtEveryLength) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  Sampler greedy;
  std::vector<int64_t> lengths = {1, 2, 15, 16, 17, 31, 32, 33, 2048, 128256};
  for (int i = 0; i < 40; ++i) lengths.push_back(1 + static_cast<int64_t>(rng() % 300));
  for (int64_t n : lengths) {
    for (int ties : {0, 1, 3}) {
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = normal(rng);
      const float top = *std::max_element(x.begin(), x.end());
      for (int t = 0; t < ties; ++t) x[rng() % n] = top;  // Copies of the largest anywhere.
      const int64_t want = std::max_element(x.begin(), x.end()) - x.begin();
      EXPECT_EQ(greedy.Sample(torch::tensor(x)), want) << "n " << n << ", ties " << ties;
    }
  }
}

// NaN logits are never the largest, wherever they lie (the first element, a vector block, the
// tail); a vocabulary of NaN gives token 0.
TEST(SamplerTest, GreedyIgnoresNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Sampler greedy;
  for (int64_t n : {1, 2, 15, 16, 17, 33, 2048}) {
    for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
      std::vector<float> x(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>((i * 37) % 101);
      const int64_t want = n == 1 ? 0 : std::max_element(x.begin(), x.end()) - x.begin();
      const float kept = x[want];
      for (int64_t i = at; i < n; i += 5) x[i] = i == want ? kept : nan;
      EXPECT_EQ(greedy.Sample(torch::tensor(x)), want) << "n " << n << ", NaN from " << at;
    }
    EXPECT_EQ(greedy.Sample(torch::full({n}, nan)), 0) << "n " << n;
  }
}

TEST(SamplerTest, TopPKeepsOnlyTheNucleus) {
  // Probabilities about 0.64, 0.24, 0.09, 0.03: top_p 0.8 keeps ids 0 and 1 only.
  auto logits = torch::tensor({3.0f, 2.0f, 1.0f, -0.2f});
  Sampler sampler({/*temperature=*/1.0, /*top_p=*/0.8, /*seed=*/42});
  std::set<int32_t> seen;
  for (int i = 0; i < 400; ++i) seen.insert(sampler.Sample(logits));
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1}));
}

// sampler.h's rule, computed the plain way: every token sorted, the prefix, the walk.
class ReferenceSampler {
 public:
  ReferenceSampler(double temperature, double top_p, uint64_t seed)
      : temperature_(temperature), top_p_(top_p), rng_(seed) {}

  int32_t Sample(const std::vector<float>& x) {
    const size_t n = x.size();
    const double max = *std::max_element(x.begin(), x.end());
    std::vector<double> p(n);
    for (size_t i = 0; i < n; ++i) p[i] = std::exp((x[i] - max) * (1.0 / temperature_));
    double total = 0;
    for (double v : p) total += v;
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    size_t kept_count = n;
    double kept = total;
    if (top_p_ < 1) {
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return p[a] > p[b]; });
      kept_count = 0;
      kept = 0;
      while (kept_count < n && (kept_count == 0 || kept < top_p_ * total)) {
        kept += p[order[kept_count++]];
      }
    }
    double r = std::uniform_real_distribution<double>(0.0, kept)(rng_);
    for (size_t i = 0; i < kept_count; ++i) {
      r -= p[order[i]];
      if (r < 0) return order[i];
    }
    return order[kept_count - 1];
  }

 private:
  double temperature_, top_p_;
  std::mt19937_64 rng_;
};

// The Sampler (which sorts the nucleus only) draws what the reference draws, token for token:
// vocabularies of 1 to 128,256, flat to peaked logits, ties, every top_p regime.
TEST(SamplerTest, NucleusSamplingFollowsTheRuleExactly) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<int64_t> lengths = {1, 2, 3, 1000, 2048, 128256};
  for (int i = 0; i < 30; ++i) lengths.push_back(1 + static_cast<int64_t>(rng() % 5000));
  int cases = 0;
  for (int64_t n : lengths) {
    for (double spread : {0.01, 1.0, 4.0, 30.0}) {
      const double top_p = std::vector<double>{0.05, 0.5, 0.9, 0.999, 1.0}[rng() % 5];
      const double temperature = std::vector<double>{0.3, 0.8, 1.0, 1.7}[rng() % 4];
      std::normal_distribution<float> normal(0.0f, static_cast<float>(spread));
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = normal(rng);
      for (int t = 0; t < 3; ++t) x[rng() % n] = x[rng() % n];  // Ties.
      const uint64_t draw_seed = rng();
      Sampler sampler({temperature, top_p, draw_seed});
      ReferenceSampler reference(temperature, top_p, draw_seed);
      const torch::Tensor logits = torch::tensor(x);
      for (int d = 0; d < 5; ++d) {
        ASSERT_EQ(sampler.Sample(logits), reference.Sample(x))
            << "n " << n << " spread " << spread << " top_p " << top_p << " temperature "
            << temperature << " draw " << d;
      }
      ++cases;
    }
  }
  EXPECT_EQ(cases, 4 * static_cast<int>(lengths.size()));
}

// Equal logits: the nucleus of top_p 0.5 over 1,000 tokens is the 500 lowest ids, and the
// draws cover it.
TEST(SamplerTest, TiedNucleusIsTheLowestIds) {
  Sampler sampler({1.0, 0.5, 11});
  const torch::Tensor logits = torch::zeros({1000});
  std::set<int32_t> seen;
  for (int i = 0; i < 5000; ++i) seen.insert(sampler.Sample(logits));
  EXPECT_EQ(*seen.rbegin(), 499);
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_GT(seen.size(), 450u);
}

// Non-finite logits: NaN is never drawn, +inf always is, -inf never; all NaN gives token 0 (what
// greedy answers), without reading outside the vocabulary.
TEST(SamplerTest, NonFiniteLogitsHaveDefinedDraws) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (double top_p : {0.5, 1.0}) {
    SCOPED_TRACE("top_p " + std::to_string(top_p));
    Sampler sampler({1.0, top_p, 5});
    std::set<int32_t> seen;
    for (int i = 0; i < 300; ++i)
      seen.insert(sampler.Sample(torch::tensor({nan, 0.0f, nan, 0.1f})));
    EXPECT_TRUE(seen.size() <= 2 && !seen.count(0) && !seen.count(2)) << *seen.begin();
    for (int i = 0; i < 50; ++i) {
      EXPECT_EQ(sampler.Sample(torch::tensor({1.0f, inf, 2.0f, -inf, nan})), 1);
      EXPECT_NE(sampler.Sample(torch::tensor({-inf, 1.0f, -inf, 2.0f})) % 2, 0);
    }
    EXPECT_EQ(sampler.Sample(torch::tensor({nan, nan, nan})), 0);
    const int32_t all_inf = sampler.Sample(torch::tensor({-inf, -inf, -inf}));
    EXPECT_TRUE(all_inf >= 0 && all_inf < 3) << all_inf;
  }
}

TEST(SamplerTest, SameSeedSameTokens) {
  auto logits = torch::tensor({0.5f, 0.4f, 0.3f, 0.2f, 0.1f});
  Sampler a({1.0, 1.0, 7}), b({1.0, 1.0, 7});
  std::vector<int32_t> ta, tb;
  std::set<int32_t> seen;
  for (int i = 0; i < 200; ++i) {
    ta.push_back(a.Sample(logits));
    tb.push_back(b.Sample(logits));
    seen.insert(ta.back());
  }
  EXPECT_EQ(ta, tb);
  EXPECT_EQ(seen.size(), 5u);  // Near-uniform logits: every token shows up in 200 draws.
}

TEST(SamplerTest, LowTemperatureIsGreedy) {
  Sampler sampler({1e-4, 1.0, 3});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(sampler.Sample(torch::tensor({0.0f, 1.0f, 0.5f})), 1);
}

// Sample is NextUniform then Draw: the stream a forward that samples on the device (one
// NextUniform per token, the Draw there) consumes is the one Sample consumes.
TEST(SamplerTest, NextUniformThenDrawIsSample) {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (double top_p : {0.5, 0.95, 1.0}) {
    Sampler whole({0.7, top_p, 99}), split({0.7, top_p, 99});
    for (int t = 0; t < 200; ++t) {
      std::vector<float> x(50);
      for (float& v : x) v = normal(rng);
      const torch::Tensor logits = torch::tensor(x);
      const double u = split.NextUniform();
      ASSERT_TRUE(u >= 0 && u < 1) << u;
      ASSERT_EQ(whole.Sample(logits), split.Draw(logits, u)) << "top_p " << top_p << " token " << t;
    }
  }
  // Greedy takes nothing from the stream: a greedy Draw ignores the uniform.
  Sampler greedy;
  EXPECT_EQ(greedy.Draw(torch::tensor({0.0f, 2.0f, 1.0f}), 0.999), 1);
}

// SampleRows (the device's sampling, run here in torch's CPU ops) draws what Sampler draws with
// the same uniform, row by row in one call: rows of every temperature / top_p regime (greedy
// rows included), lengths up to Llama 3's vocabulary, ties, and non-finite logits.
TEST(SamplerTest, SampleRowsDrawsWhatTheSamplerDraws) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  int rows_checked = 0, not_argmax = 0;
  for (int64_t n : {1, 2, 7, 97, 1000, 128256}) {
    const int64_t rows = n > 1000 ? 6 : 40;
    std::vector<float> x(static_cast<size_t>(rows * n));
    std::vector<double> draws;
    bool nucleus = false;
    for (int64_t r = 0; r < rows; ++r) {
      float* row = x.data() + r * n;
      std::normal_distribution<float> normal(0.0f, std::vector<float>{0.01f, 1.0f, 4.0f}[r % 3]);
      for (int64_t i = 0; i < n; ++i) row[i] = normal(rng);
      for (int t = 0; t < 3; ++t) row[rng() % n] = row[rng() % n];  // Ties.
      if (r % 7 == 5) row[rng() % n] = nan;
      if (r % 11 == 6) row[rng() % n] = -inf;
      if (r % 13 == 7) row[rng() % n] = inf;
      if (r % 17 == 8) std::fill(row, row + n, nan);
      const double temperature = std::vector<double>{0.0, 0.3, 0.8, 1.0, 1.7}[rng() % 5];
      const double top_p = std::vector<double>{0.05, 0.5, 0.9, 0.999, 1.0}[rng() % 5];
      nucleus |= temperature > 0 && top_p < 1;
      draws.insert(draws.end(),
                   {temperature, top_p, std::uniform_real_distribution<double>(0, 1)(rng)});
    }
    const torch::Tensor logits = torch::tensor(x).view({rows, n});
    const torch::Tensor got =
        SampleRows(logits, torch::tensor(draws, torch::kDouble).view({rows, 3}), nucleus);
    ASSERT_EQ(got.scalar_type(), torch::kFloat32);
    ASSERT_EQ(got.numel(), rows);
    for (int64_t r = 0; r < rows; ++r) {
      const SampleDraw d{draws[3 * r], draws[3 * r + 1], draws[3 * r + 2]};
      const int32_t want = SampleRow(logits[r], d);
      ASSERT_EQ(got[r].item<float>(), want)
          << "n " << n << " row " << r << " temperature " << d.temperature << " top_p " << d.top_p
          << " u " << d.uniform;
      not_argmax += want != Sampler().Sample(logits[r]);
      ++rows_checked;
    }
  }
  EXPECT_EQ(rows_checked, 5 * 40 + 6);
  EXPECT_GT(not_argmax, 20);  // Most rows are really sampled, not greedy in disguise.
}

// Without a nucleus row nothing is sorted: every sampling row walks its tokens in id order, and
// a token of probability 0 is never the one the running mass exceeds r at, even at r = 0.
TEST(SamplerTest, SampleRowsWithoutANucleusWalksIdOrder) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // Equal logits: p = 1 each, r = u * 4 lands in token floor(u * 4).
  const torch::Tensor logits =
      torch::cat({torch::zeros({4, 4}), torch::tensor({-inf, nan, 1.0f, 1.0f}).view({1, 4})});
  std::vector<double> draws;
  for (double u : {0.0, 0.3, 0.6, 0.99, 0.0}) draws.insert(draws.end(), {1.0, 1.0, u});
  const torch::Tensor got =
      SampleRows(logits, torch::tensor(draws, torch::kDouble).view({5, 3}), false);
  EXPECT_TRUE(torch::equal(got, torch::tensor({0.0f, 1.0f, 2.0f, 3.0f, 2.0f}))) << got;
  for (int64_t r = 0; r < 5; ++r) {
    EXPECT_EQ(SampleRow(logits[r], {1.0, 1.0, draws[3 * r + 2]}), got[r].item<float>()) << r;
  }
}
}  // namespace
}  // namespace vtoken::model
