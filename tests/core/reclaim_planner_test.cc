#include "lib/core/reclaim_planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <utility>
#include <vector>

namespace vtoken {
namespace {

BlockSnapshot Block(BlockId id, int32_t live, int32_t refcount = 1, bool tail = false,
                    bool busy = false) {
  return {.block = id, .live = live, .refcount = refcount, .is_tail = tail, .busy = busy};
}

CacheSnapshot Snap(std::vector<SeqSnapshot> seqs, int32_t free_blocks, int32_t num_blocks = 100) {
  CacheSnapshot s;
  s.version = 42;
  s.block_size = 8;
  s.num_blocks = num_blocks;
  s.num_free_blocks = free_blocks;
  for (SeqSnapshot& seq : seqs) {
    for (const BlockSnapshot& b : seq.blocks) {
      s.live_slots += b.live;
      s.allocated_blocks += 1;
      seq.num_live += b.live;
    }
  }
  s.seqs = std::move(seqs);
  return s;
}

const ReclaimOptions kAlways{.trigger = ReclaimOptions::Trigger::kAlways};

TEST(ReclaimPlannerTest, RejectsInvalidOptions) {
  EXPECT_EQ(ValidateReclaimOptions({.frag_threshold = 1.0}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateReclaimOptions({.low_watermark = 0}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateReclaimOptions({.max_moves_per_step = 0}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseTrigger("sometimes").status().code(), StatusCode::kInvalidArgument);
}

TEST(ReclaimPlannerTest, PicksSparsestPrivateSettledBlocksAndCarriesTheVersion) {
  CacheSnapshot snap = Snap({{.seq = 3,
                              .blocks = {Block(0, 8), Block(1, 1), Block(2, 2), Block(3, 1, 2),
                                         Block(4, 1, 1, /*tail=*/true),
                                         Block(5, 1, 1, false,
                                               /*busy=*/true),
                                         Block(6, 3)}}},
                            /*free_blocks=*/10);
  ReclaimPlan plan = ReclaimPlanner(kAlways).Plan(snap);
  EXPECT_EQ(plan.snapshot_version, 42u);
  ASSERT_EQ(plan.seqs.size(), 1u);
  // Candidates 1 (1 live), 2 (2), 6 (3): 6 tokens fit one block, so all three go.
  EXPECT_EQ(plan.seqs[0].src_blocks, (std::vector<BlockId>{1, 2, 6}));
  EXPECT_EQ(plan.seqs[0].num_moves, 6);
  EXPECT_EQ(plan.seqs[0].num_dst_blocks, 1);
  EXPECT_EQ(plan.blocks_freed(), 2);
}

TEST(ReclaimPlannerTest, NothingWhenRepackingCannotFreeABlock) {
  CacheSnapshot snap = Snap({{.seq = 0, .blocks = {Block(0, 7), Block(1, 5)}}}, 10);
  EXPECT_TRUE(ReclaimPlanner(kAlways).Plan(snap).empty());
}

TEST(ReclaimPlannerTest, PressureTriggerNeedsWasteAndFewFreeBlocks) {
  ReclaimOptions o{.frag_threshold = 0.25, .low_watermark = 0.25};
  ReclaimPlanner planner(o);
  // 2 blocks of 8 with 2 live: F = 0.875.
  CacheSnapshot sparse = Snap({{.seq = 0, .blocks = {Block(0, 1), Block(1, 1)}}}, 90, 100);
  EXPECT_FALSE(planner.Triggered(sparse));  // 90% of the pool free: no pressure.
  EXPECT_TRUE(planner.Plan(sparse).empty());
  sparse.num_free_blocks = 25;
  EXPECT_FALSE(planner.Triggered(sparse));  // Exactly at the watermark is not below it.
  sparse.num_free_blocks = 24;
  EXPECT_TRUE(planner.Triggered(sparse));
  EXPECT_EQ(planner.Plan(sparse).blocks_freed(), 1);
  CacheSnapshot dense = Snap({{.seq = 0, .blocks = {Block(0, 8), Block(1, 7)}}}, 0, 100);
  EXPECT_FALSE(planner.Triggered(dense));  // F = 1/16 below the threshold.
}

TEST(ReclaimPlannerTest, BoundedByMaxMovesAndFreeBlocks) {
  std::vector<BlockSnapshot> blocks;
  for (BlockId b = 0; b < 10; ++b) blocks.push_back(Block(b, 4));
  CacheSnapshot snap = Snap({{.seq = 0, .blocks = blocks}}, 10);
  ReclaimOptions o = kAlways;
  o.max_moves_per_step = 16;
  ReclaimPlan plan = ReclaimPlanner(o).Plan(snap);
  EXPECT_LE(plan.num_moves, 16);
  EXPECT_EQ(plan.num_moves, 16);
  EXPECT_EQ(plan.blocks_freed(), 2);
  // One free block: at most one destination.
  snap.num_free_blocks = 1;
  plan = ReclaimPlanner(kAlways).Plan(snap);
  EXPECT_EQ(plan.num_dst_blocks, 1);
  EXPECT_EQ(plan.num_src_blocks, 2);
  snap.num_free_blocks = 0;
  EXPECT_TRUE(ReclaimPlanner(kAlways).Plan(snap).empty());
}

TEST(ReclaimPlannerTest, SequencesWithMostWasteGoFirst) {
  CacheSnapshot snap = Snap({{.seq = 0, .blocks = {Block(0, 4), Block(1, 4)}},
                             {.seq = 1, .blocks = {Block(2, 1), Block(3, 1)}}},
                            1);
  ReclaimPlan plan = ReclaimPlanner(kAlways).Plan(snap);
  ASSERT_EQ(plan.seqs.size(), 1u);
  EXPECT_EQ(plan.seqs[0].seq, 1);
}

// The plan by the planner's rule, computed the plain way: per (sequence, group) the candidates
// sorted by (live, block), every prefix tried in order, the best gain (fewest moves on ties)
// kept; (sequence, group)s by recovered waste, then seq and group; each cut to the budget left.
ReclaimPlan ReferencePlan(const CacheSnapshot& snap, int64_t max_moves) {
  const int64_t bs = snap.block_size;
  struct Pick {
    const SeqSnapshot* seq;
    std::vector<std::pair<int32_t, BlockId>> cands;
    int64_t waste;
  };
  auto best = [bs](const std::vector<std::pair<int32_t, BlockId>>& c, int64_t moves_cap,
                   int64_t dst_cap) {
    int64_t live = 0, best_gain = 0, best_k = 0, best_moves = 0;
    for (size_t k = 1; k <= c.size(); ++k) {
      live += c[k - 1].first;
      const int64_t dst = (live + bs - 1) / bs;
      if (live > moves_cap || dst > dst_cap) break;
      if (static_cast<int64_t>(k) - dst > best_gain) {
        best_gain = static_cast<int64_t>(k) - dst;
        best_k = static_cast<int64_t>(k);
        best_moves = live;
      }
    }
    return std::pair<int64_t, int64_t>{best_k, best_moves};
  };
  std::vector<Pick> picks;
  for (const SeqSnapshot& seq : snap.seqs) {
    Pick p{&seq, {}, 0};
    for (const BlockSnapshot& b : seq.blocks) {
      if (b.refcount == 1 && !b.is_tail && !b.busy && b.live < bs)
        p.cands.emplace_back(b.live, b.block);
    }
    std::sort(p.cands.begin(), p.cands.end());
    const auto [k, moves] = best(p.cands, INT64_MAX, INT64_MAX);
    if (k == 0) continue;
    p.waste = bs * k - moves;
    picks.push_back(std::move(p));
  }
  std::sort(picks.begin(), picks.end(), [](const Pick& a, const Pick& b) {
    if (a.waste != b.waste) return a.waste > b.waste;
    if (a.seq->seq != b.seq->seq) return a.seq->seq < b.seq->seq;
    return a.seq->group < b.seq->group;
  });
  ReclaimPlan plan;
  plan.snapshot_version = snap.version;
  int64_t moves_left = max_moves, dst_left = snap.num_free_blocks;
  for (const Pick& p : picks) {
    if (moves_left <= 0 || dst_left <= 0) break;
    const auto [k, moves] = best(p.cands, moves_left, dst_left);
    if (k == 0) continue;
    SeqPlan sp{.seq = p.seq->seq,
               .src_blocks = {},
               .num_moves = moves,
               .num_dst_blocks = static_cast<int32_t>((moves + bs - 1) / bs),
               .group = p.seq->group};
    for (int64_t i = 0; i < k; ++i) sp.src_blocks.push_back(p.cands[i].second);
    moves_left -= moves;
    dst_left -= sp.num_dst_blocks;
    plan.num_moves += moves;
    plan.num_src_blocks += static_cast<int32_t>(k);
    plan.num_dst_blocks += sp.num_dst_blocks;
    plan.seqs.push_back(std::move(sp));
  }
  std::sort(plan.seqs.begin(), plan.seqs.end(), [](const SeqPlan& a, const SeqPlan& b) {
    return a.seq != b.seq ? a.seq < b.seq : a.group < b.group;
  });
  return plan;
}

// Plan() (histograms, the best prefix found from them) against the plain reference on random
// snapshots: block sizes 1 to 33, shared, tail and busy blocks, empty blocks, tight budgets.
TEST(ReclaimPlannerTest, HistogramPlanEqualsThePlainReference) {
  const uint64_t seed = 4242;
  std::printf("HistogramPlanEqualsThePlainReference seed %llu\n",
              static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  int64_t planned = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    CacheSnapshot snap;
    snap.version = static_cast<uint64_t>(trial);
    snap.block_size = 1 + static_cast<int32_t>(rng() % 33);
    snap.num_blocks = 100000;
    snap.num_free_blocks = static_cast<int32_t>(rng() % 40);
    BlockId next = 0;
    const int seqs = 1 + static_cast<int>(rng() % 6);
    for (int s = 0; s < seqs; ++s) {
      SeqSnapshot seq{
          .seq = static_cast<SeqId>(s / 2), .num_live = 0, .blocks = {}, .group = s % 2};
      const int n = static_cast<int>(rng() % 40);
      const int32_t skew = 1 + static_cast<int32_t>(rng() % 4);  // Sparser blocks with skew.
      for (int i = 0; i < n; ++i) {
        const int32_t live = static_cast<int32_t>(rng() % (snap.block_size + 1)) / skew;
        seq.blocks.push_back({.block = next,
                              .live = live,
                              .refcount = rng() % 10 == 0 ? 2 : 1,
                              .is_tail = i == n - 1,
                              .busy = rng() % 12 == 0});
        next += 1 + static_cast<BlockId>(rng() % 3);
        seq.num_live += live;
        snap.live_slots += live;
        ++snap.allocated_blocks;
      }
      snap.seqs.push_back(std::move(seq));
    }
    const int64_t max_moves = rng() % 2 ? int64_t{1} << 40 : 1 + static_cast<int64_t>(rng() % 120);
    const ReclaimPlan got = ReclaimPlanner({.trigger = ReclaimOptions::Trigger::kAlways,
                                            .max_moves_per_step = max_moves})
                                .Plan(snap);
    const ReclaimPlan want = ReferencePlan(snap, max_moves);
    ASSERT_EQ(got.num_moves, want.num_moves) << "trial " << trial;
    ASSERT_EQ(got.num_src_blocks, want.num_src_blocks) << "trial " << trial;
    ASSERT_EQ(got.num_dst_blocks, want.num_dst_blocks) << "trial " << trial;
    ASSERT_EQ(got.seqs.size(), want.seqs.size()) << "trial " << trial;
    for (size_t i = 0; i < want.seqs.size(); ++i) {
      EXPECT_EQ(got.seqs[i].seq, want.seqs[i].seq) << "trial " << trial;
      EXPECT_EQ(got.seqs[i].group, want.seqs[i].group) << "trial " << trial;
      EXPECT_EQ(got.seqs[i].src_blocks, want.seqs[i].src_blocks) << "trial " << trial;
      EXPECT_EQ(got.seqs[i].num_moves, want.seqs[i].num_moves) << "trial " << trial;
    }
    planned += want.empty() ? 0 : 1;
  }
  EXPECT_GT(planned, 800);  // Most trials plan something.
}

}  // namespace
}  // namespace vtoken
