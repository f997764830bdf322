// The engine's state of one request while it runs (lib/engine internal): its tokens, how many of
// them the cache holds, its place in its prefix group and the figures it reports. The scheduler,
// the prefix forks and the step share one vector of them, indexed as the requests are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "lib/core/types.h"
#include "lib/engine/engine.h"
#include "lib/engine/workload.h"

namespace vtoken::engine {

struct SeqState {
  const Request* request = nullptr;
  size_t index = 0;
  SeqId seq = kNoSeq;
  std::vector<int32_t> tokens;  // Prompt, then sampled outputs.
  int64_t num_computed = 0;     // Leading tokens whose KV is in the cache.
  bool observed = false;        // The policy saw this sequence's prefill.
  int64_t shared_tokens = 0;    // Leading tokens shared with its prefix group (BOS included).
  bool awaiting_fork = false;   // Admitted; will fork its group leader's shared prefix.
  int64_t prefix_request = -1;  // The leader's request id once forked (RunnerInput's field).
  // Request::question_tokens not yet appended to `tokens` (query-agnostic tasks); then the
  // question's end in `tokens`.
  bool question_pending = false;
  int64_t question_end = 0;
  int64_t admitted = 0;  // Admission order; preemption takes the newest.
  RequestResult result;
  double blocks_sum = 0;
  int64_t blocks_samples = 0;
};

// One sequence's share of a step: `n` new tokens of seqs[index] and the slots they go to.
struct Planned {
  size_t index;
  int64_t n;
  std::vector<SlotIndex> slots;  // [G * n], group-major.
};

}  // namespace vtoken::engine
