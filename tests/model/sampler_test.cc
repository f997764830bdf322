#include "lib/model/sampler.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace vtoken::model {
namespace {

TEST(SamplerTest, GreedyPicksArgmaxLowestIdOnTies) {
  Sampler greedy;
  EXPECT_EQ(greedy.Sample(torch::tensor({0.1f, 2.0f, -1.0f, 2.0f})), 1);
  EXPECT_EQ(greedy.Sample(torch::tensor({-3.0, -2.0, -2.5}, torch::kDouble)), 1);
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
