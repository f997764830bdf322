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
#include <cstdint>
#include <vector>

#include "lib/core/fast_exp.h"
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

// Each query's softmax over the tokens it sees (query j: tokens [0, seen[j]); seen[j] = 0 for an
// absent query), each pass along the kQueryWindow lanes of the logits' layout; adds `weight`
// times the sum over the queries of token t's probability to out[t].
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void WindowSoftmax(
    float* logits, int64_t n, const int64_t* seen, float weight, float* out) {
  float top[kQueryWindow], sum[kQueryWindow] = {}, inv[kQueryWindow];
  for (int64_t j = 0; j < kQueryWindow; ++j) top[j] = logits[j];
  for (int64_t t = 1; t < n; ++t) {
    const float* l = logits + t * kQueryWindow;
    for (int64_t j = 0; j < kQueryWindow; ++j)
      top[j] = t < seen[j] ? std::max(top[j], l[j]) : top[j];
  }
  for (int64_t t = 0; t < n; ++t) {
    float* l = logits + t * kQueryWindow;
    for (int64_t j = 0; j < kQueryWindow; ++j) {
      const bool in = t < seen[j];
      const float e = FastExp(in ? l[j] - top[j] : 0.0f);
      l[j] = in ? e : 0.0f;
      sum[j] += l[j];
    }
  }
  for (int64_t j = 0; j < kQueryWindow; ++j) inv[j] = seen[j] > 0 ? weight / sum[j] : 0.0f;
  for (int64_t t = 0; t < n; ++t) {
    const float* l = logits + t * kQueryWindow;
    float acc = 0;
    for (int64_t j = 0; j < kQueryWindow; ++j) acc += l[j] * inv[j];
    out[t] += acc;
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
  std::vector<int64_t> seen(kQueryWindow, 0);  // Query j sees tokens [0, seen[j]).
  for (int64_t j = 0; j < w; ++j) {
    const int64_t p = q.recent_positions[j];
    seen[j] = std::upper_bound(rows.positions, rows.positions + n, p) - rows.positions;
  }
  // RoPE as the model applies it (rotate_half, fp32 angles), per window query: the same for
  // every head.
  std::vector<float> cos(static_cast<size_t>(w * half)), sin(cos.size());
  for (int64_t j = 0; j < w; ++j) {
    const auto p = static_cast<float>(q.recent_positions[j]);
    for (int64_t i = 0; i < half; ++i) {
      cos[j * half + i] = std::cos(p * q.inv_freq[i]);
      sin[j * half + i] = std::sin(p * q.inv_freq[i]);
    }
  }
  for (int64_t h = 0; h < q.heads; ++h) {
    for (int64_t j = 0; j < w; ++j) {
      const float* x = q.recent_queries + (h * kQueryWindow + j) * d;
      const float* c = cos.data() + j * half;
      const float* s = sin.data() + j * half;
      for (int64_t i = 0; i < half; ++i) {
        qt[i * kQueryWindow + j] = x[i] * c[i] - x[i + half] * s[i];
        qt[(i + half) * kQueryWindow + j] = x[i + half] * c[i] + x[i] * s[i];
      }
    }
    WindowLogits(qt.data(), rows.keys, n, d, scale, logits.data());
    WindowSoftmax(logits.data(), n, seen.data(), weight, out);
  }
}

}  // namespace

VTOKEN_REGISTER_SET_TOKEN_SIGNAL(WindowAttention, kKeys, /*queries=*/true, "window_attention",
                                 "attention the sequence's last 32 queries paid the token, "
                                 "averaged over them and the row's query heads (SnapKV's window)");

}  // namespace vtoken
