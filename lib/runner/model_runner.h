// ModelRunner: what the engine needs from a model, without torch types, so lib/engine stays
// torch-free and testable with a scripted fake. It lives below the engine, the simulator and the
// model (lib/runner: the standard library and lib/core only). The libtorch implementation is
// LlamaRunner (lib/model/llama_runner.h); it owns the model, its paged KV tensors and their copy
// engine; the simulated one is SimRunner (lib/sim/sim_runner.h).
//
// Slots come from the core (VirtualKvCache::SyncNewTokens / LiveSlots); a runner only reads and
// writes KV rows at the slots it is given. Not thread-safe: called from the scheduler thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "lib/core/copy_engine.h"
#include "lib/core/policy.h"
#include "lib/core/status.h"
#include "lib/core/token_signal.h"
#include "lib/core/types.h"

namespace vtoken::model {

struct SamplingParams {
  double temperature = 0.0;  // <= 0: greedy.
  double top_p = 1.0;
  uint64_t seed = 0;  // Per request; the same seed and logits give the same token.
};

// One sequence's part of a batched step.
//
// KV groups (lib/core/types.h, Granularity): a runner made for G = num_kv_groups() groups keeps
// a separate slot list per group. Slots are group slots (one group's K and V rows); lists are
// group-major. With n new tokens and ctx_g live context tokens in group g:
//   write_slots        [G * n]: group g's slots for the new tokens at [g * n, (g + 1) * n);
//   context_slots      group g's live context in logical order at
//                      [context_offsets[g], context_offsets[g + 1]);
//   context_positions  the same layout: their logical ids;
//   context_offsets    [G + 1], or empty when G == 1 (all of context_slots is group 0).
// Query head q of layer l reads KV head h = q / (num_heads / num_kv_heads) from the slots of group
// KvGroupOf(granularity, l, h). At G == 1 every field means what it always meant.
struct RunnerInput {
  int64_t request = 0;  // Caller's id, keys per-request sampler state.
  // The request whose K/V this one's leading context tokens are, or -1: a prefix fork reads the
  // slots its group leader wrote (the engine's prefix sharing). Verifying runners accept slots
  // written under either id (SimRunner's tags); the others ignore it.
  int64_t prefix_request = -1;
  std::vector<int32_t> tokens;             // New tokens (prefill chunk or 1 decode token).
  std::vector<int64_t> positions;          // Their RoPE positions (logical token ids).
  std::vector<SlotIndex> write_slots;      // Where their KV goes (per group, see above).
  std::vector<SlotIndex> context_slots;    // Earlier live tokens' slots, logical order.
  std::vector<int64_t> context_positions;  // Their logical ids (= RoPE positions).
  std::vector<int64_t> context_offsets;    // Per-group ranges of the two above; empty: G == 1.
  bool sample = true;                      // Sample a next token from the last position.
  // Teacher forcing (perplexity): with `sample`, a token id >= 0 whose log-probability under the
  // last position's distribution (log softmax of the logits, temperature 1) the runner returns
  // in RunnerOutput::score_logprob. -1: none.
  int32_t score_token = -1;
  SamplingParams sampling;
  int32_t obs_window = 32;  // Signals from the last min(obs_window, n) queries.
  // The caller reads this step's signals (a policy reads them now: PolicyEvictor::SignalsWanted).
  // When false a runner may leave RunnerOutput::attn / key_norm empty.
  bool want_signals = true;
  // Which of them (kAttnSignal | kKeyNormSignal, lib/core/policy.h: ModelSignals of the
  // policy's declaration);
  // with want_signals, a runner returns both vectors at full length and may leave a signal
  // not asked for at zero.
  uint8_t signals = kAttnSignal | kKeyNormSignal;
  // The runner keeps the request's query statistics (token_signal.h's QueryMoments) and adds
  // this step's queries to them, for a policy whose token signals read queries; they last until
  // ForgetRequest.
  bool keep_query_moments = false;
};

// True when in.context_offsets is a valid split of the context into `groups` ranges: empty with
// one group, else [groups + 1] non-decreasing offsets from 0 to context_slots.size().
inline bool ValidContextOffsets(const RunnerInput& in, int32_t groups) {
  const auto& o = in.context_offsets;
  if (o.empty()) return groups == 1;
  return o.size() == static_cast<size_t>(groups) + 1 && o.front() == 0 &&
         o.back() == static_cast<int64_t>(in.context_slots.size()) &&
         std::is_sorted(o.begin(), o.end());
}

// Group g's range [first, second) of context_slots / context_positions.
// REQUIRES: ValidContextOffsets(in, groups) with g < groups.
inline std::pair<int64_t, int64_t> ContextRange(const RunnerInput& in, int32_t g) {
  if (in.context_offsets.empty()) return {0, static_cast<int64_t>(in.context_slots.size())};
  return {in.context_offsets[g], in.context_offsets[g + 1]};
}

struct RunnerOutput {
  int32_t next_token = -1;  // Sampled when RunnerInput::sample, else -1.
  // log p(RunnerInput::score_token) when one was given; NaN otherwise (and from runners without
  // logits, such as the simulator).
  double score_logprob = std::numeric_limits<double>::quiet_NaN();
  // Per group g (group-major), per token of g's context then the new tokens (ctx_g + n values
  // starting at context_offsets[g] + g * n): the attention mass it received, averaged over the
  // group's query heads (token: every layer's; layer: that layer's; head: the query heads reading
  // that KV head) and the signal queries, so it sums to 1 per group; and the L2 norm of its key
  // averaged over the group's KV rows.
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
  // The host spent `measured_s` seconds of real time in `phase` of a step: the policy's work
  // (observe, score, evict), the reclaimer's planning, or scheduling (building the step's inputs:
  // every sequence's context per KV group).
  enum class HostPhase { kPolicy, kPlanner, kSchedule };
  virtual void HostWork(HostPhase phase, double measured_s) = 0;
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
  // Group slots of the KV store (a slot holds kv_bytes_per_token() / num_kv_groups() bytes).
  virtual int64_t num_slots() const = 0;
  // KV groups (RunnerInput): 1 at token granularity.
  virtual int32_t num_kv_groups() const { return 1; }
  virtual Granularity granularity() const { return Granularity::kToken; }
  // The layers and KV heads one KV group's rows span (KvGroupRowsOf): how many columns a token
  // signal's view has (TokenSignalInfo::columns).
  virtual KvGroupRows kv_group_rows() const { return {}; }
  // Runs one batched step. InvalidArgument for malformed inputs (slot out of range, ...).
  virtual StatusOr<std::vector<RunnerOutput>> Forward(const std::vector<RunnerInput>& inputs) = 0;
  // Copies KV rows between slots of this runner's cache (relocation, fork copy-on-write).
  virtual CopyEngine& copy_engine() = 0;
  // xxhash64 over the K then V bytes the group slot holds (token granularity: every layer's), for
  // verification.
  virtual uint64_t TokenKvHash(SlotIndex slot) = 0;
  // TokenKvHash of every slot, in order. Runners with device KV override it to hash on the
  // device in one launch and one copy back; this default calls TokenKvHash per slot.
  virtual std::vector<uint64_t> TokenKvHashes(std::span<const SlotIndex> slots) {
    std::vector<uint64_t> hashes;
    hashes.reserve(slots.size());
    for (SlotIndex slot : slots) hashes.push_back(TokenKvHash(slot));
    return hashes;
  }
  // The K and V bytes `slots` hold, in a layout of the runner's choosing that WriteKv takes back
  // (a slot's bytes are kv_bytes_per_token() / num_kv_groups()), appended to `out`: what
  // engine::PrefillMemo keeps of a computed prefill chunk. FailedPrecondition from a runner that
  // cannot (the simulator's).
  virtual Status ReadKv(std::span<const SlotIndex> slots, std::vector<std::byte>& out) {
    (void)slots, (void)out;
    return FailedPreconditionError("this runner cannot read its KV rows back");
  }
  // Writes bytes ReadKv returned for as many slots into `slots`, as if a forward had computed
  // them there. InvalidArgument on a size mismatch or a slot out of range.
  virtual Status WriteKv(std::span<const SlotIndex> slots, std::span<const std::byte> bytes) {
    (void)slots, (void)bytes;
    return FailedPreconditionError("this runner cannot write KV rows");
  }
  // Token signals (lib/core/token_signal.h) of the tokens at group slots `slots`: per slot, each
  // signal's columns (one value, or a view's per layer or per row) in the order of `signals`,
  // reduced over the KV rows the slot holds as ReduceTokenSignals does, appended to `out`
  // slot-major (TokenSignalWidth values per slot). A relative signal's anchors (or set function)
  // are taken over `slots` (the caller lists every live token of group scope.group, at
  // scope.positions), with the query statistics of scope.request for a signal that reads queries.
  // Read from the cached rows (converted to fp32), so every backend and KV dtype gives the signal
  // of the rows attention reads. InvalidArgument for a slot out of range; FailedPrecondition from a
  // runner that holds no K/V rows (the simulator's): a policy reading token signals cannot run on
  // it; and for a signal reading queries of a request that kept none.
  virtual Status TokenSignals(std::span<const SlotIndex> slots,
                              std::span<const TokenSignalInfo* const> signals,
                              const TokenSignalScope& scope, std::vector<float>& out) const {
    (void)slots, (void)signals, (void)scope, (void)out;
    return FailedPreconditionError("this runner holds no K/V rows to compute token signals from");
  }
  // Drops per-request state (sampler streams).
  virtual void ForgetRequest(int64_t request) = 0;
  // The run's clock; nullptr: the wall clock.
  virtual RunClock* clock() { return nullptr; }
};

// A runner that passes every call to `inner`: the base of decorators, which override what they
// change (RecordingRunner records Forward; test spies count it).
class ForwardingRunner : public ModelRunner {
 public:
  explicit ForwardingRunner(ModelRunner& inner) : inner_(inner) {}
  int64_t vocab_size() const override { return inner_.vocab_size(); }
  int64_t max_context() const override { return inner_.max_context(); }
  std::optional<int32_t> bos_token_id() const override { return inner_.bos_token_id(); }
  const std::vector<int64_t>& eos_token_ids() const override { return inner_.eos_token_ids(); }
  int64_t kv_bytes_per_token() const override { return inner_.kv_bytes_per_token(); }
  int64_t num_slots() const override { return inner_.num_slots(); }
  int32_t num_kv_groups() const override { return inner_.num_kv_groups(); }
  Granularity granularity() const override { return inner_.granularity(); }
  KvGroupRows kv_group_rows() const override { return inner_.kv_group_rows(); }
  StatusOr<std::vector<RunnerOutput>> Forward(const std::vector<RunnerInput>& inputs) override {
    return inner_.Forward(inputs);
  }
  CopyEngine& copy_engine() override { return inner_.copy_engine(); }
  uint64_t TokenKvHash(SlotIndex slot) override { return inner_.TokenKvHash(slot); }
  std::vector<uint64_t> TokenKvHashes(std::span<const SlotIndex> slots) override {
    return inner_.TokenKvHashes(slots);
  }
  Status ReadKv(std::span<const SlotIndex> slots, std::vector<std::byte>& out) override {
    return inner_.ReadKv(slots, out);
  }
  Status WriteKv(std::span<const SlotIndex> slots, std::span<const std::byte> bytes) override {
    return inner_.WriteKv(slots, bytes);
  }
  Status TokenSignals(std::span<const SlotIndex> slots,
                      std::span<const TokenSignalInfo* const> signals,
                      const TokenSignalScope& scope, std::vector<float>& out) const override {
    return inner_.TokenSignals(slots, signals, scope, out);
  }
  void ForgetRequest(int64_t request) override { inner_.ForgetRequest(request); }
  RunClock* clock() override { return inner_.clock(); }

 protected:
  ModelRunner& inner_;
};

}  // namespace vtoken::model
