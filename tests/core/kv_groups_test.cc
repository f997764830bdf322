// VirtualKvCache with KV groups (CacheOptions::num_groups): every group of a sequence has its own
// token table and its own blocks; eviction, forks, relocation and statistics act per group.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <span>
#include <vector>

#include "lib/core/reclaim_planner.h"
#include "lib/core/types.h"
#include "lib/core/virtual_kv_cache.h"

namespace vtoken {
namespace {

CacheOptions Options(Mode mode, int32_t num_groups, int32_t block_size = 4,
                     int32_t num_blocks = 128) {
  return {.mode = mode,
          .pool = {.num_blocks = num_blocks, .block_size = block_size, .headroom_blocks = 4},
          .num_groups = num_groups};
}

#define EXPECT_INVARIANTS(cache)                 \
  do {                                           \
    const Status _s = (cache).CheckInvariants(); \
    EXPECT_TRUE(_s.ok()) << _s.ToString();       \
  } while (0)

// The blocks group `g` of `seq` reads.
std::set<BlockId> GroupBlocks(const VirtualKvCache& cache, SeqId seq, int32_t g) {
  const std::vector<BlockId>& b = cache.table(seq, g).blocks();
  return {b.begin(), b.end()};
}

class GroupCountTest : public ::testing::TestWithParam<int32_t> {};

TEST_P(GroupCountTest, SyncNewTokensGivesEveryGroupItsOwnSlotsAndBlocks) {
  const int32_t groups = GetParam();
  const int32_t bs = 4;
  const int64_t n = 10;  // 2 full blocks and a tail of 2 per group.
  VirtualKvCache cache(Options(Mode::kVtoken, groups, bs));
  const SeqId seq = cache.AddSequence();
  StatusOr<std::vector<SlotIndex>> slots = cache.SyncNewTokens(seq, n);
  ASSERT_TRUE(slots.ok()) << slots.status().ToString();
  ASSERT_EQ(static_cast<int64_t>(slots->size()), groups * n);
  std::set<BlockId> seen;
  for (int32_t g = 0; g < groups; ++g) {
    SCOPED_TRACE("group " + std::to_string(g));
    const std::span<const SlotIndex> mine(slots->data() + g * n, static_cast<size_t>(n));
    EXPECT_EQ(cache.LiveSlots(seq, g), std::vector<SlotIndex>(mine.begin(), mine.end()));
    const std::set<BlockId> blocks = GroupBlocks(cache, seq, g);
    EXPECT_EQ(blocks.size(), 3u);
    for (int64_t i = 0; i < n; ++i) {
      const BlockId b = cache.pool().BlockOf(mine[i]);
      EXPECT_TRUE(blocks.count(b)) << "token " << i << " in block " << b;
      // Tokens fill a block in order: i and i - 1 share a block unless i starts one.
      if (i > 0) EXPECT_EQ(b == cache.pool().BlockOf(mine[i - 1]), i % bs != 0) << i;
    }
    for (BlockId b : blocks) {
      EXPECT_TRUE(seen.insert(b).second) << "block " << b << " is in two groups";
    }
    EXPECT_EQ(cache.table(seq, g).num_live(), n);
  }
  EXPECT_EQ(cache.num_live(seq), groups * n);
  EXPECT_EQ(cache.num_tokens(seq), n);
  EXPECT_EQ(cache.num_blocks_held(seq), 3 * groups);
  EXPECT_EQ(cache.IdealBlocks(seq), 3 * groups);
  EXPECT_EQ(cache.pool().num_allocated_blocks(), 3 * groups);
  const FragStats stats = cache.Stats();
  EXPECT_EQ(stats.num_groups, groups);
  EXPECT_EQ(stats.ideal_blocks, 3 * groups);
  EXPECT_EQ(stats.held_blocks, 3 * groups);
  EXPECT_EQ(stats.live_slots, groups * n);
  const CacheSnapshot snap = cache.Snapshot();
  ASSERT_EQ(static_cast<int32_t>(snap.seqs.size()), groups);
  for (int32_t g = 0; g < groups; ++g) {
    EXPECT_EQ(snap.seqs[g].group, g);
    EXPECT_EQ(snap.seqs[g].num_live, n);
    EXPECT_EQ(snap.seqs[g].blocks.size(), 3u);
  }
  EXPECT_INVARIANTS(cache);
}

TEST_P(GroupCountTest, StatsSumOverGroupsAfterPerGroupEvictions) {
  const int32_t groups = GetParam();
  const int32_t bs = 4;
  VirtualKvCache cache(Options(Mode::kNaive, groups, bs));
  const SeqId a = cache.AddSequence();
  const SeqId b = cache.AddSequence();
  ASSERT_TRUE(cache.SyncNewTokens(a, 16).ok());
  ASSERT_TRUE(cache.SyncNewTokens(b, 5).ok());
  // Group g of `a` loses its first 4 * g + 1 tokens (at most 15), emptying (4 * g + 1) / 4 blocks.
  int64_t live = 0, ideal = 0, held = 0;
  for (int32_t g = 0; g < groups; ++g) {
    const int64_t dead = std::min<int64_t>(4 * g + 1, 15);
    for (TokenId t = 0; t < dead; ++t) ASSERT_TRUE(cache.EvictToken(a, g, t).ok()) << g << t;
    EXPECT_INVARIANTS(cache);
    EXPECT_EQ(cache.table(a, g).num_live(), 16 - dead);
    // Blocks that lost every token are gone: dead / 4 of them.
    EXPECT_EQ(cache.table(a, g).num_blocks(), 4 - dead / 4);
    live += 16 - dead;
    ideal += (16 - dead + bs - 1) / bs;
    held += 4 - dead / 4;
  }
  EXPECT_EQ(cache.num_live(a), live);
  EXPECT_EQ(cache.IdealBlocks(a), ideal);
  EXPECT_EQ(cache.num_blocks_held(a), held);
  EXPECT_EQ(cache.num_live(b), 5 * groups);
  EXPECT_EQ(cache.IdealBlocks(b), 2 * groups);
  const FragStats stats = cache.Stats();
  EXPECT_EQ(stats.ideal_blocks, ideal + 2 * groups);
  EXPECT_EQ(stats.held_blocks, held + 2 * groups);
  EXPECT_EQ(stats.live_slots, live + 5 * groups);
  EXPECT_EQ(stats.num_seqs, 2);
}

INSTANTIATE_TEST_SUITE_P(Groups, GroupCountTest, ::testing::Values(1, 4));

TEST(KvGroupsTest, GroupEvictionFreesABlockOnlyWhenThatGroupsLastTokenDies) {
  VirtualKvCache cache(Options(Mode::kNaive, 4, /*block_size=*/4));
  const SeqId seq = cache.AddSequence();
  ASSERT_TRUE(cache.SyncNewTokens(seq, 8).ok());
  const BlockId block = cache.pool().BlockOf(cache.LiveSlots(seq, 2)[0]);
  std::vector<std::vector<SlotIndex>> before(4);
  for (int32_t g = 0; g < 4; ++g) before[g] = cache.LiveSlots(seq, g);
  const int32_t free_before = cache.pool().num_free_blocks();
  for (TokenId t = 0; t < 4; ++t) {
    ASSERT_TRUE(cache.EvictToken(seq, 2, t).ok()) << t;
    EXPECT_INVARIANTS(cache);
    const bool last = t == 3;
    EXPECT_EQ(cache.table(seq, 2).holds(block), !last) << t;
    EXPECT_EQ(cache.pool().is_free(block), last) << t;
    EXPECT_EQ(cache.pool().num_free_blocks(), free_before + (last ? 1 : 0)) << t;
    EXPECT_FALSE(cache.table(seq, 2).entry(t).live);
  }
  for (int32_t g : {0, 1, 3}) {
    EXPECT_EQ(cache.LiveSlots(seq, g), before[g]) << g;
    EXPECT_EQ(cache.table(seq, g).num_blocks(), 2) << g;
  }
  EXPECT_EQ(cache.LiveSlots(seq, 2),
            std::vector<SlotIndex>(before[2].begin() + 4, before[2].end()));
  EXPECT_EQ(cache.num_blocks_held(seq), 7);
  EXPECT_EQ(cache.num_live(seq), 28);
  // Token 0 is dead in group 2 only.
  EXPECT_EQ(cache.EvictToken(seq, 2, 0).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(cache.EvictToken(seq, 1, 0).ok());
}

TEST(KvGroupsTest, EvictTokenWithoutGroupEvictsEveryGroup) {
  VirtualKvCache cache(Options(Mode::kVtoken, 4));
  const SeqId seq = cache.AddSequence();
  ASSERT_TRUE(cache.SyncNewTokens(seq, 6).ok());
  ASSERT_TRUE(cache.EvictToken(seq, 3, 0).ok());
  EXPECT_INVARIANTS(cache);
  // Live in groups 0-2 only: those are evicted, group 3 is skipped.
  ASSERT_TRUE(cache.EvictToken(seq, 0).ok());
  ASSERT_TRUE(cache.EvictToken(seq, 5).ok());
  EXPECT_INVARIANTS(cache);
  for (int32_t g = 0; g < 4; ++g) {
    EXPECT_FALSE(cache.table(seq, g).entry(0).live) << g;
    EXPECT_FALSE(cache.table(seq, g).entry(5).live) << g;
    EXPECT_EQ(cache.table(seq, g).num_live(), 4) << g;
    EXPECT_EQ(cache.LiveSlots(seq, g).size(), 4u) << g;
  }
  EXPECT_EQ(cache.num_live(seq), 16);
  EXPECT_EQ(cache.EvictToken(seq, 0).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(cache.EvictToken(seq, 6).code(), StatusCode::kNotFound);
  EXPECT_EQ(cache.EvictToken(seq, 4, 1).code(), StatusCode::kNotFound);
  EXPECT_EQ(cache.EvictToken(seq, -1, 1).code(), StatusCode::kNotFound);
  EXPECT_EQ(cache.EvictToken(seq + 1, 1).code(), StatusCode::kNotFound);
  EXPECT_EQ(cache.num_live(seq), 16);
  EXPECT_INVARIANTS(cache);

  VirtualKvCache native(Options(Mode::kNative, 4));
  const SeqId s = native.AddSequence();
  ASSERT_TRUE(native.SyncNewTokens(s, 2).ok());
  EXPECT_EQ(native.EvictToken(s, 0).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(native.EvictToken(s, 1, 0).code(), StatusCode::kFailedPrecondition);
}

TEST(KvGroupsTest, ForkSharesEachGroupsFullPrefixBlocks) {
  const int32_t bs = 4;
  VirtualKvCache cache(Options(Mode::kVtoken, 4, bs));
  const SeqId parent = cache.AddSequence();
  ASSERT_TRUE(cache.SyncNewTokens(parent, 9).ok());  // Per group: 2 full blocks, a tail of 1.
  ASSERT_TRUE(cache.EvictToken(parent, 3, 5).ok());
  EXPECT_INVARIANTS(cache);

  StatusOr<ForkResult> fork = cache.ForkSequence(parent, 8);
  ASSERT_TRUE(fork.ok()) << fork.status().ToString();
  const SeqId child = fork->child;
  EXPECT_TRUE(fork->copies.empty());
  EXPECT_INVARIANTS(cache);
  EXPECT_EQ(cache.num_blocks_held(child), 8);
  for (int32_t g = 0; g < 4; ++g) {
    SCOPED_TRACE("group " + std::to_string(g));
    const std::set<BlockId> shared = GroupBlocks(cache, child, g);
    EXPECT_EQ(shared.size(), 2u);
    for (BlockId b : shared) {
      EXPECT_TRUE(cache.table(parent, g).holds(b));
      EXPECT_EQ(cache.pool().refcount(b), 2);
    }
    // Liveness is inherited per group: token 5 is dead in group 3 only.
    EXPECT_EQ(cache.table(child, g).entry(5).live, g != 3);
    EXPECT_EQ(cache.table(child, g).num_live(), g == 3 ? 7 : 8);
    std::vector<SlotIndex> parent_prefix = cache.LiveSlots(parent, g);
    parent_prefix.pop_back();  // Token 8, past the fork point.
    EXPECT_EQ(cache.LiveSlots(child, g), parent_prefix);
  }
  // The parent evicting in one group leaves the child's copy live.
  ASSERT_TRUE(cache.EvictToken(parent, 1, 0).ok());
  EXPECT_TRUE(cache.table(child, 1).entry(0).live);
  EXPECT_INVARIANTS(cache);

  // Forking through the open tail copies token 8 of every group into a block of that group.
  StatusOr<ForkResult> full = cache.ForkSequence(parent, 9);
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  ASSERT_EQ(full->copies.size(), 4u);
  for (int32_t g = 0; g < 4; ++g) {
    const SlotCopy& c = full->copies[g];
    EXPECT_EQ(c.src, cache.table(parent, g).entry(8).slot) << g;
    EXPECT_EQ(c.dst, cache.table(full->child, g).entry(8).slot) << g;
    EXPECT_TRUE(cache.table(full->child, g).holds(cache.pool().BlockOf(c.dst))) << g;
    EXPECT_EQ(cache.pool().refcount(cache.pool().BlockOf(c.dst)), 1) << g;
  }
  EXPECT_INVARIANTS(cache);
  ASSERT_TRUE(cache.FreeSequence(parent).ok());
  ASSERT_TRUE(cache.FreeSequence(child).ok());
  ASSERT_TRUE(cache.FreeSequence(full->child).ok());
  EXPECT_EQ(cache.pool().num_free_blocks(), cache.pool().num_blocks());
  EXPECT_INVARIANTS(cache);
}

// Group g of a 16-token, 4-block sequence keeps tokens 0, 4 and 8 (one per settled block); the
// tail block (12..15) stays full.
VirtualKvCache SparseCache(SeqId* seq) {
  VirtualKvCache cache(Options(Mode::kVtoken, 4, /*block_size=*/4, /*num_blocks=*/32));
  *seq = cache.AddSequence();
  EXPECT_TRUE(cache.SyncNewTokens(*seq, 16).ok());
  for (int32_t g = 0; g < 4; ++g) {
    for (TokenId t = 0; t < 12; ++t) {
      if (t % 4 != 0) EXPECT_TRUE(cache.EvictToken(*seq, g, t).ok());
    }
  }
  return cache;
}

// A plan repacking blocks 0-2 of `group` into one block.
ReclaimPlan GroupPlan(const VirtualKvCache& cache, SeqId seq, int32_t group) {
  const TokenTable& t = cache.table(seq, group);
  SeqPlan sp{.seq = seq, .src_blocks = {}, .num_moves = 3, .num_dst_blocks = 1, .group = group};
  for (BlockId b : t.blocks()) {
    if (b != t.tail_block()) sp.src_blocks.push_back(b);
  }
  std::sort(sp.src_blocks.begin(), sp.src_blocks.end());
  return {.snapshot_version = cache.version(),
          .seqs = {sp},
          .num_moves = 3,
          .num_src_blocks = 3,
          .num_dst_blocks = 1};
}

TEST(KvGroupsTest, RelocatingGroupTwoLeavesTheOtherGroupsUntouched) {
  SeqId seq = kNoSeq;
  VirtualKvCache cache = SparseCache(&seq);
  EXPECT_INVARIANTS(cache);
  std::vector<std::vector<SlotIndex>> before(4);
  std::vector<std::set<BlockId>> blocks_before(4);
  for (int32_t g = 0; g < 4; ++g) {
    before[g] = cache.LiveSlots(seq, g);
    blocks_before[g] = GroupBlocks(cache, seq, g);
    ASSERT_EQ(before[g].size(), 7u);
  }
  const ReclaimPlan plan = GroupPlan(cache, seq, 2);
  ASSERT_EQ(plan.seqs[0].src_blocks.size(), 3u);
  StatusOr<Relocation> rel = cache.BeginRelocation(plan);
  ASSERT_TRUE(rel.ok()) << rel.status().ToString();
  ASSERT_EQ(rel->seqs.size(), 1u);
  const SeqRelocation& sr = rel->seqs[0];
  EXPECT_EQ(sr.group, 2);
  ASSERT_EQ(sr.moves.size(), 3u);
  ASSERT_EQ(sr.dst_blocks.size(), 1u);
  EXPECT_INVARIANTS(cache);
  for (int32_t g : {0, 1, 3}) EXPECT_EQ(cache.LiveSlots(seq, g), before[g]);
  EXPECT_EQ(cache.LiveSlots(seq, 2), before[2]);  // The table is unchanged until ApplyMoves.
  for (const Move& m : sr.moves) EXPECT_TRUE(cache.IsSlotPending(m.dst));

  // The destinations are reserved for group 2: another group may not take them.
  EXPECT_EQ(cache.ApplyMoves(seq, sr.moves, 1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(cache.ApplyMoves(seq, sr.moves, 4).code(), StatusCode::kNotFound);
  EXPECT_EQ(cache.LiveSlots(seq, 1), before[1]);
  ASSERT_TRUE(cache.ApplyMoves(seq, sr.moves, 2).ok());
  EXPECT_INVARIANTS(cache);
  EXPECT_TRUE(cache.HasPendingReads(seq));
  ASSERT_TRUE(cache.CompleteRelocation(rel->id).ok());
  EXPECT_INVARIANTS(cache);
  EXPECT_FALSE(cache.HasPendingReads(seq));

  for (int32_t g : {0, 1, 3}) {
    EXPECT_EQ(cache.LiveSlots(seq, g), before[g]) << g;
    EXPECT_EQ(GroupBlocks(cache, seq, g), blocks_before[g]) << g;
  }
  const std::vector<SlotIndex> after = cache.LiveSlots(seq, 2);
  ASSERT_EQ(after.size(), 7u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(after[i], sr.moves[i].dst);
    EXPECT_EQ(cache.pool().BlockOf(after[i]), sr.dst_blocks[0]);
  }
  EXPECT_EQ(std::vector<SlotIndex>(after.begin() + 3, after.end()),
            std::vector<SlotIndex>(before[2].begin() + 3, before[2].end()));
  EXPECT_EQ(cache.table(seq, 2).num_blocks(), 2);
  EXPECT_EQ(cache.num_blocks_held(seq), 4 + 4 + 4 + 2);
  for (BlockId b : plan.seqs[0].src_blocks) EXPECT_TRUE(cache.pool().is_free(b)) << b;
}

TEST(KvGroupsTest, PlanNamingAnUnknownGroupIsNotFound) {
  SeqId seq = kNoSeq;
  VirtualKvCache cache = SparseCache(&seq);
  for (int32_t bad : {4, -1, 100}) {
    ReclaimPlan plan = GroupPlan(cache, seq, 2);
    plan.seqs[0].group = bad;
    const uint64_t version = cache.version();
    StatusOr<Relocation> rel = cache.BeginRelocation(plan);
    EXPECT_EQ(rel.status().code(), StatusCode::kNotFound) << bad;
    EXPECT_EQ(cache.version(), version);
    EXPECT_TRUE(cache.InFlightRelocations().empty());
  }
  // The same group twice in one plan.
  ReclaimPlan twice = GroupPlan(cache, seq, 2);
  twice.seqs.push_back(twice.seqs[0]);
  EXPECT_EQ(cache.BeginRelocation(twice).status().code(), StatusCode::kInvalidArgument);
  EXPECT_INVARIANTS(cache);
}

TEST(KvGroupsTest, PlannerPlansEveryGroupOnItsOwn) {
  SeqId seq = kNoSeq;
  VirtualKvCache cache = SparseCache(&seq);
  ReclaimPlanner planner({.trigger = ReclaimOptions::Trigger::kAlways});
  const ReclaimPlan plan = planner.Plan(cache.Snapshot());
  ASSERT_EQ(plan.seqs.size(), 4u);
  std::set<int32_t> groups;
  for (const SeqPlan& sp : plan.seqs) {
    groups.insert(sp.group);
    EXPECT_EQ(sp.seq, seq);
    EXPECT_EQ(sp.num_moves, 3);
    EXPECT_EQ(sp.num_dst_blocks, 1);
    for (BlockId b : sp.src_blocks) EXPECT_TRUE(cache.table(seq, sp.group).holds(b));
  }
  EXPECT_EQ(groups, (std::set<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(plan.blocks_freed(), 8);
}

TEST(KvGroupsTest, ValidateCacheOptionsBoundsNumGroups) {
  CacheOptions o = Options(Mode::kVtoken, 1);
  EXPECT_TRUE(ValidateCacheOptions(o).ok());
  o.num_groups = kMaxKvGroups;
  EXPECT_TRUE(ValidateCacheOptions(o).ok());
  for (int32_t bad : {0, -1, kMaxKvGroups + 1}) {
    o.num_groups = bad;
    const Status s = ValidateCacheOptions(o);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("num_groups"), std::string::npos) << s.message();
  }
}

TEST(KvGroupsTest, GroupLayoutOfEachGranularity) {
  EXPECT_EQ(NumKvGroups(Granularity::kToken, 32, 8), 1);
  EXPECT_EQ(NumKvGroups(Granularity::kLayer, 32, 8), 32);
  EXPECT_EQ(NumKvGroups(Granularity::kHead, 32, 8), 256);
  EXPECT_EQ(KvGroupOf(Granularity::kToken, 5, 3, 8), 0);
  EXPECT_EQ(KvGroupOf(Granularity::kLayer, 5, 3, 8), 5);
  EXPECT_EQ(KvGroupOf(Granularity::kHead, 5, 3, 8), 43);
  EXPECT_EQ(KvGroupOf(Granularity::kHead, 31, 7, 8), 255);
}

TEST(KvGroupsTest, TableMemoryGrowsWithGroups) {
  VirtualKvCache one(Options(Mode::kVtoken, 1, 16, 512));
  VirtualKvCache four(Options(Mode::kVtoken, 4, 16, 512));
  ASSERT_TRUE(one.SyncNewTokens(one.AddSequence(), 256).ok());
  ASSERT_TRUE(four.SyncNewTokens(four.AddSequence(), 256).ok());
  // Entries dominate: 4 bytes per token and group.
  EXPECT_GE(one.TableMemoryBytes(), 256 * 4);
  EXPECT_GE(four.TableMemoryBytes(), 4 * 256 * 4);
  EXPECT_GT(four.TableMemoryBytes(), 3 * one.TableMemoryBytes());
}

}  // namespace
}  // namespace vtoken
