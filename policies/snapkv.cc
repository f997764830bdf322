// SnapKV: Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation", 2024.
// Rule: let the queries of an observation window vote with their attention, smooth the votes
// with a 1-D pool over neighbouring live tokens (so a kept token keeps its context), keep the
// highest; the observation window's own tokens are always kept. Here the window is the last
// `window` steps (the prefill step's attn already spans the last obs_window prompt queries).
// Defaults: window = 32, kernel = 5, pooling = max (avg: mean over the kernel, zero-padded).
// State: the attention of each of the last `window` steps, a ring buffer.
#include <algorithm>

#include "lib/core/policy.h"

namespace vtoken {
namespace {

class SnapKv final : public Policy {
 public:
  explicit SnapKv(const PolicyParams& p)
      : window_(p.Int("window")),
        radius_(p.Int("kernel") / 2),
        max_pool_(p.String("pooling") == "max") {}

  uint8_t signals() const override { return kAttnSignal; }
  int32_t state_size() const override { return static_cast<int32_t>(window_); }

  void Observe(std::span<const TokenView> tokens, PolicyContext& ctx) const override {
    for (const TokenView& t : tokens) t.state[ctx.step % window_] = t.attn;
  }

  void Score(std::span<const TokenView> tokens, PolicyContext&,
             std::span<float> scores) const override {
    const auto n = static_cast<int64_t>(tokens.size());
    std::vector<float> votes(tokens.size(), 0);
    for (int64_t i = 0; i < n; ++i) {
      for (float a : tokens[i].state) votes[i] += a;
    }
    for (int64_t i = 0; i < n; ++i) {
      float pooled = 0;
      for (int64_t j = std::max<int64_t>(0, i - radius_); j <= std::min(n - 1, i + radius_); ++j) {
        pooled = max_pool_ ? std::max(pooled, votes[j]) : pooled + votes[j];
      }
      scores[i] = i + window_ >= n ? kKeepScore : max_pool_ ? pooled : pooled / (2 * radius_ + 1);
    }
  }

 private:
  int64_t window_;
  int64_t radius_;
  bool max_pool_;
};

}  // namespace

VTOKEN_REGISTER_POLICY(
    SnapKv, "snapkv", "keep the highest pooled observation-window attention, and the window",
    IntParam("window", 32, "observation window in steps", /*min=*/1, /*max=*/1024),
    IntParam("kernel", 5, "pooling kernel (odd; even acts as kernel + 1)", /*min=*/1, /*max=*/63),
    StringParam("pooling", "max", "pooling of the votes: max or avg", {"max", "avg"}));

}  // namespace vtoken
