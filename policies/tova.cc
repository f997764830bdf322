// TOVA: Oren et al., "Transformers are Multi-State RNNs", 2024 (Token Omission Via Attention).
// Rule: keep the tokens with the highest attention from the newest step; history plays no part.
// Defaults: no parameters.
#include "lib/core/policy.h"

namespace vtoken {
namespace {

class Tova final : public Policy {
 public:
  uint8_t signals() const override { return kAttnSignal; }
  void Score(std::span<const TokenView> tokens, PolicyContext&,
             std::span<float> scores) const override {
    for (size_t i = 0; i < tokens.size(); ++i) scores[i] = tokens[i].attn;
  }
};

}  // namespace

VTOKEN_REGISTER_POLICY(Tova, "tova", "keep the highest attention of the last step");

}  // namespace vtoken
