#include "lib/core/block_pool.h"

#include <gtest/gtest.h>

namespace vtoken {
namespace {

TEST(BlockPoolTest, RejectsInvalidOptions) {
  EXPECT_EQ(ValidateBlockPoolOptions({.num_blocks = 0}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateBlockPoolOptions({.num_blocks = 4, .block_size = 0}).code(),
            StatusCode::kInvalidArgument);
  Status s = ValidateBlockPoolOptions({.num_blocks = 4, .block_size = 16, .headroom_blocks = 4});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("headroom_blocks"), std::string::npos);
  EXPECT_TRUE(ValidateBlockPoolOptions({.num_blocks = 4, .block_size = 1}).ok());
}

TEST(BlockPoolTest, ExhaustionIsAnErrorValue) {
  BlockPool pool({.num_blocks = 3, .block_size = 4, .headroom_blocks = 0});
  for (int i = 0; i < 3; ++i) {
    StatusOr<BlockId> b = pool.Allocate(/*owner=*/0, AllocClass::kNormal);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(*b, i);
  }
  StatusOr<BlockId> none = pool.Allocate(0, AllocClass::kNormal);
  EXPECT_EQ(none.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.num_free_blocks(), 0);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(BlockPoolTest, HeadroomIsReservedForTheReclaimer) {
  BlockPool pool({.num_blocks = 4, .block_size = 4, .headroom_blocks = 2});
  EXPECT_EQ(pool.num_allocatable_blocks(), 2);
  ASSERT_TRUE(pool.Allocate(0, AllocClass::kNormal).ok());
  ASSERT_TRUE(pool.Allocate(0, AllocClass::kNormal).ok());
  EXPECT_EQ(pool.Allocate(0, AllocClass::kNormal).status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(pool.Allocate(0, AllocClass::kReclaim).ok());
  EXPECT_TRUE(pool.Allocate(0, AllocClass::kReclaim).ok());
  EXPECT_EQ(pool.Allocate(0, AllocClass::kReclaim).status().code(), StatusCode::kResourceExhausted);
}

TEST(BlockPoolTest, SharedBlockFreedAfterLastReference) {
  BlockPool pool({.num_blocks = 2, .block_size = 4});
  BlockId b = *pool.Allocate(7, AllocClass::kNormal);
  EXPECT_EQ(pool.owner(b), 7);
  pool.AddRef(b);
  EXPECT_EQ(pool.refcount(b), 2);
  pool.Release(b);
  EXPECT_FALSE(pool.is_free(b));
  pool.Release(b);
  EXPECT_TRUE(pool.is_free(b));
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(BlockPoolTest, PinnedBlockIsNotReusedUntilUnpinned) {
  BlockPool pool({.num_blocks = 1, .block_size = 2});
  BlockId b = *pool.Allocate(0, AllocClass::kNormal);
  pool.Pin(b);
  pool.Release(b);
  EXPECT_FALSE(pool.is_free(b));
  EXPECT_EQ(pool.Allocate(1, AllocClass::kReclaim).status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(pool.CheckInvariants().ok());
  pool.Unpin(b);
  EXPECT_TRUE(pool.is_free(b));
  EXPECT_TRUE(pool.Allocate(1, AllocClass::kNormal).ok());
}

TEST(BlockPoolTest, SlotRefsDriveBlockLiveCounts) {
  BlockPool pool({.num_blocks = 2, .block_size = 3});
  BlockId b = *pool.Allocate(0, AllocClass::kNormal);
  ASSERT_EQ(b, 0);
  pool.AddSlotRef(0);
  pool.AddSlotRef(0);  // A second sequence reads the same (shared) slot.
  pool.AddSlotRef(2);
  EXPECT_EQ(pool.live_count(b), 2);
  EXPECT_EQ(pool.num_live_slots(), 2);
  pool.DropSlotRef(0);
  EXPECT_EQ(pool.live_count(b), 2);
  pool.DropSlotRef(0);
  EXPECT_EQ(pool.live_count(b), 1);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(BlockPoolTest, AddSlotRefsCountsARunLikeOneRefPerSlot) {
  BlockPool pool({.num_blocks = 2, .block_size = 5});
  const BlockId b = *pool.Allocate(0, AllocClass::kNormal);
  pool.AddSlotRef(pool.FirstSlot(b) + 2);  // Already read by another sequence.
  pool.AddSlotRefs(pool.FirstSlot(b) + 1, 3);
  EXPECT_EQ(pool.live_count(b), 3);
  EXPECT_EQ(pool.num_live_slots(), 3);
  EXPECT_EQ(pool.slot_refs(pool.FirstSlot(b) + 2), 2);
  pool.AddSlotRefs(pool.FirstSlot(b), 0);
  EXPECT_EQ(pool.live_count(b), 3);
  pool.DropSlotRef(pool.FirstSlot(b) + 2);
  EXPECT_EQ(pool.live_count(b), 3);
  pool.DropSlotRef(pool.FirstSlot(b) + 2);
  EXPECT_EQ(pool.live_count(b), 2);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

}  // namespace
}  // namespace vtoken
