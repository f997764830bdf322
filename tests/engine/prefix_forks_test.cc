// Prefix forks seen through RunEngine with the scripted runner of fake_runner.h.
#include "lib/engine/prefix_forks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "tests/engine/fake_runner.h"

namespace vtoken::engine {
namespace {

// Four requests share a 150-token prefix: members fork the leader's prefix blocks instead of
// recomputing them, outputs equal those of unshared requests, and fewer blocks are held.
TEST(PrefixForksTest, PrefixGroupsShareBlocksAndKeepOutputs) {
  std::vector<Request> plain = Requests(4, 200, 40, 21);
  for (Request& r : plain) {
    std::copy(plain[0].prompt_tokens.begin(), plain[0].prompt_tokens.begin() + 150,
              r.prompt_tokens.begin());
  }
  std::vector<Request> grouped = plain;
  for (Request& r : grouped) {
    r.prefix_group = 0;
    r.shared_prefix_tokens = 150;
  }
  for (Mode mode : {Mode::kNative, Mode::kVtoken}) {
    StatusOr<EngineResult> a = RunWith(Opts(mode, 400), plain);
    StatusOr<EngineResult> b = RunWith(Opts(mode, 400), grouped);
    ASSERT_TRUE(a.ok() && b.ok()) << b.status().ToString();
    EXPECT_EQ(a->forks, 0);
    EXPECT_EQ(b->forks, 3);
    EXPECT_EQ(b->violations, 0);
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_EQ(a->requests[i].output_tokens, b->requests[i].output_tokens) << i;
    }
    int32_t peak_a = 0, peak_b = 0;
    for (const StepRecord& s : a->steps) peak_a = std::max(peak_a, s.allocated_blocks);
    for (const StepRecord& s : b->steps) peak_b = std::max(peak_b, s.allocated_blocks);
    EXPECT_LT(peak_b, peak_a) << ModeName(mode);
  }
}

}  // namespace
}  // namespace vtoken::engine
