// ModelRunner: what the engine needs from a model, without torch types, so lib/engine stays
// torch-free and testable with a scripted fake. The libtorch implementation is LlamaRunner
// (lib/model/llama_runner.h); it owns the model, its paged KV tensors and their copy engine.
//
// Slots come from the core (VirtualKvCache::SyncNewTokens / LiveSlots); a runner only reads and
// writes KV rows at the slots it is given. Not thread-safe: called from the scheduler thread.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "lib/core/copy_engine.h"
#include "lib/core/status.h"
#include "lib/core/types.h"

namespace vtoken::model {

struct SamplingParams {
  double temperature = 0.0;  // <= 0: greedy.
  double top_p = 1.0;
  uint64_t seed = 0;  // Per request; the same seed and logits give the same token.
};

// One sequence's part of a batched step.
struct RunnerInput {
  int64_t request = 0;                   // Caller's id, keys per-request sampler state.
  std::vector<int32_t> tokens;           // New tokens (prefill chunk or 1 decode token).
  std::vector<int64_t> positions;        // Their RoPE positions (logical token ids).
  std::vector<SlotIndex> write_slots;    // Where their KV goes.
  std::vector<SlotIndex> context_slots;  // Earlier live tokens' slots, logical order.
  std::vector<int64_t> context_positions;  // Their logical ids (= RoPE positions).
  bool sample = true;                    // Sample a next token from the last position.
  SamplingParams sampling;
  int32_t obs_window = 32;  // Signals from the last min(obs_window, n) queries.
  // The caller reads this step's signals (a policy observes the sequence now). When false a
  // runner may leave RunnerOutput::attn / key_norm empty.
  bool want_signals = true;
};

struct RunnerOutput {
  int32_t next_token = -1;  // Sampled when RunnerInput::sample, else -1.
  // Per token of context_slots then the new tokens: attention mass received (averaged over
  // layers, heads, signal queries) and key norm.
  std::vector<float> attn;
  std::vector<float> key_norm;
};

// The time line a run's latencies are measured on (arrivals, TTFT, TPOT, E2E, step times).
// Real runners have none: the engine uses the wall clock. SimRunner keeps a virtual clock that
// its cost model advances, so every time figure of a simulated run is deterministic.
class RunClock {
 public:
  virtual ~RunClock() = default;
  // Sets t = 0 (the start of a run).
  virtual void Start() = 0;
  // Seconds since Start, as the host sees them at this point of the step.
  virtual double Now() = 0;
  // There is nothing to run before `t` (waiting for the next arrival).
  virtual void WaitUntil(double t) = 0;
  // The host spent `measured_s` seconds of real CPU time planning relocations.
  virtual void HostWork(double measured_s) = 0;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_context() const = 0;
  // The token every sequence starts with, when the model was trained with one.
  virtual std::optional<int32_t> bos_token_id() const = 0;
  // EOS token ids of the model (generation stops on any of them).
  virtual const std::vector<int64_t>& eos_token_ids() const = 0;
  // KV bytes of one token over all layers, K and V.
  virtual int64_t kv_bytes_per_token() const = 0;
  virtual int64_t num_slots() const = 0;
  // Runs one batched step. InvalidArgument for malformed inputs (slot out of range, ...).
  virtual StatusOr<std::vector<RunnerOutput>> Forward(const std::vector<RunnerInput>& inputs) = 0;
  // Copies KV rows between slots of this runner's cache (relocation, fork copy-on-write).
  virtual CopyEngine& copy_engine() = 0;
  // xxhash64 over the token's K then V bytes of every layer (for verification).
  virtual uint64_t TokenKvHash(SlotIndex slot) = 0;
  // Drops per-request state (sampler streams).
  virtual void ForgetRequest(int64_t request) = 0;
  // The run's clock; nullptr: the wall clock.
  virtual RunClock* clock() { return nullptr; }
};

}  // namespace vtoken::model
