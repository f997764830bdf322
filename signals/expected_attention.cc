// Expected attention: the attention that future queries are expected to pay the token, times its
// value's L2 norm (Devoto et al., "Expected Attention", 2025; kvpress's ExpectedAttentionPress
// with its defaults: n_future_positions 512, n_sink 4, use_covariance, use_vnorm). The queries of
// each head are modelled as a Gaussian (the runner's QueryMoments: mean mu and covariance S before
// RoPE), rotated by RoPE averaged over the next 512 positions (R); for a query q ~ N(R mu, R S
// R^T), E[exp(q.k / sqrt(d))] = exp(k.R mu / sqrt(d) + k^T R S R^T k / (2d)). Per query head
// that logit is softmaxed over the live tokens past the 4 sinks, averaged over the row's query
// heads, times |v|; the sinks get the row's maximum. Relative: a set function over the live
// tokens at each eviction, reading the query statistics.
#include <algorithm>
#include <cmath>
#include <vector>

#include "lib/core/token_signal.h"

namespace vtoken {
namespace {

constexpr int64_t kFuturePositions = 512;
// kvpress's n_sink: the runner's statistics leave these positions' queries out too.
constexpr int64_t kSinks = kQueryMomentsFirstPosition;
constexpr int64_t kBlock = 4;  // Keys per pass over the covariance (Logits' four rows).

// logits[t] = k_t.mu * scale + k_t^T cov k_t * quad for the n keys, kBlock at a time (one pass
// over cov per block): the quadratic form is d^2 multiply-adds per key and query head, the
// signal's whole cost. D > 0: head_dim known at compile time (the accumulators then live in
// registers); D == 0: any head_dim. Built for AVX-512, AVX2 and plain x86-64, picked at load time.
template <int64_t D>
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void Logits(
    const float* const* keys, int64_t n, int64_t dim, const float* mu, const float* cov,
    float scale, float quad, float* logits) {
  const int64_t d = D > 0 ? D : dim;
  std::vector<float> heap(D > 0 ? 0 : kBlock * d);
  for (int64_t t = 0; t < n; t += kBlock) {
    const int64_t m = std::min(kBlock, n - t);
    const float* k[kBlock];
    for (int64_t b = 0; b < kBlock; ++b) k[b] = keys[t + std::min(b, m - 1)];
    float fixed[kBlock * (D > 0 ? D : 1)];
    float* y = D > 0 ? fixed : heap.data();
    std::fill_n(y, kBlock * d, 0.0f);
    for (int64_t i = 0; i < d; ++i) {
      const float* row = cov + i * d;
      const float k0 = k[0][i], k1 = k[1][i], k2 = k[2][i], k3 = k[3][i];
      for (int64_t j = 0; j < d; ++j) {
        y[0 * d + j] += k0 * row[j];
        y[1 * d + j] += k1 * row[j];
        y[2 * d + j] += k2 * row[j];
        y[3 * d + j] += k3 * row[j];
      }
    }
    for (int64_t b = 0; b < m; ++b) {
      float mean = 0, form = 0;
      for (int64_t j = 0; j < d; ++j) {
        mean += k[b][j] * mu[j];
        form += k[b][j] * y[b * d + j];
      }
      logits[t + b] = mean * scale + form * quad;
    }
  }
}

void ExpectedAttention(const TokenSignalRowSet& rows, float* out) {
  const QueryMoments& q = *rows.queries;
  const int64_t d = rows.head_dim, half = d / 2, n = rows.n;
  // R, the rotation averaged over positions P..P+F-1, per channel pair: [[c, -s], [s, c]], from
  // sum_k e^{i(P+k)t} = e^{i(P+(F-1)/2)t} sin(Ft/2) / sin(t/2).
  std::vector<float> c(half), s(half);
  for (int64_t i = 0; i < half; ++i) {
    const double t = q.inv_freq[i], f = kFuturePositions, h = std::sin(t / 2);
    const double ratio = std::abs(h) < 1e-12 ? 1.0 : std::sin(f * t / 2) / (h * f);
    const double mid = (static_cast<double>(q.next_position) + (f - 1) / 2) * t;
    c[i] = static_cast<float>(ratio * std::cos(mid));
    s[i] = static_cast<float>(ratio * std::sin(mid));
  }
  auto rotate = [&](const float* x, int64_t stride, float* y, int64_t ystride) {  // y = R x
    for (int64_t i = 0; i < half; ++i) {
      const float a = x[i * stride], b = x[(i + half) * stride];
      y[i * ystride] = c[i] * a - s[i] * b;
      y[(i + half) * ystride] = s[i] * a + c[i] * b;
    }
  };
  std::vector<float> mu(d), cov(d * d), tmp(d * d), logits(q.heads * n);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d)), quad = 0.5f / static_cast<float>(d);
  for (int64_t h = 0; h < q.heads; ++h) {
    rotate(q.mean + h * d, 1, mu.data(), 1);
    const float* cv = q.cov + h * d * d;
    for (int64_t j = 0; j < d; ++j) rotate(cv + j, d, tmp.data() + j, d);  // R S
    for (int64_t i = 0; i < d; ++i)
      rotate(tmp.data() + i * d, 1, cov.data() + i * d, 1);  // R S R^T
    (d == 64 ? Logits<64>
     : d == 128
         ? Logits<128>
         : Logits<0>)(rows.keys, n, d, mu.data(), cov.data(), scale, quad, logits.data() + h * n);
  }
  int64_t first = 0;  // The sinks lead the live tokens (positions increase).
  while (first < n && rows.positions[first] < kSinks) ++first;
  if (first == n) first = 0;  // Only sinks: softmax over them all.
  std::fill(out, out + n, 0.0f);
  for (int64_t h = 0; h < q.heads; ++h) {
    const float* l = logits.data() + h * n;
    const float top = *std::max_element(l + first, l + n);
    float sum = 0;
    for (int64_t t = first; t < n; ++t) sum += std::exp(l[t] - top);
    const float inv = 1.0f / (sum * static_cast<float>(q.heads));
    for (int64_t t = first; t < n; ++t) out[t] += std::exp(l[t] - top) * inv;
  }
  float best = 0;
  for (int64_t t = first; t < n; ++t) {
    out[t] *= std::sqrt(SignalDot(rows.values[t], rows.values[t], d));
    best = std::max(best, out[t]);
  }
  for (int64_t t = 0; t < first; ++t) out[t] = best;
}

}  // namespace

VTOKEN_REGISTER_SET_TOKEN_SIGNAL(ExpectedAttention, kKeysAndValues, /*queries=*/true,
                                 "expected_attention",
                                 "attention expected from future queries (Gaussian fit of the "
                                 "queries, RoPE averaged over 512 positions) times |v| "
                                 "(ExpectedAttention)");

}  // namespace vtoken
