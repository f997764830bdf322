#include "lib/core/kv_cache_stats.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "lib/core/mix.h"
#include "lib/core/virtual_kv_cache.h"

namespace vtoken {
namespace {

TEST(KvCacheStatsTest, StatsReportWasteHistogramAndIdealBound) {
  VirtualKvCache cache({.mode = Mode::kNaive, .pool = {.num_blocks = 8, .block_size = 4}});
  const SeqId seq = cache.AddSequence();
  ASSERT_TRUE(cache.SyncNewTokens(seq, 12).ok());
  for (TokenId t = 0; t < 8; ++t) {
    if (t % 4 != 0) ASSERT_TRUE(cache.EvictToken(seq, t).ok()) << "token " << t;
  }
  FragStats s = cache.Stats();
  EXPECT_EQ(s.allocated_blocks, 3);
  EXPECT_EQ(s.live_slots, 6);
  EXPECT_DOUBLE_EQ(s.waste_ratio, 0.5);
  EXPECT_EQ(s.utilization_hist[1], 2);  // 1/4 = 25% utilization: bin [25, 50).
  EXPECT_EQ(s.utilization_hist[3], 1);
  EXPECT_EQ(s.ideal_blocks, 2);
  EXPECT_EQ(s.held_blocks, 3);
}

// SortBlocksById against std::stable_sort, on both sides of the insertion-sort cutoff and over
// id ranges of one to four radix digits, with repeated ids (tagged, to see stability).
TEST(SortBlocksByIdTest, MatchesStableSort) {
  const uint64_t seed = 20260501;
  std::printf("SortBlocksByIdTest seed %llu\n", static_cast<unsigned long long>(seed));
  uint64_t rng = seed;
  std::vector<BlockSnapshot> scratch;
  for (size_t n : {0, 1, 3, 17, 64, 65, 300, 4099}) {
    for (uint32_t max_id : {1u, 255u, 256u, 70000u, 0x7fffffffu}) {
      std::vector<BlockSnapshot> blocks(n);
      for (size_t i = 0; i < n; ++i) {
        blocks[i].block = static_cast<BlockId>(SplitMix64(rng) % (uint64_t{max_id} + 1));
        blocks[i].live = static_cast<int32_t>(i);
      }
      std::vector<BlockSnapshot> want = blocks;
      std::stable_sort(
          want.begin(), want.end(),
          [](const BlockSnapshot& a, const BlockSnapshot& b) { return a.block < b.block; });
      SortBlocksById(blocks, scratch);
      ASSERT_EQ(blocks.size(), n);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(blocks[i].block, want[i].block)
            << "n " << n << " max_id " << max_id << " at " << i;
        ASSERT_EQ(blocks[i].live, want[i].live) << "n " << n << " max_id " << max_id << " at " << i;
      }
    }
  }
}

}  // namespace
}  // namespace vtoken
