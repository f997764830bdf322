// `vtoken-cli check --policy NAME` for every registered policy: the randomized relocation
// workload with the policy choosing every eviction finds no violation.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "lib/core/check_harness.h"
#include "lib/core/policy_evictor.h"
#include "lib/core/policy_registry.h"
#include "lib/core/synthetic_signals.h"

namespace vtoken {
namespace {

// Runs the check with `policy` choosing the victims; returns the report.
CheckReport ExpectCleanCheck(const std::string& policy, const CheckOptions& options,
                             const EvictorOptions& evictor_options) {
  SCOPED_TRACE(policy + " seed " + std::to_string(options.seed));
  StatusOr<std::unique_ptr<PolicyEvictor>> evictor =
      PolicyEvictor::Create(policy, {}, evictor_options);
  EXPECT_TRUE(evictor.ok()) << evictor.status().ToString();
  if (!evictor.ok()) return {};
  SyntheticSignalDriver driver(**evictor);
  StatusOr<CheckReport> report = RunCheck(options, &driver);
  EXPECT_TRUE(report.ok()) << report.status().ToString();
  if (!report.ok()) return {};
  EXPECT_EQ(report->violations, 0)
      << (report->first_violations.empty() ? std::string() : report->first_violations.front());
  EXPECT_TRUE(driver.status().ok()) << driver.status().ToString();
  EXPECT_GT(driver.victims(), 0);
  EXPECT_EQ(report->evictions, driver.victims());
  return *report;
}

uint64_t Seed() {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

TEST(PolicyCheckTest, EveryRegisteredPolicyDrivesACleanCheck) {
  const uint64_t seed = Seed();
  for (const PolicyInfo* info : RegisteredPolicies()) {
    CheckOptions options;
    options.seed = seed;
    options.steps = 2000;
    ExpectCleanCheck(info->name, options, {.budget_tokens = 32, .seed = seed});
  }
}

TEST(PolicyCheckTest, ProtectionIntervalsRatiosAsyncCopiesAndNaiveMode) {
  const uint64_t seed = Seed();
  CheckOptions options;
  options.seed = seed;
  options.steps = 2000;
  options.async_copies = true;
  const CheckReport report = ExpectCleanCheck(
      "h2o", options, {.keep_ratio = 0.5, .num_sink = 4, .num_recent = 8, .evict_interval = 3});
  EXPECT_GT(report.relocations, 0);  // Heavy hitters leave sparse blocks behind.
  options.mode = Mode::kNaive;
  options.async_copies = false;
  ExpectCleanCheck("snapkv", options, {.budget_tokens = 16, .num_sink = 2});
}

}  // namespace
}  // namespace vtoken
