#include "lib/core/kv_cache_stats.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "lib/core/virtual_kv_cache.h"

namespace vtoken {

// Insertion sort for short lists, an LSD radix sort on 8-bit digits up to the largest id
// otherwise: Snapshot sorts every held block on every planning step.
void SortBlocksById(std::vector<BlockSnapshot>& blocks, std::vector<BlockSnapshot>& scratch) {
  if (blocks.size() <= 64) {  // Insertion sort: linear on the usual, nearly sorted lists.
    for (size_t i = 1; i < blocks.size(); ++i) {
      const BlockSnapshot b = blocks[i];
      size_t j = i;
      for (; j > 0 && blocks[j - 1].block > b.block; --j) blocks[j] = blocks[j - 1];
      blocks[j] = b;
    }
    return;
  }
  uint32_t max_id = 0;
  for (const BlockSnapshot& b : blocks) max_id = std::max(max_id, static_cast<uint32_t>(b.block));
  scratch.resize(blocks.size());
  for (int shift = 0; shift < 32 && (max_id >> shift) != 0; shift += 8) {
    size_t counts[257] = {};
    auto digit = [shift](const BlockSnapshot& b) {
      return (static_cast<uint32_t>(b.block) >> shift) & 0xff;
    };
    for (const BlockSnapshot& b : blocks) ++counts[digit(b) + 1];
    for (size_t i = 1; i <= 256; ++i) counts[i] += counts[i - 1];
    for (const BlockSnapshot& b : blocks) {
      scratch[counts[digit(b)]++] = b;
    }
    blocks.swap(scratch);
  }
}

FragStats VirtualKvCache::Stats() const {
  FragStats s;
  s.block_size = block_size();
  s.num_groups = num_groups();
  s.allocated_blocks = pool_.num_allocated_blocks();
  s.live_slots = pool_.num_live_slots();
  s.waste_ratio = s.allocated_blocks == 0
                      ? 0.0
                      : 1.0 - static_cast<double>(s.live_slots) /
                                  (static_cast<double>(s.allocated_blocks) * block_size());
  for (BlockId b = 0; b < pool_.num_blocks(); ++b) {
    if (pool_.is_free(b)) continue;
    const int bin = std::min(3, pool_.live_count(b) * 4 / block_size());
    ++s.utilization_hist[bin];
  }
  for (const auto& [seq, tables] : tables_) {
    for (const TokenTable& table : tables) {
      s.ideal_blocks += (table.num_live() + block_size() - 1) / block_size();
      s.held_blocks += table.num_blocks();
    }
  }
  s.num_seqs = static_cast<int32_t>(tables_.size());
  return s;
}

CacheSnapshot VirtualKvCache::PoolSnapshot() const {
  CacheSnapshot snap;
  snap.version = version_;
  snap.block_size = block_size();
  snap.num_blocks = pool_.num_blocks();
  snap.num_free_blocks = pool_.num_free_blocks();
  snap.headroom_blocks = pool_.headroom_blocks();
  snap.allocated_blocks = pool_.num_allocated_blocks();
  snap.live_slots = pool_.num_live_slots();
  return snap;
}

CacheSnapshot VirtualKvCache::Snapshot() const {
  CacheSnapshot snap = PoolSnapshot();
  std::vector<BlockSnapshot> scratch;
  snap.seqs.reserve(tables_.size() * static_cast<size_t>(num_groups()));
  for (const auto& [seq, tables] : tables_) {
    for (int32_t g = 0; g < num_groups(); ++g) {
      const TokenTable& table = tables[g];
      SeqSnapshot ss{.seq = seq, .num_live = table.num_live(), .blocks = {}, .group = g};
      ss.blocks.reserve(table.num_blocks());
      const std::vector<BlockId>& blocks = table.blocks();
      for (size_t i = 0; i < blocks.size(); ++i) {
        const BlockId b = blocks[i];
        ss.blocks.push_back(BlockSnapshot{.block = b,
                                          .live = table.live_at(i),
                                          .refcount = pool_.refcount(b),
                                          .is_tail = b == table.tail_block(),
                                          .busy = pool_.pinned(b)});
      }
      SortBlocksById(ss.blocks, scratch);
      snap.seqs.push_back(std::move(ss));
    }
  }
  return snap;
}

}  // namespace vtoken
