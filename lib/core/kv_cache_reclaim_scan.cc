// VirtualKvCache::PlanReclaim: the planner's entry that reads the token tables directly (the
// reclaimer's path), where ReclaimPlanner::Plan reads a Snapshot().
#include <cstdint>
#include <utility>
#include <vector>

#include "lib/core/virtual_kv_cache.h"

namespace vtoken {

ReclaimPlan VirtualKvCache::PlanReclaim(const ReclaimPlanner& planner) const {
  const CacheSnapshot pool = PoolSnapshot();
  if (!planner.Triggered(pool)) {
    ReclaimPlan none;
    none.snapshot_version = pool.version;
    return none;
  }
  const int32_t bs = block_size();
  // A candidate as the planner defines it: private, settled, not the open tail, not full. The
  // pool is asked only when it has shared or pinned blocks at all (a lookup per block is most of
  // the cost of this pass).
  const bool look_up = pool_.num_shared_blocks() > 0 || pool_.num_pinned_blocks() > 0;
  const auto movable = [&](const TokenTable& t, size_t i) {
    const BlockId b = t.blocks()[i];
    return t.live_at(i) < bs && b != t.tail_block() &&
           (!look_up || (pool_.refcount(b) == 1 && !pool_.pinned(b)));
  };
  std::vector<ReclaimPlanner::GroupHistogram> histograms;
  std::vector<const TokenTable*> tables;
  std::vector<int32_t> counts;
  for (const auto& [seq, group_tables] : tables_) {
    for (int32_t g = 0; g < num_groups(); ++g) {
      const TokenTable& t = group_tables[g];
#if defined(__GNUC__)
      // With many small tables (per-head groups) the pass waits on memory for each table's
      // arrays: ask for the ones two tables ahead meanwhile.
      if (g + 2 < num_groups()) {
        __builtin_prefetch(group_tables[g + 2].blocks().data());
        __builtin_prefetch(group_tables[g + 2].block_live().data());
      }
#endif
      if (int64_t{t.num_blocks()} * bs - t.num_live() < bs) continue;
      const size_t offset = counts.size();
      counts.resize(offset + static_cast<size_t>(bs), 0);
      for (size_t i = 0; i < t.blocks().size(); ++i) {
        if (movable(t, i)) ++counts[offset + t.live_at(i)];
      }
      histograms.push_back({.seq = seq, .group = g, .offset = offset});
      tables.push_back(&t);
    }
  }
  return planner.PlanFromHistograms(
      pool, histograms, counts,
      [&](size_t index, int32_t max_live, std::vector<std::pair<int32_t, BlockId>>& out) {
        const TokenTable& t = *tables[index];
        for (size_t i = 0; i < t.blocks().size(); ++i) {
          if (movable(t, i) && t.live_at(i) <= max_live)
            out.emplace_back(t.live_at(i), t.blocks()[i]);
        }
      });
}

}  // namespace vtoken
