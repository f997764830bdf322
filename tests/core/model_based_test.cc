// Model-based randomized tests: random operation sequences applied to the real structures and to
// CheckHarness's naive reference model (logical token -> content bytes), with invariants and every
// live token's bytes verified after every operation. Seeds are printed on failure.
#include <gtest/gtest.h>

#include <ostream>

#include "lib/core/check_harness.h"

namespace vtoken {
namespace {

struct Config {
  const char* name;
  int32_t block_size;
  int32_t num_blocks;
  bool async;
  int64_t steps;
};

// Keeps ctest's listing readable (gtest would print the struct's bytes).
void PrintTo(const Config& c, std::ostream* os) { *os << c.name; }

class ModelBasedTest : public ::testing::TestWithParam<Config> {};

// 4 configurations x 50,000 operations = 200,000 operations per run.
TEST_P(ModelBasedTest, RandomOperationsKeepInvariantsAndBytes) {
  const Config& c = GetParam();
  CheckOptions o;
  o.seed = 0x5eed0000 + static_cast<uint64_t>(c.block_size);
  o.steps = c.steps;
  o.pool = {.num_blocks = c.num_blocks, .block_size = c.block_size, .headroom_blocks = 4};
  o.async_copies = c.async;
  o.copy_delay_us = c.async ? 20 : 0;
  o.num_layers = 2;
  o.bytes_per_token = 16;
  StatusOr<CheckReport> r = RunCheck(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  SCOPED_TRACE("seed " + std::to_string(o.seed) + ", config " + c.name);
  EXPECT_EQ(r->violations, 0) << (r->first_violations.empty() ? "" : r->first_violations[0]);
  EXPECT_EQ(r->steps, c.steps);
  if (c.block_size == 1) {
    EXPECT_EQ(r->tokens_moved, 0);  // One-slot blocks are never partially live.
  } else {
    EXPECT_GT(r->tokens_moved, 500);
  }
  EXPECT_EQ(r->hash_checks, r->tokens_moved);
  EXPECT_GT(r->evictions, c.steps / 10);
  EXPECT_GT(r->forks, 0);
  EXPECT_GT(r->pool_exhausted, 0) << "the pool never ran out: exhaustion paths untested";
  EXPECT_EQ(r->invariant_checks, c.steps + 1);
}

INSTANTIATE_TEST_SUITE_P(Ops, ModelBasedTest,
                         ::testing::Values(Config{"sync_bs16", 16, 24, false, 50000},
                                           Config{"async_bs3", 3, 120, true, 50000},
                                           Config{"sync_bs1", 1, 360, false, 50000},
                                           Config{"async_bs64", 64, 12, true, 50000}),
                         [](const ::testing::TestParamInfo<Config>& info) {
                           return std::string(info.param.name);
                         });

// The same operation trace against naive and vtoken caches: after a full reclaim pass vtoken never
// holds more blocks than naive, and every sequence without shared blocks holds at most
// ceil(live / block_size) + 1 blocks (its packed tokens plus the open tail).
TEST(ModelBasedTest, VtokenNeverHoldsMoreBlocksThanNaiveOnTheSameTrace) {
  for (int32_t bs : {1, 3, 16, 64}) {
    CheckOptions o;
    o.seed = 77 + static_cast<uint64_t>(bs);
    o.pool = {.num_blocks = 40000 / bs + 64, .block_size = bs, .headroom_blocks = 8};
    o.fork_only_fresh = true;
    o.verify_every_op = false;
    o.reclaim.max_moves_per_step = 1 << 30;
    CheckOptions naive_options = o;
    naive_options.mode = Mode::kNaive;
    CheckHarness vtoken(o);
    CheckHarness naive(naive_options);
    uint64_t state = o.seed;
    int64_t strictly_fewer = 0;
    for (int step = 0; step < 4000; ++step) {
      const uint64_t a = SplitMix64(state), b = SplitMix64(state), c = SplitMix64(state);
      vtoken.Step(a, b, c);
      naive.Step(a, b, c);
      vtoken.ReclaimFully();
      const int32_t v = vtoken.cache().pool().num_allocated_blocks();
      const int32_t n = naive.cache().pool().num_allocated_blocks();
      ASSERT_LE(v, n) << "seed " << o.seed << " block size " << bs << " step " << step;
      if (v < n) ++strictly_fewer;
      for (SeqId seq : vtoken.sequences()) {
        const TokenTable& t = vtoken.cache().table(seq);
        bool shared = false;
        for (BlockId blk : t.blocks()) shared |= vtoken.cache().pool().refcount(blk) > 1;
        if (shared) continue;
        ASSERT_LE(t.num_blocks(), (t.num_live() + bs - 1) / bs + 1)
            << "seed " << o.seed << " block size " << bs << " step " << step << " seq " << seq;
      }
    }
    ASSERT_EQ(vtoken.report().pool_exhausted, 0);
    ASSERT_EQ(naive.report().pool_exhausted, 0);
    EXPECT_EQ(vtoken.report().violations, 0);
    EXPECT_EQ(naive.report().violations, 0);
    if (bs > 1) EXPECT_GT(strictly_fewer, 400) << "block size " << bs;
    if (bs == 1) EXPECT_EQ(strictly_fewer, 0);
  }
}

}  // namespace
}  // namespace vtoken
