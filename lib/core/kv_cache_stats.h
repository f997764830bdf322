// Statistics of a VirtualKvCache's memory: FragStats (VirtualKvCache::Stats) and the block order
// of its snapshots (VirtualKvCache::Snapshot lists each table's blocks by id). Plain values and a
// pure function: safe to call from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "lib/core/reclaim_plan.h"

namespace vtoken {

// Fragmentation statistics (docs/METRICS.md).
struct FragStats {
  int32_t block_size = 0;
  int64_t allocated_blocks = 0;  // Blocks not free (held or pinned by a copy).
  int64_t live_slots = 0;        // Slots read by at least one live token.
  double waste_ratio = 0;        // F = 1 - live_slots / (allocated_blocks * block_size).
  // Allocated blocks by utilization: [0,25), [25,50), [50,75), [75,100] percent.
  std::array<int64_t, 4> utilization_hist{};
  int64_t ideal_blocks = 0;  // Sum over sequences and groups of ceil(live / block_size).
  int64_t held_blocks = 0;   // Sum over sequences of blocks held (shared counted per holder).
  int32_t num_seqs = 0;
  int32_t num_groups = 1;
};

// Sorts `blocks` by block id, stably. `scratch` is working memory, reused across calls.
// REQUIRES: every block id >= 0.
void SortBlocksById(std::vector<BlockSnapshot>& blocks, std::vector<BlockSnapshot>& scratch);

}  // namespace vtoken
