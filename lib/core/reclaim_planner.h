// ReclaimPlanner: decides which sparse blocks to repack. Plan() is a pure function of a
// CacheSnapshot: it never touches the cache, so it can run anywhere and be tested in isolation.
//
// Trigger: the waste ratio F exceeds frag_threshold and the free fraction of the pool is below
// low_watermark (or always, for ablations). Per sequence, candidates are private (refcount 1),
// settled (not the open tail, not touched by an in-flight copy) blocks that are not full, lowest
// utilization first. Taking the k sparsest candidates with T live tokens needs ceil(T / block_size)
// destination blocks; the planner picks the k that frees the most blocks (fewest moves on ties)
// and keeps a sequence's plan only if it frees strictly more blocks than it takes. With KV
// groups every (sequence, group) is planned on its own, as if it were a sequence. Sequences
// with the most reclaimable waste go first; the plan stops at max_moves_per_step moves and at the
// free blocks available for destinations. Thread-compatible (const).
//
// The planner reads a (sequence, group) through the histogram of its candidates' live counts
// (the best k follows from it in O(block_size log blocks)) and lists block ids only for the
// ones it chooses: O(blocks) to build the histograms, then O(block_size) per (sequence, group).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "lib/core/reclaim_plan.h"
#include "lib/core/status.h"

namespace vtoken {

struct ReclaimOptions {
  enum class Trigger {
    kPressure,  // F > frag_threshold and free fraction < low_watermark.
    kAlways,    // Plan on every call (ablations, tests).
  };
  Trigger trigger = Trigger::kPressure;
  // Waste ratio F above which reclamation may run, in [0, 1). Default 0.25 (the paper's).
  double frag_threshold = 0.25;
  // Free blocks / pool blocks below which the pool counts as under pressure, in (0, 1].
  // 1.0 makes every call with F above the threshold a candidate.
  double low_watermark = 0.25;
  // Upper bound on tokens moved by one plan (bounds per-step copy time). Must be >= 1.
  int64_t max_moves_per_step = 4096;
};

Status ValidateReclaimOptions(const ReclaimOptions& options);
StatusOr<ReclaimOptions::Trigger> ParseTrigger(const std::string& name);

class ReclaimPlanner {
 public:
  // REQUIRES: ValidateReclaimOptions(options).ok().
  explicit ReclaimPlanner(const ReclaimOptions& options);

  const ReclaimOptions& options() const { return options_; }
  // True when the trigger condition holds for `snapshot`. Reads only its pool-level fields, so
  // VirtualKvCache::PoolSnapshot() suffices.
  bool Triggered(const CacheSnapshot& snapshot) const;
  // Returns the plan for `snapshot` (empty when not triggered or nothing pays off). The plan
  // carries snapshot.version.
  ReclaimPlan Plan(const CacheSnapshot& snapshot) const;

  // One (sequence, group) of PlanFromHistograms: its candidate blocks (see above) that hold v
  // live tokens number counts[offset + v], v in [0, block_size).
  struct GroupHistogram {
    SeqId seq = kNoSeq;
    int32_t group = 0;
    size_t offset = 0;
  };
  // Appends histogram `index`'s candidate blocks that hold at most `max_live` live tokens, as
  // (live, block), in any order.
  using CandidateLister = std::function<void(size_t index, int32_t max_live,
                                             std::vector<std::pair<int32_t, BlockId>>&)>;
  // Plan() from what a cache can give without a snapshot (VirtualKvCache::PlanReclaim): `pool`
  // with the pool-level fields (VirtualKvCache::PoolSnapshot), the histograms (sorted by
  // (seq, group)) over `counts`, and the lister. The same plan as Plan() on the cache's
  // snapshot: Plan() is this on histograms built from the snapshot.
  ReclaimPlan PlanFromHistograms(const CacheSnapshot& pool,
                                 const std::vector<GroupHistogram>& histograms,
                                 const std::vector<int32_t>& counts,
                                 const CandidateLister& list) const;

 private:
  ReclaimOptions options_;
};

}  // namespace vtoken
