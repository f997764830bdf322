// H2O: Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large
// Language Models", NeurIPS 2023.
// Rule: keep the heavy hitters (the largest attention accumulated since a token was written,
// attn_sum) plus a window of the most recent tokens.
// Defaults: recent_ratio = 0.5, the paper's equal split of the cache between heavy hitters and
// recent tokens.
#include "lib/core/policy.h"

namespace vtoken {
namespace {

class H2O final : public Policy {
 public:
  explicit H2O(const PolicyParams& p) : recent_ratio_(p.Double("recent_ratio")) {}

  uint8_t signals() const override { return kAttnSumSignal; }
  void Score(std::span<const TokenView> tokens, PolicyContext& ctx,
             std::span<float> scores) const override {
    const auto recent = static_cast<size_t>(recent_ratio_ * static_cast<double>(ctx.budget));
    for (size_t i = 0; i < tokens.size(); ++i) {
      scores[i] = i + recent >= tokens.size() ? kKeepScore : tokens[i].attn_sum;
    }
  }

 private:
  double recent_ratio_;
};

}  // namespace

VTOKEN_REGISTER_POLICY(H2O, "h2o", "keep the highest accumulated attention plus a recent window",
                       DoubleParam("recent_ratio", 0.5,
                                   "fraction of the budget kept for the most recent tokens",
                                   /*min=*/0, /*max=*/1));

}  // namespace vtoken
