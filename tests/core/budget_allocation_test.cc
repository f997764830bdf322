// Budget allocation across KV groups: PyramidKV's per-layer schedule and AdaKV's per-head
// selection (lib/core/budget_allocation.h), on hand-worked examples and random inputs.
#include "lib/core/budget_allocation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace vtoken {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(BudgetAllocationTest, NamesRoundTrip) {
  for (BudgetAllocation a :
       {BudgetAllocation::kUniform, BudgetAllocation::kPyramid, BudgetAllocation::kAdaptive}) {
    StatusOr<BudgetAllocation> parsed = ParseBudgetAllocation(BudgetAllocationName(a));
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(*parsed, a);
  }
  EXPECT_EQ(ParseBudgetAllocation("pyramidkv").status().code(), StatusCode::kInvalidArgument);
}

TEST(PyramidBudgetsTest, HandWorkedSchedules) {
  // b_min = 5, b_max = 15: 15, 10, 5.
  EXPECT_EQ(PyramidBudgets(10, 3, 2), (std::vector<int64_t>{15, 10, 5}));
  // b_min = 1.6, b_max = 62.4: floors 62 and 1; the token the floors lost goes to the first layer.
  EXPECT_EQ(PyramidBudgets(32, 2, 20), (std::vector<int64_t>{63, 1}));
  // b_min = 0.4 rounds the last layer to 0; it borrows one token from the first.
  EXPECT_EQ(PyramidBudgets(8, 2, 20), (std::vector<int64_t>{15, 1}));
  // beta = 1 is flat.
  EXPECT_EQ(PyramidBudgets(7, 4, 1), (std::vector<int64_t>{7, 7, 7, 7}));
  // One layer keeps the budget.
  EXPECT_EQ(PyramidBudgets(5, 1, 20), (std::vector<int64_t>{5}));
  EXPECT_EQ(PyramidBudgets(1, 1, 1), (std::vector<int64_t>{1}));
  // As many tokens as layers: one each.
  EXPECT_EQ(PyramidBudgets(1, 6, 20), (std::vector<int64_t>(6, 1)));
}

// Calls check(budget, layers, beta, budgets) over a grid of schedules.
template <typename Check>
void ForEachSchedule(Check check) {
  for (int64_t budget : {1, 2, 3, 8, 32, 100, 512, 2048}) {
    for (int32_t layers : {1, 2, 3, 5, 16, 32, 80}) {
      for (double beta : {1.0, 1.5, 2.0, 5.0, 20.0}) {
        SCOPED_TRACE("budget " + std::to_string(budget) + " layers " + std::to_string(layers) +
                     " beta " + std::to_string(beta));
        const std::vector<int64_t> b = PyramidBudgets(budget, layers, beta);
        ASSERT_EQ(static_cast<int32_t>(b.size()), layers);
        check(budget, layers, beta, b);
      }
    }
  }
}

TEST(PyramidBudgetsTest, SumsExactlyAndGivesEveryLayerOne) {
  ForEachSchedule([](int64_t budget, int32_t layers, double, const std::vector<int64_t>& b) {
    EXPECT_EQ(std::accumulate(b.begin(), b.end(), int64_t{0}), budget * layers);
    for (int32_t l = 0; l < layers; ++l) EXPECT_GE(b[l], 1) << "layer " << l;
    if (layers == 1) EXPECT_EQ(b[0], budget);
  });
}

TEST(PyramidBudgetsTest, FirstAndLastFollowTheLinearSchedule) {
  ForEachSchedule([](int64_t budget, int32_t layers, double beta, const std::vector<int64_t>& b) {
    const double b_min = static_cast<double>(budget) / beta;
    const double b_max = 2.0 * static_cast<double>(budget) - b_min;
    if (layers == 1 || b_min < 1) return;  // Below 1 token, layers borrow from each other.
    EXPECT_LE(std::abs(static_cast<double>(b.front()) - b_max), 1.0) << b.front();
    EXPECT_LE(std::abs(static_cast<double>(b.back()) - b_min), 1.0) << b.back();
    for (int32_t l = 0; l < layers; ++l) {
      const double exact = b_max - (b_max - b_min) * l / (layers - 1);
      EXPECT_LE(std::abs(static_cast<double>(b[l]) - exact), 1.0) << "layer " << l;
    }
  });
}

// Regression: rounding a running sum once gave +1 bumps (PyramidBudgets(32, 32, 1.5) had 39, 40
// at layers 4, 5) and layers rounded to 0 borrowed from layer 0 first (PyramidBudgets(2, 16, 20)
// began 2, 4, 3).
TEST(PyramidBudgetsTest, NonIncreasingAcrossLayers) {
  ForEachSchedule([](int64_t, int32_t layers, double, const std::vector<int64_t>& b) {
    for (int32_t l = 1; l < layers; ++l) EXPECT_LE(b[l], b[l - 1]) << "layer " << l << " grows";
  });
  EXPECT_GE(PyramidBudgets(2, 16, 20)[0], PyramidBudgets(2, 16, 20)[1]);
}

// Counts for two heads with no protected tokens.
std::vector<int64_t> Keep(const std::vector<float>& a, const std::vector<float>& b, int64_t budget,
                          int64_t min_keep = 0) {
  const HeadCandidates heads[] = {{.scores = a, .kept = 0, .min_keep = min_keep},
                                  {.scores = b, .kept = 0, .min_keep = min_keep}};
  return AdaptiveKeepCounts(heads, budget);
}

TEST(AdaptiveKeepCountsTest, AFlatHeadGetsMoreThanAConcentratedOne) {
  // Normalised, the concentrated head is {1, 0, 0, 0} and the flat one {.25, .25, .25, .25}:
  // after a floor of one each, the two remaining slots go to the flat head.
  EXPECT_EQ(Keep({10, 0, 0, 0}, {1, 1, 1, 1}, 4, /*min_keep=*/1), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(Keep({1, 1, 1, 1}, {10, 0, 0, 0}, 4, /*min_keep=*/1), (std::vector<int64_t>{3, 1}));
  // Without a floor the concentrated head's one token still wins: 1 > .25.
  EXPECT_EQ(Keep({10, 0, 0, 0}, {1, 1, 1, 1}, 2), (std::vector<int64_t>{1, 1}));
}

TEST(AdaptiveKeepCountsTest, HandWorkedLayerWithProtectedTokens) {
  // Head 0 normalises to {.8, .1, 0, 0, .1}, head 1 (shifted by 2, divided by 3) to
  // {1/3, 0, 1/3, 0, 1/3}. Each keeps 2 protected tokens and a floor of 1.
  const std::vector<float> a = {8, 1, 0, 0, 1};
  const std::vector<float> b = {3, 2, 3, 2, 3};
  const HeadCandidates heads[] = {{.scores = a, .kept = 2, .min_keep = 1},
                                  {.scores = b, .kept = 2, .min_keep = 1}};
  // 8 - 6 = 2 left: head 1's two other 1/3.
  EXPECT_EQ(AdaptiveKeepCounts(heads, 8), (std::vector<int64_t>{1, 3}));
  // 4 left: then head 0's two 0.1.
  EXPECT_EQ(AdaptiveKeepCounts(heads, 10), (std::vector<int64_t>{3, 3}));
  // 6 left: then zeros, head 0 first on ties.
  EXPECT_EQ(AdaptiveKeepCounts(heads, 12), (std::vector<int64_t>{5, 3}));
  // Fewer candidates than the budget: every one.
  EXPECT_EQ(AdaptiveKeepCounts(heads, 100), (std::vector<int64_t>{5, 5}));
  // Floors win over a budget the protected tokens already fill.
  EXPECT_EQ(AdaptiveKeepCounts(heads, 4), (std::vector<int64_t>{1, 1}));
}

TEST(AdaptiveKeepCountsTest, InfiniteScoresAreAlwaysKept) {
  // Head 1's raw scores are higher, but +inf stays above every normalised score.
  EXPECT_EQ(Keep({kInf, 0, 5}, {9, 8, 7}, 1), (std::vector<int64_t>{1, 0}));
  // Then head 0's 5 normalises to 1 > 2/3.
  EXPECT_EQ(Keep({kInf, 0, 5}, {9, 8, 7}, 2), (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(Keep({kInf, 0, 5}, {9, 8, 7}, 3), (std::vector<int64_t>{2, 1}));
  // After the floors (an inf and head 1's best), the second inf beats head 1's remaining 0.
  EXPECT_EQ(Keep({kInf, kInf, 0}, {1, 2}, 3, /*min_keep=*/1), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(Keep({0, kInf, 0, kInf, kInf}, {5, 6, 7, 8}, 3), (std::vector<int64_t>{3, 0}));
}

TEST(AdaptiveKeepCountsTest, NaNScoresGoLast) {
  // Head 0's finite scores are equal: uniform 1/3 each, like head 1's; only the NaN is dropped.
  EXPECT_EQ(Keep({kNaN, 1, 1}, {0, 0, 0}, 5), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Keep({kNaN, kNaN}, {-5}, 1), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(Keep({kNaN, 5}, {3, 3}, 3), (std::vector<int64_t>{1, 2}));
  // A NaN ranks below a normalised 0.
  EXPECT_EQ(Keep({kNaN, kNaN, kNaN}, {0, 10}, 2), (std::vector<int64_t>{0, 2}));
}

TEST(AdaptiveKeepCountsTest, RandomLayersFillTheBudgetAndRespectFloors) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int iter = 0; iter < 2000; ++iter) {
    const int64_t num_heads = uniform(1, 6);
    std::vector<std::vector<float>> scores(static_cast<size_t>(num_heads));
    std::vector<HeadCandidates> heads(static_cast<size_t>(num_heads));
    int64_t kept = 0, floors = 0, candidates = 0;
    for (int64_t h = 0; h < num_heads; ++h) {
      const int64_t n = uniform(0, 24);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t kind = uniform(0, 19);
        scores[h].push_back(kind == 0   ? kInf
                            : kind == 1 ? kNaN
                                        : static_cast<float>(uniform(-1000, 1000)) / 100.0f);
      }
      heads[h] = {.scores = scores[h], .kept = uniform(0, 3), .min_keep = uniform(0, 6)};
      kept += heads[h].kept;
      floors += std::min<int64_t>(heads[h].min_keep, n);
      candidates += n;
    }
    const int64_t budget = uniform(kept + floors, kept + candidates);
    SCOPED_TRACE("iteration " + std::to_string(iter) + " budget " + std::to_string(budget));
    const std::vector<int64_t> keep = AdaptiveKeepCounts(heads, budget);
    ASSERT_EQ(static_cast<int64_t>(keep.size()), num_heads);
    int64_t total = kept;
    int64_t infs_above_floors = 0;
    for (int64_t h = 0; h < num_heads; ++h) {
      const int64_t n = static_cast<int64_t>(scores[h].size());
      EXPECT_GE(keep[h], std::min<int64_t>(heads[h].min_keep, n)) << "head " << h;
      EXPECT_LE(keep[h], n) << "head " << h;
      total += keep[h];
      const int64_t infs = std::count(scores[h].begin(), scores[h].end(), kInf);
      infs_above_floors += std::max<int64_t>(0, infs - std::min<int64_t>(heads[h].min_keep, n));
    }
    EXPECT_EQ(total, budget);
    // When the budget covers every +inf, each head keeps all of its +inf candidates.
    if (budget - kept - floors >= infs_above_floors) {
      for (int64_t h = 0; h < num_heads; ++h) {
        EXPECT_GE(keep[h], std::count(scores[h].begin(), scores[h].end(), kInf)) << "head " << h;
      }
    }
  }
}

}  // namespace
}  // namespace vtoken
