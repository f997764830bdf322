#include "lib/core/block_pool.h"

#include <cassert>
#include <string>

namespace vtoken {

Status ValidateBlockPoolOptions(const BlockPoolOptions& o) {
  if (o.num_blocks < 1) {
    return InvalidArgumentError("num_blocks must be >= 1, got " + std::to_string(o.num_blocks));
  }
  if (o.block_size < 1 || o.block_size > kMaxBlockSize) {
    return InvalidArgumentError("block_size must be in [1, " + std::to_string(kMaxBlockSize) +
                                "], got " + std::to_string(o.block_size));
  }
  if (int64_t{o.num_blocks} * o.block_size > kMaxSlots) {
    return InvalidArgumentError(
        "num_blocks x block_size = " + std::to_string(int64_t{o.num_blocks} * o.block_size) +
        " slots, at most " + std::to_string(kMaxSlots));
  }
  if (o.headroom_blocks < 0 || o.headroom_blocks >= o.num_blocks) {
    return InvalidArgumentError("headroom_blocks must be in [0, num_blocks), got " +
                                std::to_string(o.headroom_blocks));
  }
  return Status::Ok();
}

BlockPool::BlockPool(const BlockPoolOptions& options)
    : options_(options),
      blocks_(options.num_blocks),
      slot_refs_(static_cast<size_t>(options.num_blocks) * options.block_size, 0) {
  assert(ValidateBlockPoolOptions(options).ok());
  free_list_.reserve(options.num_blocks);
  // Highest id first so that allocation hands out block 0, 1, 2, ... on a fresh pool.
  for (BlockId b = options.num_blocks - 1; b >= 0; --b) free_list_.push_back(b);
}

int32_t BlockPool::num_allocatable_blocks() const {
  int32_t n = num_free_blocks() - options_.headroom_blocks;
  return n > 0 ? n : 0;
}

StatusOr<BlockId> BlockPool::Allocate(SeqId owner, AllocClass alloc_class) {
  const int32_t available =
      alloc_class == AllocClass::kReclaim ? num_free_blocks() : num_allocatable_blocks();
  if (available == 0) {
    return ResourceExhaustedError("out of KV blocks: " + std::to_string(num_free_blocks()) +
                                  " free, " + std::to_string(options_.headroom_blocks) +
                                  " reserved for the reclaimer");
  }
  BlockId block = free_list_.back();
  free_list_.pop_back();
  BlockState& s = blocks_[block];
  s = BlockState{.refcount = 1, .pins = 0, .live = 0, .owner = owner, .free = false};
  return block;
}

void BlockPool::AddRef(BlockId block) {
  assert(!blocks_[block].free && blocks_[block].refcount > 0);
  if (++blocks_[block].refcount == 2) ++num_shared_blocks_;
}

void BlockPool::Release(BlockId block) {
  assert(blocks_[block].refcount > 0);
  if (--blocks_[block].refcount == 1) --num_shared_blocks_;
  MaybeFree(block);
}

void BlockPool::Pin(BlockId block) {
  assert(!blocks_[block].free);
  if (++blocks_[block].pins == 1) ++num_pinned_blocks_;
}

void BlockPool::Unpin(BlockId block) {
  assert(blocks_[block].pins > 0);
  if (--blocks_[block].pins == 0) --num_pinned_blocks_;
  MaybeFree(block);
}

void BlockPool::MaybeFree(BlockId block) {
  BlockState& s = blocks_[block];
  if (s.refcount > 0 || s.pins > 0 || s.free) return;
  assert(s.live == 0);
  s.free = true;
  s.owner = kNoSeq;
  free_list_.push_back(block);
}

void BlockPool::AddSlotRefs(SlotIndex first, int64_t count) {
  assert(count >= 0 && (count == 0 || BlockOf(first) == BlockOf(first + count - 1)));
  int32_t opened = 0;
  for (SlotIndex slot = first; slot < first + count; ++slot) opened += slot_refs_[slot]++ == 0;
  if (count > 0) blocks_[BlockOf(first)].live += opened;
  num_live_slots_ += opened;
}

void BlockPool::DropSlotRef(SlotIndex slot) {
  assert(slot_refs_[slot] > 0);
  if (--slot_refs_[slot] == 0) {
    --blocks_[BlockOf(slot)].live;
    --num_live_slots_;
  }
}

Status BlockPool::CheckInvariants() const {
  std::vector<char> on_free_list(blocks_.size(), 0);
  for (BlockId b : free_list_) {
    if (b < 0 || b >= num_blocks()) return InternalError("free list holds bad block id");
    if (on_free_list[b]) return InternalError("block " + std::to_string(b) + " freed twice");
    on_free_list[b] = 1;
  }
  int64_t live_slots = 0;
  int32_t shared = 0, pinned = 0;
  for (BlockId b = 0; b < num_blocks(); ++b) {
    const BlockState& s = blocks_[b];
    shared += s.refcount > 1 ? 1 : 0;
    pinned += s.pins > 0 ? 1 : 0;
    if (s.free != static_cast<bool>(on_free_list[b])) {
      return InternalError("block " + std::to_string(b) + " free flag disagrees with free list");
    }
    if (s.free && (s.refcount != 0 || s.pins != 0)) {
      return InternalError("free block " + std::to_string(b) + " is referenced or pinned");
    }
    if (!s.free && s.refcount == 0 && s.pins == 0) {
      return InternalError("block " + std::to_string(b) + " is leaked (no refs, not free)");
    }
    int32_t live = 0;
    for (SlotIndex slot = FirstSlot(b); slot < FirstSlot(b) + block_size(); ++slot) {
      if (slot_refs_[slot] > 0) ++live;
    }
    if (live != s.live) {
      return InternalError("block " + std::to_string(b) + " live count " + std::to_string(s.live) +
                           " != " + std::to_string(live) + " live slots");
    }
    if (s.free && live != 0) {
      return InternalError("free block " + std::to_string(b) + " has live slots");
    }
    live_slots += live;
  }
  if (live_slots != num_live_slots_) return InternalError("pool live slot total is stale");
  if (shared != num_shared_blocks_ || pinned != num_pinned_blocks_) {
    return InternalError("pool counts " + std::to_string(num_shared_blocks_) + " shared and " +
                         std::to_string(num_pinned_blocks_) + " pinned blocks, holds " +
                         std::to_string(shared) + " and " + std::to_string(pinned));
  }
  return Status::Ok();
}

}  // namespace vtoken
