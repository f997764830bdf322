// Reclaimer: drives one relocation pipeline over a VirtualKvCache and a CopyEngine, in the
// stage-aware order of the paper: snapshot -> Plan (pure) -> BeginRelocation -> Submit copies ->
// ApplyMoves (table committed at once; destinations stay pending) -> later, once the copy
// engine reports completion, CompleteRelocation frees the source blocks. A reader calls
// FenceForRead(seq) before attention reads seq's slots; it fences only when a pending copy
// touches them, and then through CopyEngine::FenceConsumer: on a device copy engine the
// consumer's stream waits for the copy's event and the host goes on (the relocation completes on
// a later Poll), otherwise the host waits and the relocation completes at once. A device fence is
// issued once per ticket: a stream that waited for ticket T is ordered after every ticket <= T.
//
// Not thread-safe; lives on the scheduler thread with the cache.
#pragma once

#include <cstdint>
#include <deque>

#include "lib/core/copy_engine.h"
#include "lib/core/reclaim_planner.h"
#include "lib/core/status.h"
#include "lib/core/virtual_kv_cache.h"

namespace vtoken {

// Reclamation cost counters (docs/METRICS.md).
struct ReclaimStats {
  int64_t plans = 0;             // Non-empty plans executed.
  int64_t moves = 0;             // Tokens relocated.
  int64_t bytes = 0;             // KV bytes submitted for copying.
  int64_t blocks_freed = 0;      // Source blocks minus destination blocks over all plans.
  int64_t fence_waits = 0;       // Reads that had to wait for a copy (on the host or the device).
  int64_t device_fences = 0;     // Of those, fences the copy engine put on the device queue.
  int64_t host_fence_waits = 0;  // Of those, fences that blocked the host until the copy was done.
  double planner_seconds = 0;    // Snapshot + Plan CPU time.
  double fence_seconds = 0;      // Time spent blocked in fences and drains.
};

// Hooks for verification (`vtoken-cli check`): called around each relocation's copies.
class RelocationObserver {
 public:
  virtual ~RelocationObserver() = default;
  // After BeginRelocation, before the copies are submitted (sources hold the data).
  virtual void BeforeCopy(const Relocation& relocation) = 0;
  // After the copies completed, before sources are unpinned (both ends hold the data).
  virtual void AfterCopy(const Relocation& relocation) = 0;
};

class Reclaimer {
 public:
  // `bytes_per_slot` (KV bytes one slot holds: a token's over all layers at token granularity)
  // only feeds ReclaimStats::bytes. REQUIRES: valid options.
  Reclaimer(VirtualKvCache& cache, CopyEngine& engine, const ReclaimOptions& options,
            int64_t bytes_per_slot);

  void set_observer(RelocationObserver* observer) { observer_ = observer; }
  // Waits for each copy right after submitting it (the paper's force-sync ablation).
  void set_force_sync(bool force_sync) { force_sync_ = force_sync; }
  const ReclaimPlanner& planner() const { return planner_; }

  // Plans from the current cache state and, when the plan is not empty, begins it, submits its
  // copies and commits the table. Returns the number of tokens moved. `force` plans even when the
  // trigger condition does not hold (an allocation just failed: reclaim before preempting).
  StatusOr<int64_t> Step(bool force = false);
  // Completes every relocation whose copies finished. Never blocks.
  Status Poll();
  // Orders the next reads of `seq`'s slots after every pending copy that touches them (see
  // above). Returns true if a copy touched them (a fence was needed, on the device or the host).
  StatusOr<bool> FenceForRead(SeqId seq);
  // Waits for and completes every in-flight relocation.
  Status Drain();
  int64_t num_in_flight() const { return static_cast<int64_t>(in_flight_.size()); }
  const ReclaimStats& stats() const { return stats_; }

 private:
  struct InFlight {
    Relocation relocation;
    CopyTicket ticket = 0;
  };
  // Completes the oldest in-flight relocation. REQUIRES: its ticket completed.
  Status RetireFront();

  VirtualKvCache& cache_;
  CopyEngine& engine_;
  ReclaimPlanner planner_;
  ReclaimPlanner forced_planner_;  // Same limits, trigger always.
  int64_t bytes_per_slot_;
  RelocationObserver* observer_ = nullptr;
  bool force_sync_ = false;
  std::deque<InFlight> in_flight_;
  CopyTicket device_fenced_through_ = 0;  // The consumer's queue waits for tickets <= this one.
  ReclaimStats stats_;
};

}  // namespace vtoken
