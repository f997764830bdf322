// Scissorhands: Liu et al., "Scissorhands: Exploiting the Persistence of Importance Hypothesis
// for LLM KV Cache Compression at Test Time", NeurIPS 2023.
// Rule: keep the tokens whose importance persists: over the last history_window steps, count
// the steps in which a token's attention was at least the average 1 / num_live; keep the
// highest counts and always the recent_window newest tokens.
// Defaults: history_window = 32 steps, recent_window = 10 tokens (the paper leaves both as
// tuned hyperparameters). State: one 0/1 hit per step of the window, a ring buffer.
#include "lib/core/policy.h"

namespace vtoken {
namespace {

class Scissorhands final : public Policy {
 public:
  explicit Scissorhands(const PolicyParams& p)
      : window_(p.Int("history_window")), recent_(static_cast<size_t>(p.Int("recent_window"))) {}

  uint8_t signals() const override { return kAttnSignal; }
  int32_t state_size() const override { return static_cast<int32_t>(window_); }

  void Observe(std::span<const TokenView> tokens, PolicyContext& ctx) const override {
    const float average = 1.0f / static_cast<float>(tokens.size());
    for (const TokenView& t : tokens) t.state[ctx.step % window_] = t.attn >= average ? 1 : 0;
  }

  void Score(std::span<const TokenView> tokens, PolicyContext&,
             std::span<float> scores) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      float hits = 0;
      for (float hit : tokens[i].state) hits += hit;
      scores[i] = i + recent_ >= tokens.size() ? kKeepScore : hits;
    }
  }

 private:
  int64_t window_;
  size_t recent_;
};

}  // namespace

VTOKEN_REGISTER_POLICY(
    Scissorhands, "scissorhands",
    "keep tokens most often above-average in attention over a history window, plus recent ones",
    IntParam("history_window", 32, "steps over which above-average attention is counted",
             /*min=*/1, /*max=*/1024),
    IntParam("recent_window", 10, "newest tokens always kept", /*min=*/0));

}  // namespace vtoken
