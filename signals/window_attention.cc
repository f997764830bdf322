// Window attention: the attention that the sequence's last queries (the runner's window of
// kQueryWindow = 32, QueryMoments::recent) paid the token. Per query, rotated by RoPE at its
// position: softmax of q.k / sqrt(d) over the live tokens at positions up to the query's; then
// the mean over the window's queries and the row's query heads. SnapKV's observation-window vote
// before its pooling (kvpress's SnapKVPress and ObservedAttentionPress score this way), read from
// the cache when the policy scores rather than from the attention pass, so its views
// (window_attention@layer, @head) give a token's attention per layer or KV head at any
// granularity. At the prefill its mean over the group's rows is the engine's attn with
// obs_window = 32. A query that sees no live token adds nothing; before any query it is 0.
#include <algorithm>
#include <cmath>
#include <vector>

#include "lib/core/token_signal.h"

namespace vtoken {
namespace {

// logits[t * kQueryWindow + j] = scale * q_j . k_t for the n keys: the queries transposed
// (qt[i * kQueryWindow + j]: query j's channel i), so that a key's dot products with every query
// are kQueryWindow lanes of d multiply-adds (no horizontal sums). Built for AVX-512, AVX2 and
// plain x86-64, picked at load time.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void WindowLogits(
    const float* qt, const float* const* keys, int64_t n, int64_t d, float scale, float* logits) {
  for (int64_t t = 0; t < n; ++t) {
    float acc[kQueryWindow] = {};
    const float* k = keys[t];
    for (int64_t i = 0; i < d; ++i) {
      const float ki = k[i];
      const float* row = qt + i * kQueryWindow;
      for (int64_t j = 0; j < kQueryWindow; ++j) acc[j] += row[j] * ki;
    }
    for (int64_t j = 0; j < kQueryWindow; ++j) logits[t * kQueryWindow + j] = acc[j] * scale;
  }
}

void WindowAttention(const TokenSignalRowSet& rows, float* out) {
  const QueryMoments& q = *rows.queries;
  const int64_t d = rows.head_dim, half = d / 2, n = rows.n, w = q.recent;
  std::fill(out, out + n, 0.0f);
  if (w == 0 || n == 0) return;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const float weight = 1.0f / static_cast<float>(q.heads * w);
  std::vector<float> qt(static_cast<size_t>(d * kQueryWindow), 0.0f);  // Rotated, transposed.
  std::vector<float> logits(static_cast<size_t>(n * kQueryWindow));
  std::vector<int64_t> seen(static_cast<size_t>(w));  // Query j sees tokens [0, seen[j]).
  for (int64_t j = 0; j < w; ++j) {
    const int64_t p = q.recent_positions[j];
    seen[j] = std::upper_bound(rows.positions, rows.positions + n, p) - rows.positions;
  }
  for (int64_t h = 0; h < q.heads; ++h) {
    for (int64_t j = 0; j < w; ++j) {  // RoPE as the model applies it (rotate_half, fp32 angles).
      const float* x = q.recent_queries + (h * kQueryWindow + j) * d;
      const auto p = static_cast<float>(q.recent_positions[j]);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = p * q.inv_freq[i], c = std::cos(angle), s = std::sin(angle);
        qt[i * kQueryWindow + j] = x[i] * c - x[i + half] * s;
        qt[(i + half) * kQueryWindow + j] = x[i + half] * c + x[i] * s;
      }
    }
    WindowLogits(qt.data(), rows.keys, n, d, scale, logits.data());
    for (int64_t j = 0; j < w; ++j) {  // Query j's softmax over the tokens it sees.
      float* l = logits.data() + j;    // Token t's at l[t * kQueryWindow].
      const int64_t m = seen[j];
      if (m == 0) continue;
      float top = l[0];
      for (int64_t t = 1; t < m; ++t) top = std::max(top, l[t * kQueryWindow]);
      float sum = 0;
      for (int64_t t = 0; t < m; ++t) {
        sum += l[t * kQueryWindow] = std::exp(l[t * kQueryWindow] - top);
      }
      const float inv = weight / sum;
      for (int64_t t = 0; t < m; ++t) out[t] += l[t * kQueryWindow] * inv;
    }
  }
}

}  // namespace

VTOKEN_REGISTER_SET_TOKEN_SIGNAL(WindowAttention, kKeys, /*queries=*/true, "window_attention",
                                 "attention the sequence's last 32 queries paid the token, "
                                 "averaged over them and the row's query heads (SnapKV's window)");

}  // namespace vtoken
