#include "lib/model/query_moments.h"

#include <algorithm>
#include <utility>

namespace vtoken::model {

QueryMomentsTable::QueryMomentsTable(int64_t layers, int64_t heads, int64_t kv_heads,
                                     int64_t head_dim, std::vector<float> inv_freq)
    : layers_(layers),
      heads_(heads),
      kv_heads_(kv_heads),
      dim_(head_dim),
      inv_freq_(std::move(inv_freq)),
      count_(static_cast<size_t>(layers), 0),
      mean_(static_cast<size_t>(layers * heads * head_dim), 0.0f),
      cov_(static_cast<size_t>(layers * heads * head_dim * head_dim), 0.0f) {}

void QueryMomentsTable::Add(int64_t layer, const float* q, int64_t rows, const int64_t* positions) {
  const int64_t first = std::max(next_position_, kQueryMomentsFirstPosition);
  std::vector<int64_t> kept;
  for (int64_t r = 0; r < rows; ++r) {
    if (positions[r] >= first) kept.push_back(r);
  }
  if (kept.empty()) return;
  const auto d = static_cast<size_t>(dim_);
  const int64_t na = count_[layer], nb = static_cast<int64_t>(kept.size()), n = na + nb;
  const float fa = static_cast<float>(na), fb = static_cast<float>(nb), fn = static_cast<float>(n);
  std::vector<float> chunk_mean(d), centred(d), delta(d), m2(d * d);
  for (int64_t h = 0; h < heads_; ++h) {
    float* mean = mean_.data() + static_cast<size_t>(layer * heads_ + h) * d;
    float* cov = cov_.data() + static_cast<size_t>(layer * heads_ + h) * d * d;
    auto row = [&](int64_t r) { return q + (r * heads_ + h) * dim_; };
    std::fill(chunk_mean.begin(), chunk_mean.end(), 0.0f);
    for (int64_t r : kept) {
      const float* x = row(r);
      for (size_t c = 0; c < d; ++c) chunk_mean[c] += x[c];
    }
    for (size_t c = 0; c < d; ++c) chunk_mean[c] /= fb;
    // The chunk's centred sum of outer products, then the merge:
    //   M2 = M2a + M2b + delta delta^T * na * nb / n, mean = mean_a + delta * nb / n,
    // with the stored covariance M2a / na.
    std::fill(m2.begin(), m2.end(), 0.0f);
    for (int64_t r : kept) {
      const float* x = row(r);
      for (size_t c = 0; c < d; ++c) centred[c] = x[c] - chunk_mean[c];
      for (size_t i = 0; i < d; ++i) {
        const float ci = centred[i];
        float* out = m2.data() + i * d;
        for (size_t j = 0; j < d; ++j) out[j] += ci * centred[j];
      }
    }
    for (size_t c = 0; c < d; ++c) delta[c] = chunk_mean[c] - mean[c];
    const float shift = fa * fb / fn;
    for (size_t i = 0; i < d; ++i) {
      for (size_t j = 0; j < d; ++j) {
        const size_t at = i * d + j;
        cov[at] = (cov[at] * fa + m2[at] + delta[i] * delta[j] * shift) / fn;
      }
    }
    for (size_t c = 0; c < d; ++c) mean[c] += delta[c] * fb / fn;
  }
  count_[layer] = n;
}

void QueryMomentsTable::Advance(int64_t end) { next_position_ = std::max(next_position_, end); }

QueryMoments QueryMomentsTable::Of(int64_t layer, int64_t kv_head) const {
  const int64_t group = heads_ / kv_heads_;
  const auto first = static_cast<size_t>(layer * heads_ + kv_head * group);
  const auto d = static_cast<size_t>(dim_);
  return QueryMoments{.heads = group,
                      .count = count_[layer],
                      .mean = mean_.data() + first * d,
                      .cov = cov_.data() + first * d * d,
                      .inv_freq = inv_freq_.data(),
                      .next_position = next_position_};
}

}  // namespace vtoken::model
