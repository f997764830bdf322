// Engine: continuous batching of requests through a model runner and the virtualized paged KV
// cache, under a fixed block budget, in one of the three modes (DESIGN.md §7):
//   native  no eviction;
//   naive   a policy evicts tokens; a block returns to the pool only when none of its tokens live;
//   vtoken  naive plus the reclaimer, which repacks sparse blocks and frees the rest.
//
// Each step, in the paper's stage-aware order:
//   1. schedule: move arrived requests to the waiting queue; admit waiting requests FCFS while
//      max_num_seqs and the free blocks minus the reclaimer's headroom allow their prompt;
//   2. build the batch: a prefill chunk or one decode token per running sequence, registering
//      new tokens with SyncNewTokens; a sequence that cannot get a block preempts the newest
//      running sequence (recompute: its KV is dropped and it is re-prefilled later);
//   3. fence: wait for a pending copy only if it touches a slot this step reads;
//   4. forward -> sampled tokens + per-token signals;
//   5. policy: observe signals, evict victims (after prefill, then every evict_interval steps);
//      vtoken: plan, submit copies (asynchronously), commit the table;
//   6. sampling bookkeeping, finished requests freed, completed copies retired, metrics.
// Prefix sharing: requests of one prefix group admitted together share the group's prefix. The
// first admitted member (the leader) ends a prefill chunk exactly at the shared prefix; the other
// members then fork it (VirtualKvCache::ForkSequence: full prefix blocks shared by reference,
// the partial one copied) and prefill only their own suffix. Shared blocks are never relocated;
// each member's private blocks are.
//
// The engine is torch-free: the model is a model::ModelRunner (LlamaRunner in lib/model, a
// scripted fake in tests). Not thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lib/core/block_pool.h"
#include "lib/core/policy.h"
#include "lib/core/policy_evictor.h"
#include "lib/core/reclaim_planner.h"
#include "lib/core/status.h"
#include "lib/core/types.h"
#include "lib/engine/result_store.h"
#include "lib/engine/workload.h"
#include "lib/runner/model_runner.h"

namespace vtoken::engine {

struct EngineOptions {
  Mode mode = Mode::kVtoken;
  BlockPoolOptions pool{.num_blocks = 512, .block_size = 16, .headroom_blocks = 8};
  ReclaimOptions reclaim;
  // vtoken bookkeeping on, eviction off (the paper's indirection-overhead ablation).
  bool indirection_only = false;
  // Wait for every relocation copy right after submitting it (force-sync ablation).
  bool force_sync = false;
  // Running sequences at most.
  int32_t max_num_seqs = 16;
  // Admission. kReserve admits a request only while the free blocks (minus headroom) cover its
  // whole prompt and output plus what every running sequence may still grow by (remaining
  // prompt + remaining output tokens): no request is ever preempted, and a mode that holds fewer
  // blocks admits more. kGreedy admits while the free blocks cover the prompt alone (vLLM-like)
  // and preempts (recompute, newest first) when the pool runs out.
  enum class Admission { kReserve, kGreedy };
  Admission admission = Admission::kReserve;
  // Prompt tokens one sequence prefills per step (chunked prefill). Must be >= 1.
  int64_t max_prefill_chunk = 512;
  // New tokens of one step over all sequences (vLLM's max_num_batched_tokens). 0: no limit,
  // every running sequence takes its chunk. > 0: decoding sequences first (one token each),
  // then prefill chunks in admission order while the budget lasts; a sequence left without
  // budget waits for a later step. Must be 0 or >= max_num_seqs (every decode fits).
  int64_t max_batched_tokens = 0;
  // Policy (ignored in native mode and with indirection_only). Must name a registered policy.
  std::string policy = "h2o";
  RawParams policy_params;
  EvictorOptions evictor{.keep_ratio = 0.25, .num_sink = 4, .num_recent = 32};
  model::SamplingParams sampling;
  // Stop a request at an EOS token (else it always produces max_tokens, as benchmarks do).
  bool stop_at_eos = false;
  // Prefill queries whose attention feeds the policy's first observation.
  int32_t obs_window = 32;
  // Threads for the policy's work between two model steps (observing each sequence's signals and
  // picking its victims, independent across sequences): 0 = this machine's hardware threads,
  // 1 = the scheduler thread alone. The results do not depend on it.
  int32_t policy_threads = 0;
  // Check the cache's invariants after every step and compare per-token KV hashes before and
  // after every relocation (vtoken-cli check on a real model). Costs time; off for benchmarks.
  bool verify = false;
  uint64_t seed = 1;
};

// Validates the options against each other and against the runner's KV capacity: InvalidArgument
// naming the field (or ResourceExhausted when the pool cannot hold one request's prompt).
Status ValidateEngineOptions(const EngineOptions& options, const model::ModelRunner& runner,
                             const std::vector<Request>& requests);

// Per-request results (definitions in docs/METRICS.md): the figures the result store keeps
// (RequestMetrics, one field per `requests` column), then what the run derives its other columns
// and its outputs from.
struct RequestResult : RequestMetrics {
  std::vector<int32_t> output_tokens;
  int64_t live_final = 0;  // Live tokens when it finished.
  // Layer / head granularity: the live tokens of each KV group when it finished, one row per
  // layer (one entry per KV head at head granularity, one at layer granularity). Empty at token
  // granularity.
  std::vector<std::vector<int64_t>> live_per_group;
  // Teacher-forced requests: log p of each forced token, in order (natural log).
  std::vector<double> token_logprobs;
};

struct EngineResult {
  // KV groups of the run (1 at token granularity). Block counts (requests, steps) are in
  // blocks of one group; a block of a token-granularity run holds num_groups times the bytes.
  int32_t kv_groups = 1;
  std::vector<RequestResult> requests;  // In request order.
  std::vector<StepRecord> steps;        // One per step, as the result store keeps them.
  double wall_s = 0;
  int64_t preemptions = 0;
  int32_t peak_running = 0;
  int64_t evictions = 0;
  int64_t forks = 0;  // Requests that took their group's shared prefix blocks by reference.
  // Reclamation cost.
  int64_t plans = 0, moves = 0, bytes_moved = 0, blocks_reclaimed = 0, fence_waits = 0;
  double planner_s = 0, fence_s = 0, forward_s = 0, policy_s = 0;
  // Building the steps' inputs: the new tokens' slots, then every sequence's context per KV
  // group; fence waits excluded (host wall time).
  double schedule_s = 0;
  // Verification (EngineOptions::verify).
  int64_t invariant_checks = 0, hash_checks = 0, violations = 0;
  std::vector<std::string> first_violations;
};

// Called after every step with the step's figures (for a progress line).
using StepCallback = std::function<void(const StepRecord&, int64_t finished, int64_t total)>;

// Asked after every step (after on_step); true stops the run (e.g. on SIGINT).
using StopRequest = std::function<bool()>;

// Runs every request to completion. Errors: invalid options, a runner failure; when `stop`
// returned true, kFailedPrecondition "stopped after step N" once the pending copies finished.
StatusOr<EngineResult> RunEngine(const EngineOptions& options, model::ModelRunner& runner,
                                 const std::vector<Request>& requests,
                                 const StepCallback& on_step = nullptr,
                                 const StopRequest& stop = nullptr);

}  // namespace vtoken::engine
