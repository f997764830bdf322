#include "lib/core/copy_engine.h"

#include <gtest/gtest.h>

#include "lib/core/check_harness.h"

namespace vtoken {
namespace {

void Fill(HostKvStore& store) {
  for (int32_t layer = 0; layer < store.num_layers(); ++layer) {
    for (SlotIndex s = 0; s < store.num_slots(); ++s)
      FillContent(s + 1, layer, store.Token(layer, s));
  }
}

class CopyEngineTest : public ::testing::TestWithParam<bool> {};

TEST_P(CopyEngineTest, MovesTheRightBytesInEveryLayer) {
  HostKvStore store(3, 64, 24);
  Fill(store);
  std::vector<uint64_t> hashes(64);
  for (SlotIndex s = 0; s < 64; ++s) hashes[s] = TokenKvHash(store, s);
  std::unique_ptr<CopyEngine> engine;
  if (GetParam()) {
    engine = std::make_unique<AsyncHostCopyEngine>(store, /*delay_us=*/500);
  } else {
    engine = std::make_unique<SyncHostCopyEngine>(store);
  }
  // A run of consecutive slots (coalesced) and scattered ones.
  std::vector<SlotCopy> copies = {{0, 40}, {1, 41}, {2, 42}, {9, 50}, {7, 33}};
  CopyTicket t1 = engine->Submit(copies);
  CopyTicket t2 = engine->Submit({{20, 60}});
  EXPECT_GT(t2, t1);
  engine->Wait(t2);
  EXPECT_TRUE(engine->Poll(t1));
  for (const SlotCopy& c : copies) EXPECT_EQ(TokenKvHash(store, c.dst), hashes[c.src]);
  EXPECT_EQ(TokenKvHash(store, 60), hashes[20]);
  EXPECT_EQ(TokenKvHash(store, 3), hashes[3]);  // Untouched.
  EXPECT_EQ(engine->bytes_copied(), 6 * 3 * 24);
}

INSTANTIATE_TEST_SUITE_P(SyncAndAsync, CopyEngineTest, ::testing::Bool());

TEST(CopyEngineTest, AsyncTicketIsPendingUntilTheWorkerRuns) {
  HostKvStore store(1, 8, 8);
  AsyncHostCopyEngine engine(store, /*delay_us=*/200000);
  CopyTicket t = engine.Submit({{0, 1}});
  EXPECT_FALSE(engine.Poll(t));  // The worker sleeps 200 ms before copying.
  engine.Wait(t);
  EXPECT_TRUE(engine.Poll(t));
}

TEST(CopyEngineTest, TokenHashCoversEveryLayer) {
  HostKvStore store(2, 4, 8);
  Fill(store);
  const uint64_t before = TokenKvHash(store, 1);
  store.Token(1, 1)[7] ^= std::byte{1};
  EXPECT_NE(TokenKvHash(store, 1), before);
}

}  // namespace
}  // namespace vtoken
