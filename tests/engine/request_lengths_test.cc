#include "lib/engine/request_lengths.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "lib/engine/workload.h"
#include "tests/engine/workload_fixture.h"

namespace vtoken::engine {
namespace {

TEST_F(WorkloadTest, ShareGptLikeLengthsMatchTheirMeans) {
  const uint64_t seed = RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  WorkloadOptions o;
  o.num_requests = 20000;
  o.seed = seed;
  const auto r = MustGenerate(o, nullptr, 32000);
  ASSERT_EQ(r.size(), 20000u);
  std::vector<double> in, out;
  for (const Request& q : r) {
    ASSERT_GE(q.prompt_tokens.size(), 1u);
    ASSERT_GE(q.max_tokens, 1);
    in.push_back(static_cast<double>(q.prompt_tokens.size()));
    out.push_back(static_cast<double>(q.max_tokens));
    EXPECT_EQ(q.prefix_group, -1);
    EXPECT_EQ(q.arrival_s, 0.0);
    EXPECT_FALSE(q.reference.has_value());
    EXPECT_TRUE(q.prompt.empty());
  }
  // Lognormal sigma 0.8: stddev = mean * sqrt(e^0.64 - 1) ~ 0.95 mean, so the standard error of
  // the mean is ~0.7% of it; 5% is a > 7 sigma margin.
  EXPECT_NEAR(MomentsOf(in).mean, 230.0, 0.05 * 230.0);
  EXPECT_NEAR(MomentsOf(out).mean, 200.0, 0.05 * 200.0);
  EXPECT_NEAR(MomentsOf(in).stddev / MomentsOf(in).mean, 0.947, 0.15);
}

TEST_F(WorkloadTest, LongBenchLikeLengthsAreUniformInTheirRanges) {
  const uint64_t seed = RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  WorkloadOptions o;
  o.kind = "longbench_like";
  o.num_requests = 4000;
  o.seed = seed;
  o.input_min = 600;
  o.input_max = 900;
  const auto r = MustGenerate(o, nullptr, 2048);
  std::vector<double> in, out;
  for (const Request& q : r) {
    ASSERT_GE(q.prompt_tokens.size(), 600u);
    ASSERT_LE(q.prompt_tokens.size(), 900u);
    ASSERT_GE(q.max_tokens, 128);
    ASSERT_LE(q.max_tokens, 512);
    for (int32_t id : q.prompt_tokens) ASSERT_TRUE(id >= 0 && id < 2048) << id;
    in.push_back(static_cast<double>(q.prompt_tokens.size()));
    out.push_back(static_cast<double>(q.max_tokens));
  }
  // Uniform: mean 750 (sd 87, s.e. 1.4) and 320 (sd 111, s.e. 1.8).
  EXPECT_NEAR(MomentsOf(in).mean, 750.0, 10.0);
  EXPECT_NEAR(MomentsOf(out).mean, 320.0, 12.0);
  EXPECT_NEAR(MomentsOf(in).stddev, 300.0 / std::sqrt(12.0), 8.0);

  WorkloadOptions defaults;
  defaults.kind = "longbench_like";
  defaults.num_requests = 8;
  defaults.seed = seed;
  for (const Request& q : MustGenerate(defaults, nullptr, 100)) {
    EXPECT_GE(q.prompt_tokens.size(), 2048u);
    EXPECT_LE(q.prompt_tokens.size(), 16384u);
  }
}

TEST_F(WorkloadTest, MaxTotalTokensScalesLongRequestsDown) {
  WorkloadOptions o;
  o.kind = "longbench_like";
  o.num_requests = 200;
  o.input_min = 600;
  o.input_max = 900;
  const auto free = MustGenerate(o, nullptr, 100);
  o.max_total_tokens = 1024;
  const auto clamped = MustGenerate(o, nullptr, 100);
  int scaled = 0;
  for (size_t i = 0; i < free.size(); ++i) {
    const auto in = static_cast<int64_t>(free[i].prompt_tokens.size());
    const int64_t out = free[i].max_tokens;
    const auto in2 = static_cast<int64_t>(clamped[i].prompt_tokens.size());
    if (in + out <= 1024) {
      EXPECT_EQ(in2, in);
      EXPECT_EQ(clamped[i].max_tokens, out);
    } else {
      ++scaled;
      // e.g. 900 + 512 -> floor(900 * 1024 / 1412) = 652 and 1024 - 652 = 372.
      EXPECT_EQ(in2, in * 1024 / (in + out));
      EXPECT_EQ(clamped[i].max_tokens, 1024 - in2);
    }
  }
  EXPECT_GT(scaled, 50);
}

}  // namespace
}  // namespace vtoken::engine
