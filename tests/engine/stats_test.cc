#include "lib/engine/stats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace vtoken::engine {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

TEST(PercentileTest, InterpolatesBetweenClosestRanks) {
  // rank = 0.5 * 3 = 1.5 -> 2 + 0.5 * (3 - 2).
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3, 4}, 50), 2.5);
  // rank = 0.95 * 4 = 3.8 -> 40 + 0.8 * (50 - 40).
  EXPECT_DOUBLE_EQ(Percentile({10, 20, 30, 40, 50}, 95), 48.0);
  // rank = 0.25 * 4 = 1 exactly -> the second value.
  EXPECT_DOUBLE_EQ(Percentile({10, 20, 30, 40, 50}, 25), 20.0);
}

TEST(PercentileTest, P99OfOneToHundred) {
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  // rank = 0.99 * 99 = 98.01 -> 99 + 0.01 * (100 - 99).
  EXPECT_NEAR(Percentile(v, 99), 99.01, 1e-12);
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1.0);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 100.0);
}

TEST(PercentileTest, SortsItsInput) {
  EXPECT_DOUBLE_EQ(Percentile({5, 1, 3}, 50), 3.0);
  EXPECT_DOUBLE_EQ(Percentile({5, 1, 3}, 100), 5.0);
}

TEST(PercentileTest, SingleValue) {
  for (double p : {0.0, 37.5, 100.0}) EXPECT_DOUBLE_EQ(Percentile({7.25}, p), 7.25);
}

TEST(PercentileTest, NoDataOrBadPercentIsNaN) {
  EXPECT_TRUE(std::isnan(Percentile({}, 50)));
  EXPECT_TRUE(std::isnan(Percentile({kNaN, kNaN}, 50)));
  EXPECT_TRUE(std::isnan(Percentile({1, 2}, -1)));
  EXPECT_TRUE(std::isnan(Percentile({1, 2}, 100.5)));
  EXPECT_TRUE(std::isnan(Percentile({1, 2}, kNaN)));
}

TEST(PercentileTest, NaNValuesAreDropped) {
  // {1, 3} remain: rank 0.5 -> 2.
  EXPECT_DOUBLE_EQ(Percentile({kNaN, 3, 1}, 50), 2.0);
}

TEST(MeanTest, SkipsNaN) {
  EXPECT_DOUBLE_EQ(Mean({1, 2, kNaN, 6}), 3.0);
  EXPECT_TRUE(std::isnan(Mean({})));
}

TEST(SummarizeTest, HandComputed) {
  // sorted 1 2 3 4 100; mean 110 / 5 = 22; p50 rank 2 -> 3;
  // p95 rank 3.8 -> 4 + 0.8 * 96 = 80.8; p99 rank 3.96 -> 4 + 0.96 * 96 = 96.16.
  const LatencySummary s = Summarize({100, 3, 1, kNaN, 4, 2});
  EXPECT_EQ(s.count, 5);
  EXPECT_DOUBLE_EQ(s.mean, 22.0);
  EXPECT_DOUBLE_EQ(s.p50, 3.0);
  EXPECT_DOUBLE_EQ(s.p95, 80.8);
  EXPECT_DOUBLE_EQ(s.p99, 96.16);
  EXPECT_DOUBLE_EQ(s.max, 100.0);
}

TEST(SummarizeTest, EmptyIsNaN) {
  const LatencySummary s = Summarize({});
  EXPECT_EQ(s.count, 0);
  EXPECT_TRUE(std::isnan(s.mean));
  EXPECT_TRUE(std::isnan(s.p50));
  EXPECT_TRUE(std::isnan(s.p95));
  EXPECT_TRUE(std::isnan(s.p99));
  EXPECT_TRUE(std::isnan(s.max));
}

TEST(MeanCiTest, StudentTCriticalValues) {
  EXPECT_DOUBLE_EQ(StudentT975(1), 12.706);
  EXPECT_DOUBLE_EQ(StudentT975(2), 4.303);
  EXPECT_DOUBLE_EQ(StudentT975(30), 2.042);
  EXPECT_NEAR(StudentT975(40), 2.021, 0.003);   // exact 2.0211
  EXPECT_NEAR(StudentT975(120), 1.980, 0.002);  // exact 1.9799
  EXPECT_TRUE(std::isnan(StudentT975(0)));
}

TEST(MeanCiTest, ThreeSeedsUseTWithTwoDegreesOfFreedom) {
  // mean 2, sample sd 1: half-width 4.303 * 1 / sqrt(3).
  const MeanCi m = MeanCi95({1.0, 2.0, 3.0});
  EXPECT_EQ(m.count, 3);
  EXPECT_DOUBLE_EQ(m.mean, 2.0);
  EXPECT_NEAR(m.half_width, 4.303 / std::sqrt(3.0), 1e-12);
}

TEST(MeanCiTest, OneValueHasNoIntervalAndNaNsAreDropped) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const MeanCi one = MeanCi95({5.0, nan});
  EXPECT_EQ(one.count, 1);
  EXPECT_DOUBLE_EQ(one.mean, 5.0);
  EXPECT_TRUE(std::isnan(one.half_width));
  const MeanCi none = MeanCi95({nan});
  EXPECT_EQ(none.count, 0);
  EXPECT_TRUE(std::isnan(none.mean));
  EXPECT_DOUBLE_EQ(MeanCi95({4.0, 4.0}).half_width, 0.0);
}

}  // namespace
}  // namespace vtoken::engine
