#include "lib/core/reclaim_planner.h"

#include <gtest/gtest.h>

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
  EXPECT_EQ(ValidateReclaimOptions({.frag_threshold = 1.0}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateReclaimOptions({.low_watermark = 0}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateReclaimOptions({.max_moves_per_step = 0}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseTrigger("sometimes").status().code(), StatusCode::kInvalidArgument);
}

TEST(ReclaimPlannerTest, PicksSparsestPrivateSettledBlocksAndCarriesTheVersion) {
  CacheSnapshot snap = Snap({{.seq = 3,
                              .blocks = {Block(0, 8), Block(1, 1), Block(2, 2), Block(3, 1, 2),
                                         Block(4, 1, 1, /*tail=*/true), Block(5, 1, 1, false,
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

}  // namespace
}  // namespace vtoken
