// Exclusive parameter bounds of the policy SDK (policy_params.h: ExclusiveMin / ExclusiveMax).
#include <gtest/gtest.h>

#include <vector>

#include "lib/core/policy_params.h"

namespace vtoken {
namespace {

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
