// SimRunner: a ModelRunner without weights or KV tensors, so the real engine, scheduler,
// policies, planner and reclaimer run at paper scale (8B-14B shapes, 16K contexts, thousands of
// blocks) on any machine. Three things stand in for the GPU:
//   - a tag store: one 64-bit tag per KV slot, (request, KV group, position) of the token
//     written there.
//     The copy engine moves tags as a real copy moves bytes, when the copy completes on the
//     virtual clock; TokenKvHash hashes the tag, so the engine's relocation verification
//     compares tags where a real runner compares KV hashes. Every forward also checks that each
//     context slot holds the token the engine says it reads: its position and group, written by
//     this request or by RunnerInput::prefix_request (FailedPrecondition otherwise);
//   - a signal source (signal_source.h): parametric attention or a replayed trace;
//   - a virtual clock (model::RunClock) advanced by the roofline cost model (cost_model.h):
//     each forward costs ForwardCost, the host's own work host_overhead_s after it; relocation
//     copies start when the forward that produced them ends and run on a copy stream, so in the
//     stage-aware order they overlap the host phase and the next forward waits for them only
//     through the reclaimer's read fence; with force_sync the host waits for each copy before
//     its host phase.
// Sampled tokens come from a seeded hash of (seed, request, position), or from the trace.
//
// Not thread-safe: called from the scheduler thread.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lib/model/io/hf_config.h"
#include "lib/runner/model_runner.h"
#include "lib/sim/cost_model.h"
#include "lib/sim/signal_source.h"

namespace vtoken::sim {

struct SimOptions {
  model::ModelConfig config;
  int64_t dtype_bytes = 2;  // bf16 / fp16
  HardwareSpec hardware;
  int64_t num_slots = 0;  // Group slots: num_blocks * block_size, >= 1.
  // What a slot holds (lib/core/types.h): per-layer / per-head runs keep one tag per group slot
  // and draw signals per group.
  Granularity granularity = Granularity::kToken;
  uint64_t seed = 1;        // Sampled tokens.
  bool force_sync = false;  // The engine's force-sync ablation: copies serialize the host.
  // Add the planner's measured CPU time to the host timeline (makes latencies vary slightly
  // between runs); off: the planner costs no virtual time.
  bool measured_planner_time = false;
  // Add the engine's measured policy time (observe, score, pick, evict: this host's wall time,
  // on the engine's policy threads) to the host timeline after each forward, on top of
  // host_overhead_s; off: host_overhead_s is the host's whole work per step.
  bool measured_policy_time = false;
  // Add the engine's measured scheduling time (admission, reservation, listing every sequence's
  // context per KV group: O(live tokens x groups) per step) to the host timeline before the
  // forward, on top of host_overhead_s.
  bool measured_schedule_time = false;
  // Fault injection for tests: every n-th relocated token lands with the wrong tag (0: never).
  int64_t corrupt_every_nth_copy = 0;
};

class SimRunner final : public model::ModelRunner {
 public:
  // InvalidArgument for a bad config, hardware or slot count.
  static StatusOr<std::unique_ptr<SimRunner>> Create(const SimOptions& options,
                                                     std::unique_ptr<SignalSource> signals);
  ~SimRunner() override;

  int64_t vocab_size() const override { return o_.config.vocab_size; }
  int64_t max_context() const override { return o_.config.max_position_embeddings; }
  std::optional<int32_t> bos_token_id() const override;
  const std::vector<int64_t>& eos_token_ids() const override { return o_.config.eos_token_ids; }
  int64_t kv_bytes_per_token() const override { return shape_.kv_bytes_per_token; }
  int64_t num_slots() const override { return o_.num_slots; }
  int32_t num_kv_groups() const override { return groups_; }
  Granularity granularity() const override { return o_.granularity; }
  StatusOr<std::vector<model::RunnerOutput>> Forward(
      const std::vector<model::RunnerInput>& inputs) override;
  CopyEngine& copy_engine() override;
  uint64_t TokenKvHash(SlotIndex slot) override;
  // The simulator models attn, attn_sum and key_norm (its signal sources), not token signals:
  // a policy that reads one is refused before the run starts.
  Status TokenSignals(std::span<const SlotIndex>, std::span<const TokenSignalInfo* const>,
                      const TokenSignalScope&, std::vector<float>&) const override {
    return FailedPreconditionError(
        "the simulator models attn, attn_sum and key_norm only, not token signals");
  }
  void ForgetRequest(int64_t) override {}
  model::RunClock* clock() override;

  // A new run of `mode` starts (trace replay follows the mode's records).
  void BeginRun(const std::string& mode) { signals_->BeginRun(mode); }
  const ModelShape& shape() const { return shape_; }
  const SimOptions& options() const { return o_; }
  SignalSource& signals() { return *signals_; }

  // Virtual-time totals of the current run.
  struct Totals {
    int64_t forwards = 0;
    double forward_s = 0;     // Sum of ForwardCost.
    double copy_s = 0;        // Copy-stream busy time.
    double copy_stall_s = 0;  // Host or forward waiting for copies.
  };
  const Totals& totals() const;

 private:
  class Timeline;
  class TagCopyEngine;
  SimRunner(const SimOptions& options, std::unique_ptr<SignalSource> signals);

  SimOptions o_;
  ModelShape shape_;
  std::unique_ptr<SignalSource> signals_;
  int32_t groups_ = 1;  // KV groups (NumKvGroups of the granularity and the config).
  // Per slot: (request + 1) << 44 | group << 28 | position; 0 = never written.
  std::vector<uint64_t> tags_;
  std::unique_ptr<Timeline> timeline_;
  std::unique_ptr<TagCopyEngine> copies_;
  std::vector<int64_t> positions_;  // Scratch, reused across steps.
};

}  // namespace vtoken::sim
