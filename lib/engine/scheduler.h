// The engine's scheduler (steps 1 and 2 of engine.h): which requests run and how many new tokens
// each computes this step. Arrived requests wait in FCFS order; Admit moves them to the running
// list while EngineOptions::max_num_seqs and the free blocks (EngineOptions::Admission) allow;
// Reserve registers every running sequence's new tokens with the cache, and when the pool runs
// out reclaims (vtoken mode) or preempts the newest running sequence (recompute: its KV is
// dropped and it goes back to the head of the queue). Prefix groups go through PrefixForks.
// Works on the engine's sequences (sequence_state.h). Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "lib/core/copy_engine.h"
#include "lib/core/policy_evictor.h"
#include "lib/core/reclaimer.h"
#include "lib/core/status.h"
#include "lib/core/virtual_kv_cache.h"
#include "lib/engine/engine.h"
#include "lib/engine/prefix_forks.h"
#include "lib/engine/sequence_state.h"

namespace vtoken::engine {

class Scheduler {
 public:
  // REQUIRES: valid options (ValidateEngineOptions); `groups` is the cache's KV groups;
  // `evictor` is null without eviction. Every argument must outlive the scheduler.
  Scheduler(const EngineOptions& options, std::vector<SeqState>& seqs, VirtualKvCache& cache,
            Reclaimer& reclaimer, CopyEngine& copies, PolicyEvictor* evictor, int32_t groups);

  // Whether no request waits or runs (the next one has not arrived yet).
  bool idle() const { return running_.empty() && waiting_.empty(); }
  // When the next request not yet queued arrives. REQUIRES: one has not arrived yet.
  double next_arrival_s() const;
  // Indices into the sequences, in admission order.
  const std::vector<size_t>& running() const { return running_; }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }

  // Queues the requests that arrived by `now` (seconds from the run's start).
  void Arrivals(double now);

  // Admits waiting requests FCFS while max_num_seqs and the free blocks allow.
  void Admit();

  // Registers this step's new tokens for every running sequence (decodes first when
  // max_batched_tokens bounds the step), preempting the newest sequences when the pool runs out.
  // Adds the time the cache's registrations took to `sync_s`. Errors: ResourceExhausted when a
  // sequence alone needs more than the pool; the cache's and the reclaimer's.
  StatusOr<std::vector<Planned>> Reserve(double& sync_s);

  // seqs[index] computed its planned tokens (num_computed advanced): PrefixForks::Computed.
  Status Computed(size_t index) { return forks_.Computed(index); }

  // seqs[index] finished: its KV is freed and it leaves the running list.
  void Finish(size_t index);

  int64_t num_preemptions() const { return num_preemptions_; }
  int32_t peak_running() const { return peak_running_; }
  int64_t num_forks() const { return forks_.num_forks(); }

 private:
  // Tokens of `s`'s query-agnostic question not yet in `tokens`.
  static int64_t PendingQuestion(const SeqState& s);
  // Blocks `s` may still need: the rest of its prompt and, with kReserve, of its output.
  int64_t Growth(const SeqState& s) const;
  // Drops a running sequence's KV; it goes back to the head of the waiting queue and will be
  // recomputed (prompt + outputs so far) when readmitted.
  void Preempt(size_t index);
  // What finishing and preemption share: the sequence's KV freed, its policy state forgotten,
  // off the running list.
  void Drop(size_t index);

  const EngineOptions& o_;
  std::vector<SeqState>& seqs_;
  VirtualKvCache& cache_;
  Reclaimer& reclaimer_;
  PolicyEvictor* evictor_;
  const int32_t groups_;
  std::vector<size_t> arrival_order_;
  size_t next_arrival_ = 0;
  std::deque<size_t> waiting_;
  std::vector<size_t> running_;
  PrefixForks forks_;
  int64_t next_admission_ = 0;
  int64_t num_preemptions_ = 0;
  int32_t peak_running_ = 0;
};

}  // namespace vtoken::engine
