// A scripted model runner for the engine's tests (engine_test, scheduler_test, prefix_forks_test,
// policy_step_test) and the requests and options they run.
// FakeRunner: a HostKvStore stands in for the KV tensors, every token's
// bytes encode (token id, position), and each forward checks that the context it is given is in
// increasing position order. The next token is a hash of the live (token, position) pairs, so
// outputs depend on what was evicted and on the KV content read, not on where tokens sit.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "lib/core/host_kv_store.h"
#include "lib/engine/engine.h"

namespace vtoken::engine {

class FakeRunner final : public model::ModelRunner {
 public:
  FakeRunner(int64_t num_slots, bool async)
      : store_(1, num_slots, 16),
        engine_(async ? std::unique_ptr<CopyEngine>(new AsyncHostCopyEngine(store_, 50))
                      : std::unique_ptr<CopyEngine>(new SyncHostCopyEngine(store_))) {}

  int64_t vocab_size() const override { return 100; }
  int64_t max_context() const override { return 1 << 20; }
  std::optional<int32_t> bos_token_id() const override { return std::nullopt; }
  const std::vector<int64_t>& eos_token_ids() const override { return eos_; }
  int64_t kv_bytes_per_token() const override { return 16; }
  int64_t num_slots() const override { return store_.num_slots(); }
  CopyEngine& copy_engine() override { return *engine_; }
  uint64_t TokenKvHash(SlotIndex slot) override { return vtoken::TokenKvHash(store_, slot); }
  void ForgetRequest(int64_t) override {}

  StatusOr<std::vector<model::RunnerOutput>> Forward(
      const std::vector<model::RunnerInput>& inputs) override {
    std::vector<model::RunnerOutput> outs;
    for (const model::RunnerInput& in : inputs) {
      for (size_t i = 0; i < in.tokens.size(); ++i) {
        Write(in.write_slots[i], in.tokens[i], in.positions[i]);
      }
      std::vector<int64_t> positions, tokens;
      for (SlotIndex slot : in.context_slots) {
        auto [token, position] = Read(slot);
        if (!positions.empty() && position <= positions.back()) {
          return InternalError("context out of logical order");
        }
        positions.push_back(position);
        tokens.push_back(token);
      }
      if (!positions.empty() && positions.back() >= in.positions.front()) {
        return InternalError("context reaches past the new tokens");
      }
      positions.insert(positions.end(), in.positions.begin(), in.positions.end());
      tokens.insert(tokens.end(), in.tokens.begin(), in.tokens.end());
      model::RunnerOutput out;
      uint64_t h = 0;
      for (size_t k = 0; k < positions.size(); ++k) {
        const int64_t p = positions[k];
        h ^= (static_cast<uint64_t>(p + 1) * 0x9e3779b97f4a7c15ULL) ^
             (static_cast<uint64_t>(tokens[k] + 7) * 0xc2b2ae3d27d4eb4fULL);
        // Heavy hitters at every 7th position; otherwise decaying with position.
        out.attn.push_back(p % 7 == 0 ? 1.0f : 1.0f / static_cast<float>(2 + p % 5));
        out.key_norm.push_back(1.0f + static_cast<float>(p % 3));
      }
      out.next_token = in.sample ? static_cast<int32_t>(h % 100) : -1;
      outs.push_back(std::move(out));
    }
    return outs;
  }

 private:
  void Write(SlotIndex slot, int64_t token, int64_t position) {
    std::span<std::byte> b = store_.Token(0, slot);
    std::memcpy(b.data(), &token, 8);
    std::memcpy(b.data() + 8, &position, 8);
  }
  std::pair<int64_t, int64_t> Read(SlotIndex slot) const {
    std::span<const std::byte> b = store_.Token(0, slot);
    int64_t token, position;
    std::memcpy(&token, b.data(), 8);
    std::memcpy(&position, b.data() + 8, 8);
    return {token, position};
  }

  HostKvStore store_;
  std::unique_ptr<CopyEngine> engine_;
  std::vector<int64_t> eos_;
};

inline std::vector<Request> Requests(int n, int64_t prompt, int64_t max_tokens, uint64_t seed) {
  std::vector<Request> out;
  uint64_t state = seed;
  for (int i = 0; i < n; ++i) {
    Request r;
    r.id = i;
    for (int64_t t = 0; t < prompt + i * 7; ++t) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      r.prompt_tokens.push_back(static_cast<int32_t>((state >> 33) % 100));
    }
    r.max_tokens = max_tokens;
    out.push_back(std::move(r));
  }
  return out;
}

inline EngineOptions Opts(Mode mode, int32_t num_blocks) {
  EngineOptions o;
  o.mode = mode;
  o.pool = {.num_blocks = num_blocks, .block_size = 16, .headroom_blocks = 4};
  o.reclaim.trigger = ReclaimOptions::Trigger::kAlways;
  o.policy = "h2o";
  o.evictor = {.keep_ratio = 0.25, .num_sink = 4, .num_recent = 16};
  o.max_prefill_chunk = 64;
  o.verify = true;
  return o;
}

inline StatusOr<EngineResult> RunWith(const EngineOptions& o, const std::vector<Request>& reqs,
                                      bool async = false) {
  FakeRunner runner(int64_t{o.pool.num_blocks} * o.pool.block_size, async);
  return RunEngine(o, runner, reqs);
}

inline double MeanBlocks(const EngineResult& r) {
  double sum = 0;
  for (const RequestResult& q : r.requests) sum += q.blocks_mean;
  return sum / static_cast<double>(r.requests.size());
}

}  // namespace vtoken::engine
