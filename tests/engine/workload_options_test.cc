#include "lib/engine/workload_options.h"

#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "lib/engine/workload.h"
#include "tests/engine/workload_fixture.h"

namespace vtoken::engine {
namespace {

TEST(WorkloadOptionsTest, CountsAreBoundedBeforeArithmetic) {
  WorkloadOptions o;
  o.kind = "longbench_like";
  o.output_min = o.output_max = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(ValidateWorkloadOptions(o).message(),
            "workload option output_min = 9223372036854775807: must be <= 2147483647");
  o.output_min = o.output_max = kMaxRequestTokens;
  o.input_min = o.input_max = kMaxRequestTokens;
  o.num_requests = 2;
  ASSERT_TRUE(ValidateWorkloadOptions(o).ok());
  // The largest lengths still add up without overflow (the context check sees the true sum).
  o.max_total_tokens = 1024;
  const auto r = GenerateWorkload(o, nullptr, 100);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(static_cast<int64_t>((*r)[0].prompt_tokens.size()) + (*r)[0].max_tokens, 1024);
  o.input_mean = 1e300;
  o.kind = "sharegpt_like";
  EXPECT_EQ(ValidateWorkloadOptions(o).message(),
            "workload option input_mean = 1e+300: must be <= 2147483647");
}

TEST(WorkloadOptionsTest, WorkloadBytesGrowsWithRequestsAndLengths) {
  WorkloadOptions o;
  o.kind = "longbench_like";
  o.num_requests = 10;
  o.input_min = o.input_max = 1000;
  o.output_min = o.output_max = 100;
  const int64_t ten = WorkloadBytes(o);
  EXPECT_EQ(ten, 10 * (512 + 1000 * 8 + 100 * 128));
  o.num_requests = 100000000;
  EXPECT_EQ(WorkloadBytes(o), ten * 10000000);
  o.max_total_tokens = 500;  // Both lengths are cut to the total.
  EXPECT_EQ(WorkloadBytes(o), 100000000LL * (512 + 500 * 8 + 100 * 128));
}

TEST(WorkloadOptionsTest, InvalidFieldsAreNamed) {
  const std::vector<std::pair<std::function<void(WorkloadOptions&)>, std::string>> cases = {
      {[](auto& o) { o.kind = "alpaca"; }, "workload option kind = alpaca: "},
      {[](auto& o) { o.num_requests = 0; }, "workload option num_requests = 0: "},
      {[](auto& o) { o.input_mean = 0; }, "workload option input_mean = 0: "},
      {[](auto& o) { o.output_mean = -1; }, "workload option output_mean = -1: "},
      {[](auto& o) { o.length_sigma = -0.5; }, "workload option length_sigma = -0.5: "},
      {[](auto& o) { o.input_min = 0; }, "workload option input_min = 0: "},
      {[](auto& o) { o.input_max = 100; }, "workload option input_max = 100: "},
      {[](auto& o) { o.output_min = 0; }, "workload option output_min = 0: "},
      {[](auto& o) { o.output_max = 5; }, "workload option output_max = 5: "},
      {[](auto& o) { o.max_total_tokens = 1; }, "workload option max_total_tokens = 1: "},
      {[](auto& o) { o.arrival = "burst"; }, "workload option arrival = burst: "},
      {[](auto& o) {
         o.arrival = "poisson";
         o.rate = 0;
       },
       "workload option rate = 0: "},
      {[](auto& o) {
         o.arrival = "gamma";
         o.gamma_cv = 0;
       },
       "workload option gamma_cv = 0: "},
      {[](auto& o) { o.prefix_sharing_degree = 0; }, "workload option prefix_sharing_degree = 0: "},
      {[](auto& o) { o.prefix_sharing_degree = 3; },
       "workload option prefix_sharing_degree = 3: must be 1, 2, 4 or 8"},
      {[](auto& o) { o.jsonl_path = "w.jsonl"; },
       "workload option jsonl = w.jsonl: is read only by kind jsonl (kind is sharegpt_like)"},
      {[](auto& o) { o.num_requests = 2147483648; },
       "workload option num_requests = 2147483648: must be <= 2147483647"},
      {[](auto& o) { o.length_sigma = 50; },
       "workload option length_sigma = 50: must be in [0, 10]"},
      {[](auto& o) { o.shared_prefix_fraction = 1.0; },
       "workload option shared_prefix_fraction = 1: "},
      {[](auto& o) { o.kind = "jsonl"; }, "workload option jsonl_path = \"\": "},
      {[](auto& o) {
         o.kind = "jsonl";
         o.jsonl_path = "x";
         o.prefix_sharing_degree = 2;
       },
       "workload option prefix_sharing_degree = 2: "},
  };
  EXPECT_TRUE(ValidateWorkloadOptions(WorkloadOptions{}).ok());
  for (const auto& [mutate, prefix] : cases) {
    WorkloadOptions o;
    mutate(o);
    const Status s = ValidateWorkloadOptions(o);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << prefix;
    EXPECT_EQ(s.message().rfind(prefix, 0), 0u) << s.message();
    EXPECT_EQ(GenerateWorkload(o, nullptr, 100).status().message(), s.message());
  }
}

// The field an error names, for a caller that can say where it came from (a config's line).
TEST(WorkloadOptionFieldTest, NamesTheFieldOfAWorkloadOptionErrorOnly) {
  WorkloadOptions o;
  o.input_min = 100;
  o.input_max = 50;
  EXPECT_EQ(WorkloadOptionField(ValidateWorkloadOptions(o)), "input_max");
  EXPECT_EQ(WorkloadOptionField(WorkloadOptionError("rate", "0", "must be > 0")), "rate");
  EXPECT_EQ(WorkloadOptionField(Status::Ok()), "");
  EXPECT_EQ(WorkloadOptionField(InvalidArgumentError("num_blocks must be >= 1")), "");
  EXPECT_EQ(WorkloadOptionField(NotFoundError("workload option x = 1: y")), "");
}

}  // namespace
}  // namespace vtoken::engine
