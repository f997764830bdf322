// K-norm: Devoto et al., "A Simple and Effective L2 Norm-Based Strategy for KV Cache
// Compression", EMNLP 2024.
// Rule: keep the tokens with the LOWEST key L2 norm, which the paper finds are the ones that
// receive the most attention; needs no attention scores at all.
// Defaults: no parameters.
#include "lib/core/policy.h"

namespace vtoken {
namespace {

class KNorm final : public Policy {
 public:
  uint8_t signals() const override { return kKeyNormSignal; }
  void Score(std::span<const TokenView> tokens, PolicyContext&,
             std::span<float> scores) const override {
    for (size_t i = 0; i < tokens.size(); ++i) scores[i] = -tokens[i].key_norm;
  }
};

}  // namespace

VTOKEN_REGISTER_POLICY(KNorm, "knorm", "keep the lowest key norms");

}  // namespace vtoken
