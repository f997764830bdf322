// The scoring helpers of the policy SDK (policy.h: Quantile, Ranks) and exclusive parameter
// bounds (policy_params.h: ExclusiveMin / ExclusiveMax).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "lib/core/policy.h"
#include "lib/core/policy_params.h"

namespace vtoken {
namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(QuantileTest, InterpolatesLinearlyLikeNumpy) {
  const std::vector<float> v = {4, 1, 3, 2, 5};
  EXPECT_FLOAT_EQ(Quantile(v, 0.0), 1);
  EXPECT_FLOAT_EQ(Quantile(v, 0.5), 3);
  EXPECT_FLOAT_EQ(Quantile(v, 1.0), 5);
  EXPECT_FLOAT_EQ(Quantile(v, 0.1), 1.4f);   // numpy.quantile([1..5], 0.1) = 1.4
  EXPECT_FLOAT_EQ(Quantile(v, 0.75), 4);
  EXPECT_FLOAT_EQ(Quantile(std::vector<float>{7}, 0.3), 7);
}

TEST(QuantileTest, IgnoresNaNAndRefusesBadQ) {
  EXPECT_FLOAT_EQ(Quantile(std::vector<float>{kNaN, 2, kNaN, 4}, 0.5), 3);
  EXPECT_TRUE(std::isnan(Quantile(std::vector<float>{kNaN}, 0.5)));
  EXPECT_TRUE(std::isnan(Quantile(std::vector<float>{}, 0.5)));
  EXPECT_TRUE(std::isnan(Quantile(std::vector<float>{1, 2}, 1.5)));
}

TEST(RanksTest, NormalisedRanksWithTiesAndNaNLowest) {
  EXPECT_EQ(Ranks(std::vector<float>{30, 10, 20}), (std::vector<float>{1.0f, 0.0f, 0.5f}));
  // Ties share their mean rank: positions 1 and 2 of 0..3 -> 1.5 / 3 = 0.5.
  EXPECT_EQ(Ranks(std::vector<float>{5, 7, 7, 9}), (std::vector<float>{0.0f, 0.5f, 0.5f, 1.0f}));
  EXPECT_EQ(Ranks(std::vector<float>{kNaN, 1, 2}), (std::vector<float>{0.0f, 0.5f, 1.0f}));
  EXPECT_EQ(Ranks(std::vector<float>{3}), (std::vector<float>{0.5f}));
}

TEST(ParamBoundsTest, ExclusiveEndsAreRefusedAndPrintedOpen) {
  const std::vector<ParamSpec> specs = {
      DoubleParam("decay", 0.9, "per-step decay", 0, 1).ExclusiveMin(),
      IntParam("window", 4, "steps", 0, 8).ExclusiveMax()};
  EXPECT_TRUE(ResolveParams("p", specs, {{"decay", 1.0}}).ok());
  StatusOr<PolicyParams> zero = ResolveParams("p", specs, {{"decay", 0.0}});
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().message(), "policy 'p': parameter 'decay' = 0 is outside (0, 1]");
  EXPECT_TRUE(ResolveParams("p", specs, {{"window", int64_t{0}}}).ok());
  StatusOr<PolicyParams> eight = ResolveParams("p", specs, {{"window", int64_t{8}}});
  ASSERT_FALSE(eight.ok());
  EXPECT_EQ(eight.status().message(), "policy 'p': parameter 'window' = 8 is outside [0, 8)");
}

}  // namespace
}  // namespace vtoken
