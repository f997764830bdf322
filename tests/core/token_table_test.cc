// TokenTable's live list: the live tokens' ids and slots kept in logical order beside the
// entries, so that listing a context is O(live). Checked against a plain model of the entries
// under random appends, evictions and relocations, and for the memory it holds.
#include "lib/core/token_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace vtoken {
namespace {

constexpr int32_t kBlockSize = 4;

// A table plus the model it must agree with: slot per logical token, -1 once evicted. Slots are
// never reused, so every append or relocation opens a fresh slot (and block when needed).
class Harness {
 public:
  void Append() {
    const SlotIndex slot = NewSlot();
    table_.Append(slot, Block(slot));
    model_.push_back(slot);
  }
  // Up to `count` tokens in one AppendRun, as far as the open block goes.
  void AppendRun(int64_t count) {
    const SlotIndex first = NewSlot();
    const int64_t run = std::min<int64_t>(count, kBlockSize - first % kBlockSize);
    table_.AppendRun(first, run, Block(first));
    for (int64_t i = 0; i < run; ++i) model_.push_back(first + i);
    next_slot_ = first + run;
  }
  void Evict(TokenId t) {
    table_.MarkDead(t, Block(model_[t]));
    model_[t] = -1;
  }
  void Relocate(TokenId t) {
    const SlotIndex dst = NewSlot();
    table_.Relocate(t, dst, Block(model_[t]), Block(dst));
    model_[t] = dst;
  }
  std::vector<TokenId> Live() const {
    std::vector<TokenId> live;
    for (TokenId t = 0; t < static_cast<TokenId>(model_.size()); ++t) {
      if (model_[t] >= 0) live.push_back(t);
    }
    return live;
  }
  SlotIndex SlotOf(TokenId t) const { return model_[t]; }
  TokenTable& table() { return table_; }

 private:
  static BlockId Block(SlotIndex slot) { return static_cast<BlockId>(slot / kBlockSize); }
  SlotIndex NewSlot() {
    const SlotIndex slot = next_slot_++;
    if (!table_.holds(Block(slot))) table_.AddBlock(Block(slot));
    return slot;
  }

  TokenTable table_;
  std::vector<SlotIndex> model_;
  SlotIndex next_slot_ = 0;
};

TEST(TokenTableTest, LiveListingsMatchTheEntriesUnderRandomAppendsEvictionsAndRelocations) {
  for (const uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    Harness h;
    for (int step = 0; step < 3000; ++step) {
      const std::vector<TokenId> live = h.Live();
      const int op = static_cast<int>(rng() % 10);
      if (live.empty() || op < 2) {
        // Appends come in runs (a prefill chunk or a decode token), evictions in bursts.
        for (int i = static_cast<int>(rng() % 3); i >= 0; --i) h.Append();
      } else if (op < 4) {
        h.AppendRun(1 + static_cast<int64_t>(rng() % kBlockSize));
      } else if (op < 8) {
        std::vector<TokenId> victims = live;
        std::shuffle(victims.begin(), victims.end(), rng);
        // Half the bursts are a step's few (up to 4: erased one by one), the others any size.
        const size_t most = op < 6 ? std::min<size_t>(4, victims.size()) : victims.size();
        victims.resize(1 + rng() % most);
        for (TokenId t : victims) h.Evict(t);
      } else {
        h.Relocate(live[rng() % live.size()]);
      }
      ASSERT_TRUE(h.table().CheckInvariants(kBlockSize).ok())
          << "step " << step << ": " << h.table().CheckInvariants(kBlockSize).ToString();

      const std::vector<TokenId> expect = h.Live();
      ASSERT_EQ(h.table().num_live(), static_cast<int64_t>(expect.size()));
      ASSERT_EQ(h.table().LiveTokens(), expect) << "step " << step;
      std::vector<SlotIndex> slots_expected;
      for (TokenId t : expect) slots_expected.push_back(h.SlotOf(t));
      ASSERT_EQ(h.table().LiveSlots(), slots_expected) << "step " << step;

      // AppendLive appends after what the vectors hold, all but the last `leave_out` tokens.
      const int64_t leave_out = static_cast<int64_t>(rng() % (expect.size() + 1));
      std::vector<SlotIndex> slots = {-7};
      std::vector<TokenId> tokens = {-9};
      h.table().AppendLive(slots, tokens, leave_out);
      const size_t kept = expect.size() - static_cast<size_t>(leave_out);
      ASSERT_EQ(slots.size(), kept + 1) << "step " << step << " leave_out " << leave_out;
      ASSERT_EQ(tokens.size(), kept + 1);
      EXPECT_EQ(slots[0], -7);
      EXPECT_EQ(tokens[0], -9);
      for (size_t i = 0; i < kept; ++i) {
        ASSERT_EQ(tokens[i + 1], expect[i]) << "step " << step << " index " << i;
        ASSERT_EQ(slots[i + 1], slots_expected[i]) << "step " << step << " index " << i;
      }
    }
  }
}

TEST(TokenTableTest, TheLiveListShrinksWithTheLiveTokens) {
  // Two tables of 4,097 tokens with the same entries and blocks; one keeps a quarter of the first
  // 4,096 (random, seed 5), then appends one more token as the next step does. Its live list
  // holds at most 1.5x its 1,025 live tokens (8 bytes each), the other's at least all 4,097.
  Harness all, quarter;
  for (Harness* h : {&all, &quarter}) {
    h->table().ReserveTokens(4097);
    for (int i = 0; i < 4096; ++i) h->Append();
  }
  std::vector<TokenId> order = quarter.Live();
  std::shuffle(order.begin(), order.end(), std::mt19937_64(5));
  for (size_t i = 0; i < 3072; ++i) quarter.Evict(order[i]);
  all.Append();
  quarter.Append();
  ASSERT_EQ(quarter.table().num_live(), 1025);
  ASSERT_EQ(quarter.table().num_blocks(), all.table().num_blocks());
  const int64_t saved = all.table().MemoryBytes() - quarter.table().MemoryBytes();
  EXPECT_GE(saved, (4097 - 1025 * 3 / 2 - 4) * 8)
      << "a table keeping 1,025 of 4,097 tokens takes " << quarter.table().MemoryBytes()
      << " bytes, one keeping all " << all.table().MemoryBytes();
}

}  // namespace
}  // namespace vtoken
