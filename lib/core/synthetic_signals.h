// SyntheticSignalDriver: drives a PolicyEvictor from CheckHarness (`vtoken-cli check --policy
// NAME`). Each ChooseVictims call is one step of that sequence: it synthesizes signals for the live
// tokens from the entropy word, observes them and returns the victims. The synthetic attention is
// Zipf-like and persistent: a stable eighth of the tokens (by hash of seq and token) are heavy
// hitters with 16x weight, the first token is a sink with 8x, the four newest tokens get 4x,
// and every weight carries per-step noise; it is normalized to sum 1. Key norms are stable per
// token in [1, 3), halved for heavy hitters and the sink; token signals (token_signal.h) are stable
// per token and signal in [1, 3). With KV groups each group draws its own heavy hitters (by hash
// of seq, group and token) and noise.
//
// It also checks the evictor's contract on every step (victims are live and distinct, an
// eviction leaves exactly the budget: per group, or per layer under adaptive allocation); the
// first breach or evictor error is kept in status().
#pragma once

#include <cstdint>
#include <vector>

#include "lib/core/eviction_driver.h"
#include "lib/core/policy_evictor.h"
#include "lib/core/status.h"
#include "lib/core/types.h"

namespace vtoken {

class VirtualKvCache;

class SyntheticSignalDriver final : public EvictionDriver {
 public:
  explicit SyntheticSignalDriver(PolicyEvictor& evictor) : evictor_(evictor) {}

  std::vector<std::vector<TokenId>> ChooseVictims(const VirtualKvCache& cache, SeqId seq,
                                                  uint64_t entropy) override;
  void ForgetSequence(SeqId seq) override { evictor_.Forget(seq); }

  const Status& status() const { return status_; }
  int64_t policy_steps() const { return policy_steps_; }
  int64_t victims() const { return victims_; }

 private:
  PolicyEvictor& evictor_;
  Status status_;
  int64_t policy_steps_ = 0;
  int64_t victims_ = 0;
  std::vector<float> attn_;
  std::vector<float> key_norm_;
  std::vector<float> token_values_;
};

}  // namespace vtoken
