// Verification of a run (EngineOptions::verify): per-token KV hashes compared before and after
// every relocation (as the reclaimer's RelocationObserver), and the cache's invariants after
// every step. What it finds goes into an EngineResult: hash_checks, invariant_checks, violations
// and the first ten violations' descriptions. Not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lib/core/reclaimer.h"
#include "lib/core/virtual_kv_cache.h"
#include "lib/engine/engine.h"
#include "lib/runner/model_runner.h"

namespace vtoken::engine {

class RunVerifier final : public RelocationObserver {
 public:
  // Hashes through `runner`; counts into `result`. Both must outlive the verifier.
  RunVerifier(model::ModelRunner& runner, EngineResult& result)
      : runner_(runner), result_(result) {}

  // One batched hash call per relocation and side (a device runner hashes on the device).
  void BeforeCopy(const Relocation& relocation) override;
  // Counts a hash check per move, and a violation per move whose destination does not hold the
  // bytes its source held.
  void AfterCopy(const Relocation& relocation) override;

  // Counts an invariant check, and a violation when `cache`'s invariants do not hold.
  void CheckCache(const VirtualKvCache& cache);

  // How many violation descriptions EngineResult::first_violations keeps.
  static constexpr size_t kMaxDescribed = 10;

 private:
  // Whether the runner returned one hash per slot; a violation if not.
  bool CountMatches(const std::vector<uint64_t>& hashes, const std::vector<SlotIndex>& slots);
  void AddViolation(std::string description);

  model::ModelRunner& runner_;
  EngineResult& result_;
  std::map<SlotIndex, uint64_t> before_;  // Destination slot -> its source's hash.
};

}  // namespace vtoken::engine
