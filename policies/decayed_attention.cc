// Decayed attention: the walk-through example of docs/WRITING_A_POLICY.md.
// Rule: keep the highest exponentially decayed attention. Each step a token's score becomes
// s = decay * s + attn: H2O's accumulated attention (decay = 1) that forgets old attention with
// a half-life of ln(0.5) / ln(decay) steps, so a token that mattered long ago but not lately
// can leave.
// Defaults: decay = 0.9 (a half-life of about 6.6 steps).
// State: one float per token, the decayed sum.
#include "lib/core/policy.h"

namespace vtoken {
namespace {

class DecayedAttention final : public Policy {
 public:
  explicit DecayedAttention(const PolicyParams& p)
      : decay_(static_cast<float>(p.Double("decay"))) {}

  uint8_t signals() const override { return kAttnSignal; }
  int32_t state_size() const override { return 1; }

  void Observe(std::span<const TokenView> tokens, PolicyContext&) const override {
    for (const TokenView& t : tokens) t.state[0] = decay_ * t.state[0] + t.attn;
  }

  void Score(std::span<const TokenView> tokens, PolicyContext&,
             std::span<float> scores) const override {
    for (size_t i = 0; i < tokens.size(); ++i) scores[i] = tokens[i].state[0];
  }

 private:
  float decay_;
};

}  // namespace

VTOKEN_REGISTER_POLICY(DecayedAttention, "decayed_attention",
                       "keep the highest exponentially decayed attention",
                       DoubleParam("decay", 0.9, "per-step decay of the accumulated attention",
                                   /*min=*/0, /*max=*/1));

}  // namespace vtoken
