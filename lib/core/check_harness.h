// CheckHarness: a model-based verifier for the virtualization layer. It applies operations
// (add / fork / free sequences, append tokens, evict, reclaim, poll, read) to a real
// VirtualKvCache + HostKvStore + CopyEngine + Reclaimer, and to a naive reference: per sequence
// and KV group, a map of logical token -> the content its KV bytes must hold. After every operation
// it checks the cache's invariants and that every live token whose slot is not awaiting a copy
// holds its reference bytes; around every relocation it compares per-token KV hashes before and
// after.
//
// The same harness serves `vtoken-cli check`, the randomized tests and the libFuzzer target:
// operations are chosen from caller-supplied random words, so a fuzzer's bytes drive it too.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lib/core/copy_engine.h"
#include "lib/core/host_kv_store.h"
#include "lib/core/mix.h"
#include "lib/core/reclaimer.h"
#include "lib/core/status.h"
#include "lib/core/virtual_kv_cache.h"

namespace vtoken {

class EvictionDriver;  // Chooses victims; defined by the policy layer (policy.h).

struct CheckOptions {
  uint64_t seed = 1;      // Seeds every random choice.
  int64_t steps = 20000;  // Operations to run (RunCheck).
  Mode mode = Mode::kVtoken;
  BlockPoolOptions pool{.num_blocks = 64, .block_size = 16, .headroom_blocks = 8};
  int32_t num_layers = 2;        // KV rows per slot in the HostKvStore.
  int64_t bytes_per_token = 32;  // Per row, K and V together.
  // KV groups per sequence (cache.granularity): each group has its own liveness and slots; the
  // reference holds, per group, logical token -> content, and a slot of group g holds the
  // content's rows g * num_layers ... (g + 1) * num_layers - 1. In [1, kMaxKvGroups].
  int32_t num_groups = 1;
  bool async_copies = false;       // Copy on a worker thread (AsyncHostCopyEngine).
  int64_t copy_delay_us = 0;       // Async only: stall each copy, so reads meet pending slots.
  int32_t max_seqs = 8;            // Live sequences at most.
  int64_t max_prompt_tokens = 96;  // New sequences start with 1..max_prompt_tokens tokens.
  // Forks only copy sequences nothing was evicted from (prefix sharing of fresh prompts). Makes
  // naive and vtoken runs of one trace share the same blocks.
  bool fork_only_fresh = false;
  // Check invariants and every live token's bytes after every operation (else only on reads).
  bool verify_every_op = true;
  ReclaimOptions reclaim{.trigger = ReclaimOptions::Trigger::kAlways};
};

Status ValidateCheckOptions(const CheckOptions& options);

struct CheckReport {
  int64_t steps = 0;
  int64_t evictions = 0;
  int64_t appended_tokens = 0;
  int64_t forks = 0;
  int64_t pool_exhausted = 0;  // Appends refused for lack of blocks (the seq was then freed).
  int64_t relocations = 0;     // Non-empty reclaim plans executed.
  int64_t tokens_moved = 0;
  int64_t blocks_reclaimed = 0;  // Source minus destination blocks over all relocations.
  int64_t hash_checks = 0;       // Relocated tokens whose KV hash was compared before/after.
  int64_t invariant_checks = 0;
  int64_t tokens_verified = 0;  // Live-token byte comparisons against the reference.
  int64_t fence_waits = 0;
  int64_t violations = 0;
  std::vector<std::string> first_violations;  // Up to 10 messages.
};

class CheckHarness final : public RelocationObserver {
 public:
  // REQUIRES: ValidateCheckOptions(options).ok().
  explicit CheckHarness(const CheckOptions& options);
  ~CheckHarness() override;

  // Applies one operation chosen from three random words.
  void Step(uint64_t op_word, uint64_t arg1, uint64_t arg2);
  // Runs reclaim steps until a plan moves nothing, then drains the copies (vtoken only).
  void ReclaimFully();
  // Frees every sequence, drains copies and verifies the pool is whole again.
  void Finish();

  // Lets a policy choose victims for eviction operations (nullptr: uniformly random victims).
  void set_eviction_driver(EvictionDriver* driver) { driver_ = driver; }

  const CheckReport& report();
  const VirtualKvCache& cache() const { return cache_; }
  std::vector<SeqId> sequences() const { return cache_.Sequences(); }

  void BeforeCopy(const Relocation& relocation) override;
  void AfterCopy(const Relocation& relocation) override;

 private:
  void AddSequence(uint64_t arg);
  void ForkSequence(uint64_t arg1, uint64_t arg2);
  void FreeSequence(SeqId seq);
  void Append(SeqId seq, int64_t n);
  void Evict(SeqId seq, uint64_t arg);
  void Reclaim();
  void Read(SeqId seq);
  void Verify(bool fence_all);
  void VerifySeq(SeqId seq, bool require_no_pending);
  void Violation(const std::string& message);
  SeqId PickSeq(uint64_t arg) const;

  CheckOptions options_;
  VirtualKvCache cache_;
  HostKvStore store_;
  std::unique_ptr<CopyEngine> engine_;
  Reclaimer reclaimer_;
  EvictionDriver* driver_ = nullptr;
  // Reference model: seq -> per group (logical token -> content id of its KV bytes).
  std::map<SeqId, std::vector<std::map<TokenId, uint64_t>>> reference_;
  std::map<SeqId, bool> evicted_from_;
  std::map<SlotIndex, uint64_t> hashes_before_;  // Destination slot -> source hash.
  uint64_t next_content_ = 1;
  CheckReport report_;
};

// Runs options.steps random operations from options.seed, then Finish(). Returns the report;
// violations are counted in it, not returned as errors.
StatusOr<CheckReport> RunCheck(const CheckOptions& options, EvictionDriver* driver = nullptr);

// Fills `out` with the deterministic bytes of `content` in row `layer` (of group 0; group g's
// rows are numbered from g * num_layers).
void FillContent(uint64_t content, int32_t layer, std::span<std::byte> out);

}  // namespace vtoken
