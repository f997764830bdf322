// The immutable data that flows between the cache and the reclaim planner: a read-only snapshot
// of block occupancy, and the plan computed from it (prepare/apply: only VirtualKvCache applies).
#pragma once

#include <cstdint>
#include <vector>

#include "lib/core/types.h"

namespace vtoken {

struct BlockSnapshot {
  BlockId block = kNoBlock;
  int32_t live = 0;      // This sequence's live tokens in the block.
  int32_t refcount = 1;  // > 1: a shared prefix block, never moved.
  bool is_tail = false;  // The open block new tokens append to, never moved.
  bool busy = false;     // Touched by an in-flight copy: its bytes may not be read yet.
};

// One KV group of one sequence (lib/core/types.h, Granularity; group 0 at token granularity).
struct SeqSnapshot {
  SeqId seq = kNoSeq;
  int64_t num_live = 0;
  std::vector<BlockSnapshot> blocks;  // Sorted by block id.
  int32_t group = 0;
};

struct CacheSnapshot {
  uint64_t version = 0;  // VirtualKvCache::version() when taken.
  int32_t block_size = 16;
  int32_t num_blocks = 0;
  int32_t num_free_blocks = 0;  // Including the headroom reserve.
  int32_t headroom_blocks = 0;
  int64_t allocated_blocks = 0;
  int64_t live_slots = 0;
  std::vector<SeqSnapshot> seqs;  // Sorted by (seq id, group).
};

// Per sequence and KV group: move every live token out of `src_blocks` into `num_dst_blocks`
// fresh blocks, keeping logical order. Accepted only when src_blocks.size() > num_dst_blocks.
struct SeqPlan {
  SeqId seq = kNoSeq;
  std::vector<BlockId> src_blocks;
  int64_t num_moves = 0;
  int32_t num_dst_blocks = 0;
  int32_t group = 0;
};

struct ReclaimPlan {
  uint64_t snapshot_version = 0;
  std::vector<SeqPlan> seqs;
  int64_t num_moves = 0;
  int32_t num_src_blocks = 0;
  int32_t num_dst_blocks = 0;
  bool empty() const { return seqs.empty(); }
  // Blocks returned to the pool once the copies complete.
  int32_t blocks_freed() const { return num_src_blocks - num_dst_blocks; }
};

}  // namespace vtoken
