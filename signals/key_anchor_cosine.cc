// Key-anchor cosine: the cosine similarity of the token's key to the mean of the unit-normalised
// keys of the live tokens of its KV row, KeyDiff's measure (Park et al., "KeyDiff: Key
// Similarity-Based KV Cache Eviction for Long-Context LLM Inference in Resource-Constrained
// Environments", 2025; kvpress's KeyDiffPress: anchor = mean(normalize(keys)), score =
// -cosine(key, anchor)). Relative: the anchor is taken over the live tokens at each eviction.
#include <algorithm>
#include <cmath>

#include "lib/core/token_signal.h"

namespace vtoken {
namespace {

// A norm below 1e-12 counts as 1e-12 (F.normalize's eps order): a zero key or anchor gives 0.
float Norm(const float* x, int64_t n) { return std::max(std::sqrt(SignalDot(x, x, n)), 1e-12f); }

// The direction of the mean unit key, as a unit vector (the cosine ignores the length).
void MeanUnitKey(const float* const* keys, const float* const* /*values*/, int64_t n, int64_t dim,
                 float* anchor) {
  std::fill_n(anchor, dim, 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    const float* k = keys[i];
    const float inv = 1.0f / Norm(k, dim);
    for (int64_t d = 0; d < dim; ++d) anchor[d] += k[d] * inv;
  }
  const float inv = 1.0f / Norm(anchor, dim);
  for (int64_t d = 0; d < dim; ++d) anchor[d] *= inv;
}

float KeyAnchorCosine(std::span<const float> key, std::span<const float> /*value*/,
                      std::span<const float> anchor) {
  const auto dim = static_cast<int64_t>(key.size());
  return SignalDot(key.data(), anchor.data(), dim) / Norm(key.data(), dim);
}

}  // namespace

VTOKEN_REGISTER_RELATIVE_TOKEN_SIGNAL(KeyAnchorCosine, MeanUnitKey, kKeys, "key_anchor_cosine",
                                      "cosine of the token's key to the mean unit key of the live "
                                      "tokens (KeyDiff)");

}  // namespace vtoken
