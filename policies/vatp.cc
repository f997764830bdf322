// VATP: Guo et al., "Attention Score is not All You Need for Token Importance Indicator in KV
// Cache Reduction: Value Also Matters", EMNLP 2024.
// Rule: H2O with value-aware scores: keep the tokens with the largest accumulated attention
// (attn_sum) times the L1 norm of their value (the token signal value_l1_norm), plus a window of
// the most recent tokens.
// Defaults: recent_ratio = 0.5, H2O's split, which the paper builds on.
#include "lib/core/policy.h"

namespace vtoken {
namespace {

class Vatp final : public Policy {
 public:
  explicit Vatp(const PolicyParams& p) : recent_ratio_(p.Double("recent_ratio")) {}

  uint8_t signals() const override { return kAttnSumSignal; }
  std::vector<std::string> token_signals() const override { return {"value_l1_norm"}; }
  void Score(std::span<const TokenView> tokens, PolicyContext& ctx,
             std::span<float> scores) const override {
    const auto recent = static_cast<size_t>(recent_ratio_ * static_cast<double>(ctx.budget));
    for (size_t i = 0; i < tokens.size(); ++i) {
      scores[i] = i + recent >= tokens.size() ? kKeepScore
                                              : tokens[i].attn_sum * tokens[i].token_signals[0];
    }
  }

 private:
  double recent_ratio_;
};

}  // namespace

VTOKEN_REGISTER_POLICY(Vatp, "vatp",
                       "keep the highest accumulated attention times value L1 norm plus a recent "
                       "window",
                       DoubleParam("recent_ratio", 0.5,
                                   "fraction of the budget kept for the most recent tokens",
                                   /*min=*/0, /*max=*/1));

}  // namespace vtoken
