// Value norm: the L2 norm of the token's value row, as kvpress's ExpectedAttentionPress rescales
// its scores with (use_vnorm) and value-aware policies weigh attention by.
#include <cmath>

#include "lib/core/token_signal.h"

namespace vtoken {
namespace {

float ValueNorm(std::span<const float> /*key*/, std::span<const float> value,
                std::span<const float> /*anchor*/) {
  float sum = 0;
  for (const float x : value) sum += x * x;
  return std::sqrt(sum);
}

}  // namespace

VTOKEN_REGISTER_TOKEN_SIGNAL(ValueNorm, "value_norm", "L2 norm of the token's value row");

}  // namespace vtoken
