#include "lib/engine/arrivals.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "lib/engine/workload.h"
#include "tests/engine/workload_fixture.h"

namespace vtoken::engine {
namespace {

TEST_F(WorkloadTest, AllArriveAtZero) {
  for (const Request& q : MustGenerate(TinyRequests(10, 1), nullptr, 10)) {
    EXPECT_EQ(q.arrival_s, 0.0);
  }
}

std::vector<double> Gaps(const std::vector<Request>& r) {
  std::vector<double> gaps;
  for (size_t i = 1; i < r.size(); ++i) gaps.push_back(r[i].arrival_s - r[i - 1].arrival_s);
  return gaps;
}

TEST_F(WorkloadTest, PoissonArrivals) {
  const uint64_t seed = RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  WorkloadOptions o = TinyRequests(20001, seed);
  o.arrival = "poisson";
  o.rate = 4;
  const auto r = MustGenerate(o, nullptr, 10);
  EXPECT_EQ(r[0].arrival_s, 0.0);
  const std::vector<double> gaps = Gaps(r);
  for (double g : gaps) ASSERT_GE(g, 0.0);
  // Exponential gaps: mean = sd = 1/rate = 0.25; s.e. of the mean 0.0018.
  const Moments m = MomentsOf(gaps);
  EXPECT_NEAR(m.mean, 0.25, 0.0125);
  EXPECT_NEAR(m.stddev / m.mean, 1.0, 0.05);
}

TEST_F(WorkloadTest, GammaArrivals) {
  const uint64_t seed = RandomSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (double cv : {0.5, 2.0}) {  // shape 4 and 0.25: both branches of the gamma sampler
    SCOPED_TRACE("cv " + std::to_string(cv));
    WorkloadOptions o = TinyRequests(20001, seed);
    o.arrival = "gamma";
    o.rate = 4;
    o.gamma_cv = cv;
    const std::vector<double> gaps = Gaps(MustGenerate(o, nullptr, 10));
    for (double g : gaps) ASSERT_GE(g, 0.0);
    const Moments m = MomentsOf(gaps);
    EXPECT_NEAR(m.mean, 0.25, 0.25 * 0.05 * cv);
    EXPECT_NEAR(m.stddev / m.mean, cv, 0.1 * cv);
  }
}

}  // namespace
}  // namespace vtoken::engine
