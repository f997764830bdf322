// Prefix sharing between the requests of one prefix group (engine.h): the first admitted member,
// the group's leader, computes the shared prefix (the step ends a prefill chunk exactly there);
// members admitted while the leader has not yet computed past it wait, then fork it
// (VirtualKvCache::ForkSequence: full prefix blocks shared by reference, the partial one copied)
// and prefill only their own suffix. Works on the engine's sequences (sequence_state.h) and
// running list, which it reads and marks but never reorders. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "lib/core/copy_engine.h"
#include "lib/core/status.h"
#include "lib/core/virtual_kv_cache.h"
#include "lib/engine/sequence_state.h"

namespace vtoken::engine {

class PrefixForks {
 public:
  // All four must outlive this object; `running` lists indices into `seqs`.
  PrefixForks(std::vector<SeqState>& seqs, const std::vector<size_t>& running,
              VirtualKvCache& cache, CopyEngine& copies)
      : seqs_(seqs), running_(running), cache_(cache), copies_(copies) {}

  // seqs[index] was just admitted: it leads its group, or waits to fork the leader's prefix
  // (awaiting_fork) while the leader runs and has not computed past (or evicted from) it.
  void Admitted(size_t index);

  // seqs[index] computed tokens. If it leads its group and now holds exactly the shared prefix,
  // every member waiting for it takes the prefix blocks by reference instead of recomputing
  // them. Errors: the cache's (ForkSequence, FreeSequence).
  Status Computed(size_t index);

  // seqs[index] leaves the running list (finished or preempted): its group's members stop
  // waiting, and a new member will lead.
  void Leaving(size_t index);

  // Requests that took their group's shared prefix by reference.
  int64_t num_forks() const { return num_forks_; }

 private:
  bool IsLeaderForkable(size_t leader, int64_t shared_tokens) const;

  std::vector<SeqState>& seqs_;
  const std::vector<size_t>& running_;
  VirtualKvCache& cache_;
  CopyEngine& copies_;
  std::map<int32_t, size_t> leaders_;  // Prefix group -> the member computing its prefix.
  int64_t num_forks_ = 0;
};

}  // namespace vtoken::engine
