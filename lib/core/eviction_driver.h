// EvictionDriver: chooses which live tokens of a sequence to evict. The policy layer implements it
// (scoring tokens with a registered policy under a budget); CheckHarness uses it to let a real
// policy drive evictions in `vtoken-cli check --policy NAME`.
#pragma once

#include <cstdint>
#include <vector>

#include "lib/core/types.h"

namespace vtoken {

class VirtualKvCache;

class EvictionDriver {
 public:
  virtual ~EvictionDriver() = default;
  // Returns, per KV group of the cache (result[g]; one entry at token granularity), distinct
  // live tokens of `seq` to evict now (possibly none). `entropy` is a random word the caller
  // draws from its seeded source, for drivers that synthesize signals.
  virtual std::vector<std::vector<TokenId>> ChooseVictims(const VirtualKvCache& cache, SeqId seq,
                                                          uint64_t entropy) = 0;
  // Called when `seq` is freed, so per-sequence state can be dropped.
  virtual void ForgetSequence(SeqId seq) = 0;
};

}  // namespace vtoken
