// TokenTable: one sequence's map from logical token id to physical slot plus a live bit, and the
// set of blocks the sequence holds with its own live-token count in each. Entry i is logical token
// i, whose RoPE position is i; entries are never removed, an evicted token just loses its slot.
// Beside the entries, the table keeps its live tokens' ids and slots in logical order (8 bytes
// per live token), so that listing the live context (what attention reads, every step) costs
// O(live), not O(tokens ever appended): an evicted id leaves that list at the next append, or as
// soon as a fifth of the list is dead (a few ids by binary search, more in one pass).
//
// Pure bookkeeping: the table never touches the BlockPool. VirtualKvCache keeps both in step.
// Not thread-safe.
#pragma once

#include <cassert>
#include <cstdint>
#include <vector>

#include "lib/core/flat_block_map.h"
#include "lib/core/status.h"
#include "lib/core/types.h"

namespace vtoken {

class TokenTable {
 public:
  // 4 bytes: a per-head table of an 8B model describes 512 KV bytes per entry (bf16 K and V of
  // one head), so the entry size is the table's memory overhead. Slots are below kMaxSlots
  // (block_pool.h).
  struct Entry {
    int32_t slot : 31 = kNoSlot;  // kNoSlot when dead.
    bool live : 1 = false;
  };

  int64_t num_tokens() const { return static_cast<int64_t>(entries_.size()); }
  int64_t num_live() const { return num_live_; }
  // REQUIRES: 0 <= token < num_tokens().
  const Entry& entry(TokenId token) const { return entries_[token]; }

  // Appends logical token num_tokens() as live at `slot`. REQUIRES: holds(block_of_slot).
  void Append(SlotIndex slot, BlockId block) { AppendRun(slot, 1, block); }
  // Appends `count` live tokens at slots first, first + 1, ... REQUIRES: holds(block), and the
  // slots lie in it.
  void AppendRun(SlotIndex first, int64_t count, BlockId block);
  // Appends a dead token with no slot (a token inherited dead from a forked parent).
  void AppendDead();
  // Marks a live token dead. Returns this sequence's remaining live tokens in `block`.
  // REQUIRES: entry(token).live and the token's slot lies in `block`.
  int32_t MarkDead(TokenId token, BlockId block);
  // Points a live token at `dst` (in dst_block) instead of its slot in src_block. Returns the
  // remaining live count of src_block. REQUIRES: holds(dst_block).
  int32_t Relocate(TokenId token, SlotIndex dst, BlockId src_block, BlockId dst_block);

  // Starts holding `block` (with no live tokens yet).
  void AddBlock(BlockId block);
  // REQUIRES: holds(block). Stops holding it; clears the tail if it was the tail.
  void RemoveBlock(BlockId block);
  bool holds(BlockId block) const { return held_.Contains(block); }
  // REQUIRES: holds(block).
  int32_t live_in(BlockId block) const {
    assert(holds(block));
    return block_live_[held_.Find(block)];
  }
  // The live count of blocks()[i] (no lookup: what snapshots iterate).
  int32_t live_at(size_t i) const { return block_live_[i]; }
  // Blocks held, in no particular order.
  const std::vector<BlockId>& blocks() const { return blocks_; }
  // The live counts of blocks(), in the same order.
  const std::vector<int32_t>& block_live() const { return block_live_; }
  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }

  // The open block new tokens append into, and how many of its slots are written.
  BlockId tail_block() const { return tail_block_; }
  int32_t tail_used() const { return tail_used_; }
  void SetTail(BlockId block, int32_t used) {
    tail_block_ = block;
    tail_used_ = used;
  }

  // Slots of live tokens in logical order: what attention reads.
  std::vector<SlotIndex> LiveSlots() const;
  // Logical ids of live tokens in increasing order.
  std::vector<TokenId> LiveTokens() const;
  // Both at once, in one pass over the live list: appends the live slots to `slots` and their
  // logical ids to `tokens`, all but the last `leave_out` live tokens.
  // REQUIRES: 0 <= leave_out <= num_live().
  void AppendLive(std::vector<SlotIndex>& slots, std::vector<TokenId>& tokens,
                  int64_t leave_out = 0) const;

  // Capacity hint: the table will hold n tokens (no growth slack). The live list gets room for
  // as many, and gives back what it does not need once evictions have shrunk it.
  void ReserveTokens(int64_t n) {
    entries_.reserve(static_cast<size_t>(n));
    live_.reserve(static_cast<size_t>(n));
    live_slots_.reserve(static_cast<size_t>(n));
  }
  // Heap bytes of this table: entries, live list, block list and per-block counts.
  int64_t MemoryBytes() const;

  // Recounts per-block live tokens from the entries and checks the live list against them;
  // Internal on any disagreement.
  Status CheckInvariants(int32_t block_size) const;

 private:
  // Drops the ids of dead tokens from live_ (and its slack when it has shrunk to under half).
  void Compact();

  std::vector<Entry> entries_;
  // Logical ids of the live tokens, increasing, plus the ids of `pending_dead_` tokens evicted
  // since the last Compact (their entries say dead: readers skip them); live_slots_[i] is
  // live_[i]'s slot while it lives.
  std::vector<int32_t> live_;
  std::vector<int32_t> live_slots_;
  int64_t pending_dead_ = 0;
  // The first few of them (a step's usual evictions), which Compact erases one by one (binary
  // search and a move of the list's tail) instead of passing over the whole list.
  static constexpr int kFewDead = 4;
  int32_t few_dead_[kFewDead] = {};
  std::vector<BlockId> blocks_;
  std::vector<int32_t> block_live_;  // Live count of blocks_[i].
  FlatBlockMap held_;                // Block -> its position in blocks_.
  int64_t num_live_ = 0;
  BlockId tail_block_ = kNoBlock;
  int32_t tail_used_ = 0;
};

}  // namespace vtoken
