// Value L1 norm: the sum of the absolute values of the token's value row, the value term of VATP
// (Guo et al., "Attention Score is not All You Need for Token Importance Indicator in KV Cache
// Reduction: Value Also Matters", EMNLP 2024).
#include <cmath>

#include "lib/core/token_signal.h"

namespace vtoken {
namespace {

float ValueL1Norm(std::span<const float> /*key*/, std::span<const float> value,
                  std::span<const float> /*anchor*/) {
  float sum = 0;
  for (const float x : value) sum += std::abs(x);
  return sum;
}

}  // namespace

VTOKEN_REGISTER_TOKEN_SIGNAL(ValueL1Norm, "value_l1_norm", "L1 norm of the token's value row");

}  // namespace vtoken
