#include "lib/core/virtual_kv_cache.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "lib/core/check_harness.h"
#include "lib/core/reclaim_planner.h"

namespace vtoken {
namespace {

CacheOptions Options(Mode mode, int32_t block_size, int32_t num_blocks, int32_t headroom = 0) {
  return {
      .mode = mode,
      .pool = {.num_blocks = num_blocks, .block_size = block_size, .headroom_blocks = headroom}};
}

// Evicts every token t of `seq` in [0, n) for which keep(t) is false.
template <typename Keep>
void EvictUnless(VirtualKvCache& cache, SeqId seq, int64_t n, Keep keep) {
  for (TokenId t = 0; t < n; ++t) {
    if (!keep(t)) ASSERT_TRUE(cache.EvictToken(seq, t).ok()) << "token " << t;
  }
}

class BlockSizeTest : public ::testing::TestWithParam<int32_t> {};

TEST_P(BlockSizeTest, SyncNewTokensFillsBlocksInOrder) {
  const int32_t bs = GetParam();
  VirtualKvCache cache(Options(Mode::kVtoken, bs, 64));
  const SeqId seq = cache.AddSequence();
  StatusOr<std::vector<SlotIndex>> slots = cache.SyncNewTokens(seq, 2 * bs + 1);
  ASSERT_TRUE(slots.ok());
  for (int64_t i = 0; i < 2 * bs + 1; ++i) EXPECT_EQ((*slots)[i], i);
  EXPECT_EQ(cache.num_blocks_held(seq), 3);
  EXPECT_EQ(cache.LiveSlots(seq), *slots);
  EXPECT_TRUE(cache.CheckInvariants().ok());
}

TEST_P(BlockSizeTest, NaiveFreesOnlyEmptyBlocksAndVtokenRepacks) {
  const int32_t bs = GetParam();
  const int64_t n = 8 * bs;
  for (Mode mode : {Mode::kNaive, Mode::kVtoken}) {
    VirtualKvCache cache(Options(mode, bs, 64, /*headroom=*/4));
    const SeqId seq = cache.AddSequence();
    ASSERT_TRUE(cache.SyncNewTokens(seq, n).ok());
    // Keep every 4th token: each block keeps ceil(bs / 4) tokens (none emptied unless bs < 4).
    EvictUnless(cache, seq, n, [](TokenId t) { return t % 4 == 0; });
    const int64_t live = cache.num_live(seq);
    const int32_t naive_blocks = bs >= 4 ? 8 : static_cast<int32_t>((n + 3) / 4);
    EXPECT_EQ(cache.num_blocks_held(seq), naive_blocks);
    if (mode == Mode::kVtoken) {
      ReclaimPlanner planner({.trigger = ReclaimOptions::Trigger::kAlways});
      ReclaimPlan plan = planner.Plan(cache.Snapshot());
      if (bs == 1) {
        EXPECT_TRUE(plan.empty());  // Every held block is full: nothing to gain.
        continue;
      }
      ASSERT_FALSE(plan.empty());
      StatusOr<Relocation> rel = cache.BeginRelocation(plan);
      ASSERT_TRUE(rel.ok()) << rel.status().ToString();
      for (const SeqRelocation& s : rel->seqs) ASSERT_TRUE(cache.ApplyMoves(s.seq, s.moves).ok());
      ASSERT_TRUE(cache.CompleteRelocation(rel->id).ok());
      EXPECT_TRUE(cache.CheckInvariants().ok());
      // Everything but the open tail block is packed.
      EXPECT_LE(cache.num_blocks_held(seq), (live + bs - 1) / bs + 1);
      EXPECT_EQ(cache.num_live(seq), live);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, BlockSizeTest, ::testing::Values(1, 3, 16, 64));

TEST(VirtualKvCacheTest, EvictingDeadOrUnknownTokensIsAnError) {
  VirtualKvCache cache(Options(Mode::kNaive, 4, 8));
  const SeqId seq = cache.AddSequence();
  ASSERT_TRUE(cache.SyncNewTokens(seq, 3).ok());
  ASSERT_TRUE(cache.EvictToken(seq, 1).ok());
  Status dead = cache.EvictToken(seq, 1);
  EXPECT_EQ(dead.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(dead.message().find("already evicted"), std::string::npos);
  EXPECT_EQ(cache.EvictToken(seq, 3).code(), StatusCode::kNotFound);
  EXPECT_EQ(cache.EvictToken(seq, -1).code(), StatusCode::kNotFound);
  EXPECT_EQ(cache.EvictToken(seq + 1, 0).code(), StatusCode::kNotFound);
  EXPECT_TRUE(cache.CheckInvariants().ok());
}

TEST(VirtualKvCacheTest, NativeModeRefusesEviction) {
  VirtualKvCache cache(Options(Mode::kNative, 4, 8));
  const SeqId seq = cache.AddSequence();
  ASSERT_TRUE(cache.SyncNewTokens(seq, 3).ok());
  EXPECT_EQ(cache.EvictToken(seq, 0).code(), StatusCode::kFailedPrecondition);
}

TEST(VirtualKvCacheTest, SyncIsAtomicWhenThePoolRunsOut) {
  VirtualKvCache cache(Options(Mode::kNaive, 4, 3, /*headroom=*/1));
  const SeqId seq = cache.AddSequence();
  ASSERT_TRUE(cache.SyncNewTokens(seq, 6).ok());  // Two blocks, the third is headroom.
  const uint64_t version = cache.version();
  StatusOr<std::vector<SlotIndex>> more = cache.SyncNewTokens(seq, 3);
  EXPECT_EQ(more.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(cache.num_tokens(seq), 6);
  EXPECT_EQ(cache.version(), version);
  EXPECT_TRUE(cache.SyncNewTokens(seq, 2).ok());  // Fits in the open tail block.
  EXPECT_TRUE(cache.CheckInvariants().ok());
}

TEST(VirtualKvCacheTest, LiveSlotsFollowLogicalOrderAfterEviction) {
  VirtualKvCache cache(Options(Mode::kNaive, 2, 8));
  const SeqId seq = cache.AddSequence();
  ASSERT_TRUE(cache.SyncNewTokens(seq, 6).ok());
  ASSERT_TRUE(cache.EvictToken(seq, 2).ok());
  ASSERT_TRUE(cache.EvictToken(seq, 3).ok());  // Block 1 empties and is released.
  EXPECT_EQ(cache.LiveSlots(seq), (std::vector<SlotIndex>{0, 1, 4, 5}));
  EXPECT_EQ(cache.num_blocks_held(seq), 2);
  EXPECT_TRUE(cache.pool().is_free(1));
}

TEST(VirtualKvCacheTest, ForkSharesFullPrefixBlocksAndCopiesTheRest) {
  VirtualKvCache cache(Options(Mode::kVtoken, 4, 16));
  const SeqId parent = cache.AddSequence();
  ASSERT_TRUE(cache.SyncNewTokens(parent, 10).ok());  // Blocks 0, 1 full; block 2 holds 8, 9.
  StatusOr<ForkResult> fork = cache.ForkSequence(parent, 10);
  ASSERT_TRUE(fork.ok());
  EXPECT_EQ(cache.pool().refcount(0), 2);
  EXPECT_EQ(cache.pool().refcount(1), 2);
  EXPECT_EQ(cache.pool().refcount(2), 1);  // The parent's open tail is not shared.
  ASSERT_EQ(fork->copies.size(), 2u);
  EXPECT_EQ(fork->copies[0].src, 8);
  EXPECT_EQ(fork->copies[1].src, 9);
  EXPECT_EQ(cache.num_tokens(fork->child), 10);
  EXPECT_TRUE(cache.CheckInvariants().ok());
  // Shared blocks are never planned for relocation.
  for (TokenId t = 0; t < 7; ++t) ASSERT_TRUE(cache.EvictToken(fork->child, t).ok());
  ReclaimPlanner planner({.trigger = ReclaimOptions::Trigger::kAlways});
  for (const SeqPlan& sp : planner.Plan(cache.Snapshot()).seqs) {
    for (BlockId b : sp.src_blocks) EXPECT_GT(b, 1);
  }
  ASSERT_TRUE(cache.FreeSequence(parent).ok());
  EXPECT_EQ(cache.pool().refcount(1), 1);
  ASSERT_TRUE(cache.FreeSequence(fork->child).ok());
  EXPECT_EQ(cache.pool().num_free_blocks(), 16);
  EXPECT_TRUE(cache.CheckInvariants().ok());
}

TEST(VirtualKvCacheTest, StalePlanIsRejected) {
  VirtualKvCache cache(Options(Mode::kVtoken, 4, 16, 2));
  const SeqId seq = cache.AddSequence();
  ASSERT_TRUE(cache.SyncNewTokens(seq, 16).ok());
  EvictUnless(cache, seq, 12, [](TokenId t) { return t % 4 == 0; });
  ReclaimPlanner planner({.trigger = ReclaimOptions::Trigger::kAlways});
  ReclaimPlan plan = planner.Plan(cache.Snapshot());
  ASSERT_FALSE(plan.empty());
  ASSERT_TRUE(cache.SyncNewTokens(seq, 1).ok());  // The table changed after the snapshot.
  StatusOr<Relocation> rel = cache.BeginRelocation(plan);
  EXPECT_EQ(rel.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(rel.status().message().find("stale plan"), std::string::npos);
  EXPECT_TRUE(cache.CheckInvariants().ok());
}

TEST(VirtualKvCacheTest, PlanThatFreesNothingIsRefused) {
  VirtualKvCache cache(Options(Mode::kVtoken, 4, 16, 2));
  const SeqId seq = cache.AddSequence();
  ASSERT_TRUE(cache.SyncNewTokens(seq, 12).ok());
  ASSERT_TRUE(cache.EvictToken(seq, 0).ok());  // Block 0 holds 3 live tokens.
  ReclaimPlan plan;
  plan.snapshot_version = cache.version();
  plan.seqs.push_back({.seq = seq, .src_blocks = {0}, .num_moves = 3, .num_dst_blocks = 1});
  plan.num_moves = 3;
  plan.num_src_blocks = 1;
  plan.num_dst_blocks = 1;
  StatusOr<Relocation> rel = cache.BeginRelocation(plan);
  EXPECT_EQ(rel.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(rel.status().message().find("frees no block"), std::string::npos);
  // The planner itself never proposes it.
  ReclaimPlanner planner({.trigger = ReclaimOptions::Trigger::kAlways});
  EXPECT_TRUE(planner.Plan(cache.Snapshot()).empty());
}

TEST(VirtualKvCacheTest, ZeroHeadroomRefusesRelocationWhenThePoolIsFull) {
  VirtualKvCache cache(Options(Mode::kVtoken, 4, 3, /*headroom=*/0));
  const SeqId seq = cache.AddSequence();
  ASSERT_TRUE(cache.SyncNewTokens(seq, 12).ok());  // Every block taken.
  EvictUnless(cache, seq, 8, [](TokenId t) { return t % 4 == 0; });
  ReclaimPlan plan;
  plan.snapshot_version = cache.version();
  plan.seqs.push_back({.seq = seq, .src_blocks = {0, 1}, .num_moves = 2, .num_dst_blocks = 1});
  plan.num_moves = 2;
  plan.num_src_blocks = 2;
  plan.num_dst_blocks = 1;
  StatusOr<Relocation> rel = cache.BeginRelocation(plan);
  EXPECT_EQ(rel.status().code(), StatusCode::kResourceExhausted);
  ReclaimPlanner planner({.trigger = ReclaimOptions::Trigger::kAlways});
  EXPECT_TRUE(planner.Plan(cache.Snapshot()).empty());
  EXPECT_TRUE(cache.CheckInvariants().ok());

  // With one block of headroom the same state relocates, and frees a block on completion.
  VirtualKvCache roomy(Options(Mode::kVtoken, 4, 4, /*headroom=*/1));
  const SeqId s2 = roomy.AddSequence();
  ASSERT_TRUE(roomy.SyncNewTokens(s2, 12).ok());
  EvictUnless(roomy, s2, 8, [](TokenId t) { return t % 4 == 0; });
  ReclaimPlan p2 = planner.Plan(roomy.Snapshot());
  ASSERT_EQ(p2.blocks_freed(), 1);
  StatusOr<Relocation> r2 = roomy.BeginRelocation(p2);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(roomy.pool().num_free_blocks(), 0);
  ASSERT_TRUE(roomy.ApplyMoves(s2, r2->seqs[0].moves).ok());
  EXPECT_TRUE(roomy.HasPendingReads(s2));
  EXPECT_EQ(roomy.pool().num_free_blocks(), 0);  // Sources stay pinned until the copy is done.
  ASSERT_TRUE(roomy.CompleteRelocation(r2->id).ok());
  EXPECT_FALSE(roomy.HasPendingReads(s2));
  EXPECT_EQ(roomy.pool().num_free_blocks(), 2);
  EXPECT_EQ(roomy.LiveSlots(s2).size(), 6u);
  EXPECT_TRUE(roomy.CheckInvariants().ok());
}

TEST(VirtualKvCacheTest, ApplyMovesIsAtomic) {
  VirtualKvCache cache(Options(Mode::kVtoken, 4, 8, 1));
  const SeqId seq = cache.AddSequence();
  ASSERT_TRUE(cache.SyncNewTokens(seq, 12).ok());
  EvictUnless(cache, seq, 8, [](TokenId t) { return t % 4 == 0; });
  ReclaimPlanner planner({.trigger = ReclaimOptions::Trigger::kAlways});
  StatusOr<Relocation> rel = cache.BeginRelocation(planner.Plan(cache.Snapshot()));
  ASSERT_TRUE(rel.ok());
  std::vector<Move> moves = rel->seqs[0].moves;
  ASSERT_EQ(moves.size(), 2u);
  std::vector<Move> bad = moves;
  bad[1].src += 1;  // Not where the token lives.
  const std::vector<SlotIndex> before = cache.LiveSlots(seq);
  EXPECT_EQ(cache.ApplyMoves(seq, bad).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(cache.LiveSlots(seq), before);
  // A token evicted after BeginRelocation is left out of the committed moves.
  ASSERT_TRUE(cache.EvictToken(seq, moves[0].token).ok());
  std::vector<Move> live = cache.LiveMoves(rel->seqs[0]);
  ASSERT_EQ(live.size(), 1u);
  ASSERT_TRUE(cache.ApplyMoves(seq, live).ok());
  ASSERT_TRUE(cache.CompleteRelocation(rel->id).ok());
  EXPECT_TRUE(cache.CheckInvariants().ok());
  EXPECT_EQ(cache.CompleteRelocation(rel->id).code(), StatusCode::kNotFound);
}

// PlanReclaim (the reclaimer's path: histograms from the token tables, no snapshot) makes exactly
// the plan Plan(Snapshot()) makes, on random caches: KV groups, forked sequences sharing prefix
// blocks, blocks pinned by an in-flight relocation, tight and loose move and destination
// budgets, block sizes 1 to 17.
TEST(PlanReclaimTest, MakesThePlanOfTheSnapshotPath) {
  const uint64_t seed = 20261201;
  std::printf("PlanReclaimTest seed %llu\n", static_cast<unsigned long long>(seed));
  uint64_t rng = seed;
  int64_t nonempty = 0, limited = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int32_t bs = 1 + static_cast<int32_t>(SplitMix64(rng) % 17);
    const int32_t groups = 1 + static_cast<int32_t>(SplitMix64(rng) % 4);
    VirtualKvCache cache({.mode = Mode::kVtoken,
                          .pool = {.num_blocks = 4096, .block_size = bs, .headroom_blocks = 8},
                          .num_groups = groups});
    std::vector<SeqId> seqs;
    for (int i = 0; i < 1 + static_cast<int>(SplitMix64(rng) % 5); ++i) {
      const SeqId seq = cache.AddSequence();
      const int64_t n = 1 + static_cast<int64_t>(SplitMix64(rng) % 300);
      ASSERT_TRUE(cache.SyncNewTokens(seq, n).ok());
      seqs.push_back(seq);
      if (SplitMix64(rng) % 3 == 0 && n > bs) {  // A child sharing the full prefix blocks.
        StatusOr<ForkResult> fork = cache.ForkSequence(seq, n);
        ASSERT_TRUE(fork.ok()) << fork.status().ToString();
        seqs.push_back(fork->child);
      }
    }
    const uint64_t keep = 1 + SplitMix64(rng) % 4;  // Keep about 1 in `keep` entries.
    for (SeqId seq : seqs) {
      for (int32_t g = 0; g < groups; ++g) {
        for (TokenId t = 0; t < cache.num_tokens(seq); ++t) {
          if (SplitMix64(rng) % keep != 0) (void)cache.EvictToken(seq, g, t);
        }
      }
    }
    const ReclaimOptions loose{.trigger = ReclaimOptions::Trigger::kAlways,
                               .max_moves_per_step = int64_t{1} << 40};
    if (SplitMix64(rng) % 2 == 0) {  // Pin the blocks of a first relocation, still in flight.
      ReclaimPlan first = ReclaimPlanner(loose).Plan(cache.Snapshot());
      if (!first.empty()) {
        first.seqs.resize(1);
        ASSERT_TRUE(cache.BeginRelocation(first).ok());
      }
    }
    const int64_t max_moves = 1 + static_cast<int64_t>(SplitMix64(rng) % 200);
    for (const ReclaimOptions& o :
         {loose, ReclaimOptions{.trigger = ReclaimOptions::Trigger::kAlways,
                 .max_moves_per_step = max_moves}}) {
      const ReclaimPlanner planner(o);
      const ReclaimPlan want = planner.Plan(cache.Snapshot());
      const ReclaimPlan got = cache.PlanReclaim(planner);
      ASSERT_EQ(got.snapshot_version, want.snapshot_version);
      ASSERT_EQ(got.num_moves, want.num_moves) << "trial " << trial;
      ASSERT_EQ(got.num_src_blocks, want.num_src_blocks);
      ASSERT_EQ(got.num_dst_blocks, want.num_dst_blocks);
      ASSERT_EQ(got.seqs.size(), want.seqs.size());
      for (size_t i = 0; i < want.seqs.size(); ++i) {
        EXPECT_EQ(got.seqs[i].seq, want.seqs[i].seq);
        EXPECT_EQ(got.seqs[i].group, want.seqs[i].group);
        EXPECT_EQ(got.seqs[i].src_blocks, want.seqs[i].src_blocks) << "trial " << trial;
        EXPECT_EQ(got.seqs[i].num_moves, want.seqs[i].num_moves);
        EXPECT_EQ(got.seqs[i].num_dst_blocks, want.seqs[i].num_dst_blocks);
      }
      nonempty += want.empty() ? 0 : 1;
      limited += o.max_moves_per_step == max_moves && want.num_moves > 0 ? 1 : 0;
    }
  }
  // The trials exercise real plans, budget-limited ones too.
  EXPECT_GT(nonempty, 200);
  EXPECT_GT(limited, 100);
}

}  // namespace
}  // namespace vtoken
