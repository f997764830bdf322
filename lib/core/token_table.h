// TokenTable: one sequence's map from logical token id to physical slot plus a live bit, and the
// set of blocks the sequence holds with its own live-token count in each. Entry i is logical token
// i, whose RoPE position is i; entries are never removed, an evicted token just loses its slot.
//
// Pure bookkeeping: the table never touches the BlockPool. VirtualKvCache keeps both in step.
// Not thread-safe.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

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
  void Append(SlotIndex slot, BlockId block);
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
  bool holds(BlockId block) const { return held_.count(block) > 0; }
  // REQUIRES: holds(block).
  int32_t live_in(BlockId block) const { return block_live_[held_.at(block)]; }
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
  // Both at once, in one pass over the entries: appends the live slots to `slots` and their
  // logical ids to `tokens`.
  void AppendLive(std::vector<SlotIndex>& slots, std::vector<TokenId>& tokens) const;

  // Capacity hint: the table will hold n tokens (no growth slack).
  void ReserveTokens(int64_t n) { entries_.reserve(static_cast<size_t>(n)); }
  // Heap bytes of this table: entries, block list and per-block counts.
  int64_t MemoryBytes() const;

  // Recounts per-block live tokens from the entries; Internal on any disagreement.
  Status CheckInvariants(int32_t block_size) const;

 private:
  std::vector<Entry> entries_;
  std::vector<BlockId> blocks_;
  std::vector<int32_t> block_live_;                 // Live count of blocks_[i].
  std::unordered_map<BlockId, int32_t> held_;  // Block -> its position in blocks_.
  int64_t num_live_ = 0;
  BlockId tail_block_ = kNoBlock;
  int32_t tail_used_ = 0;
};

}  // namespace vtoken
