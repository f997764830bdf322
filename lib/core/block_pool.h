// BlockPool: the physical KV blocks of one cache. Tracks the free list, each block's reference
// count (a shared prefix block is referenced by every sequence that shares it), its owner (the
// sequence that allocated it), pins (a block being read by an in-flight copy may not be reused)
// and per-slot liveness, from which each block's live-token count follows.
//
// Running out of blocks is an expected result (ResourceExhausted), never a crash. The last
// `headroom_blocks` free blocks are a reserve that only the reclaimer may take, so relocation can
// always find destination blocks under pressure.
//
// Not thread-safe: owned and mutated by one VirtualKvCache on the scheduler thread.
#pragma once

#include <cstdint>
#include <vector>

#include "lib/core/status.h"
#include "lib/core/types.h"

namespace vtoken {

// Slots a pool may have (num_blocks * block_size): token tables keep 31-bit slot indices.
inline constexpr int64_t kMaxSlots = int64_t{1} << 30;
// Token slots a block may have.
inline constexpr int32_t kMaxBlockSize = 4096;

struct BlockPoolOptions {
  // Number of physical blocks in the pool. Must be >= 1.
  int32_t num_blocks = 1024;
  // Token slots per block. Must be in [1, kMaxBlockSize].
  int32_t block_size = 16;
  // Free blocks held back for the reclaimer's destination blocks. Must be in [0, num_blocks).
  int32_t headroom_blocks = 0;
};

// Returns OK or an InvalidArgument naming the offending field.
Status ValidateBlockPoolOptions(const BlockPoolOptions& options);

// Who is asking for a block: ordinary growth may not dip into the headroom reserve.
enum class AllocClass { kNormal, kReclaim };

class BlockPool {
 public:
  // REQUIRES: ValidateBlockPoolOptions(options).ok().
  explicit BlockPool(const BlockPoolOptions& options);

  int32_t num_blocks() const { return options_.num_blocks; }
  int32_t block_size() const { return options_.block_size; }
  int32_t headroom_blocks() const { return options_.headroom_blocks; }
  int64_t num_slots() const { return int64_t{options_.num_blocks} * options_.block_size; }
  int32_t num_free_blocks() const { return static_cast<int32_t>(free_list_.size()); }
  // Blocks not on the free list (held by a sequence, or pinned by an in-flight copy).
  int32_t num_allocated_blocks() const { return num_blocks() - num_free_blocks(); }
  // Free blocks an ordinary (kNormal) allocation may take.
  int32_t num_allocatable_blocks() const;

  // Takes a free block with refcount 1 owned by `owner`. Returns ResourceExhausted when no block is
  // available to `alloc_class`.
  StatusOr<BlockId> Allocate(SeqId owner, AllocClass alloc_class);
  // REQUIRES: the block is allocated. Adds a reference (a sequence sharing the block).
  void AddRef(BlockId block);
  // REQUIRES: refcount(block) > 0. Drops a reference; at zero the block returns to the free list,
  // or, when pinned, as soon as it is unpinned.
  void Release(BlockId block);
  // Pins a block whose bytes an in-flight copy reads: it cannot be reused until unpinned.
  void Pin(BlockId block);
  // REQUIRES: pinned(block). Returns the block to the free list if it is unreferenced.
  void Unpin(BlockId block);

  // A live token now occupies `slot` (counted once per sequence that reads it).
  void AddSlotRef(SlotIndex slot) { AddSlotRefs(slot, 1); }
  // AddSlotRef of slots [first, first + count). REQUIRES: they lie in one block.
  void AddSlotRefs(SlotIndex first, int64_t count);
  // REQUIRES: slot_refs(slot) > 0.
  void DropSlotRef(SlotIndex slot);

  BlockId BlockOf(SlotIndex slot) const { return static_cast<BlockId>(slot / block_size()); }
  SlotIndex FirstSlot(BlockId block) const { return SlotIndex{block} * block_size(); }
  bool is_free(BlockId block) const { return blocks_[block].free; }
  int32_t refcount(BlockId block) const { return blocks_[block].refcount; }
  bool pinned(BlockId block) const { return blocks_[block].pins > 0; }
  SeqId owner(BlockId block) const { return blocks_[block].owner; }
  // Slots of `block` read by at least one live token.
  int32_t live_count(BlockId block) const { return blocks_[block].live; }
  int32_t slot_refs(SlotIndex slot) const { return slot_refs_[slot]; }
  // Sum of live_count over all blocks.
  int64_t num_live_slots() const { return num_live_slots_; }
  // Blocks with refcount > 1 (shared prefixes), and pinned blocks: when both are 0, no block is
  // shared or pinned, and the planner need not look a block up (VirtualKvCache::PlanReclaim).
  int32_t num_shared_blocks() const { return num_shared_blocks_; }
  int32_t num_pinned_blocks() const { return num_pinned_blocks_; }

  // Verifies the free list, refcounts, pins and live counts agree. Returns Internal on a breach.
  Status CheckInvariants() const;

 private:
  struct BlockState {
    int32_t refcount = 0;
    int32_t pins = 0;
    int32_t live = 0;
    SeqId owner = kNoSeq;
    bool free = true;
  };

  void MaybeFree(BlockId block);

  BlockPoolOptions options_;
  std::vector<BlockState> blocks_;
  std::vector<BlockId> free_list_;  // LIFO: a just-freed block is reused first (warm in cache).
  std::vector<uint16_t> slot_refs_;
  int64_t num_live_slots_ = 0;
  int32_t num_shared_blocks_ = 0;  // refcount > 1
  int32_t num_pinned_blocks_ = 0;  // pins > 0
};

}  // namespace vtoken
