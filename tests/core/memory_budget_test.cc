#include "lib/core/memory_budget.h"

#include <gtest/gtest.h>

#include <limits>

namespace vtoken {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

TEST(MemoryBudgetTest, SaturatingArithmeticNeverOverflows) {
  EXPECT_EQ(SaturatingMul(3, 4), 12);
  EXPECT_EQ(SaturatingMul(0, kMax), 0);
  EXPECT_EQ(SaturatingMul(-1, 5), 0);
  EXPECT_EQ(SaturatingMul(int64_t{1} << 31, int64_t{1} << 31), int64_t{1} << 62);
  EXPECT_EQ(SaturatingMul(int64_t{1} << 32, int64_t{1} << 31), kMax);
  EXPECT_EQ(SaturatingMul(kMax, 2), kMax);
  EXPECT_EQ(SaturatingAdd(kMax - 1, 1), kMax);
  EXPECT_EQ(SaturatingAdd(kMax, kMax), kMax);
  EXPECT_EQ(SaturatingAdd(2, 3), 5);
}

TEST(MemoryBudgetTest, PoolMetadataGrowsWithBlocksAndSlotsAndSaturates) {
  EXPECT_EQ(PoolMetadataBytes(0, 16), 0);
  EXPECT_EQ(PoolMetadataBytes(10, 16), 10 * 64 + 160 * 18);
  EXPECT_EQ(PoolMetadataBytes(kMax, kMax), kMax);
}

TEST(MemoryBudgetTest, FormatBytesPicksTheUnit) {
  EXPECT_EQ(FormatBytes(800), "800 B");
  EXPECT_EQ(FormatBytes(512 * 1024 * 1024), "512.0 MiB");
  EXPECT_EQ(FormatBytes(int64_t{3} << 30), "3.0 GiB");
  EXPECT_EQ(FormatBytes(int64_t{5} << 40), "5.0 TiB");
}

TEST(MemoryBudgetTest, CheckMemoryNamesWhatAndBothSizes) {
  EXPECT_TRUE(CheckMemory(1000, "x", 1000).ok());
  const Status s =
      CheckMemory(int64_t{3} << 30, "engine.num_blocks = 9: the KV store", int64_t{1} << 30);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "engine.num_blocks = 9: the KV store needs 3.0 GiB, more than the 1.0 GiB of memory "
            "available");
  EXPECT_GT(AvailableMemoryBytes(), 0);
}

}  // namespace
}  // namespace vtoken
