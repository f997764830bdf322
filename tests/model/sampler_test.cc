#include "lib/model/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
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

TEST(SamplerTest, TopPKeepsOnlyTheNucleus) {
  // Probabilities about 0.64, 0.24, 0.09, 0.03: top_p 0.8 keeps ids 0 and 1 only.
  auto logits = torch::tensor({3.0f, 2.0f, 1.0f, -0.2f});
  Sampler sampler({/*temperature=*/1.0, /*top_p=*/0.8, /*seed=*/42});
  std::set<int32_t> seen;
  for (int i = 0; i < 400; ++i) seen.insert(sampler.Sample(logits));
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1}));
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

}  // namespace
}  // namespace vtoken::model
