#include "lib/model/query_moments.h"

#include <torch/torch.h>

#include <algorithm>
#include <utility>

namespace vtoken::model {

QueryMomentsTable::QueryMomentsTable(int64_t layers, int64_t heads, int64_t kv_heads,
                                     int64_t head_dim, std::vector<float> inv_freq)
    : heads_(heads),
      kv_heads_(kv_heads),
      dim_(head_dim),
      inv_freq_(std::move(inv_freq)),
      count_(static_cast<size_t>(layers), 0),
      mean_(static_cast<size_t>(layers * heads * head_dim), 0.0f),
      cov_(static_cast<size_t>(layers * heads * head_dim * head_dim), 0.0f),
      window_(static_cast<size_t>(layers * heads * kQueryWindow * head_dim), 0.0f),
      window_positions_(static_cast<size_t>(layers * kQueryWindow), 0),
      window_next_(static_cast<size_t>(layers), 0) {}

namespace {

// cov = (cov * na + m2 + delta delta^T * na * nb / n) / n over a d x d matrix (m2 null: zero).
// Built for AVX-512, AVX2 and plain x86-64, picked at load time: a decode step runs it for every
// layer and query head.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void MergeCov(
    float* cov, const float* m2, const float* delta, int64_t d, float na, float nb) {
  const float n = na + nb, shift = na * nb / n, inv = 1.0f / n;
  for (int64_t i = 0; i < d; ++i) {
    float* out = cov + i * d;
    const float* add = m2 == nullptr ? nullptr : m2 + i * d;
    const float di = delta[i] * shift;
    for (int64_t j = 0; j < d; ++j) {
      out[j] = (out[j] * na + (add == nullptr ? 0.0f : add[j]) + di * delta[j]) * inv;
    }
  }
}

}  // namespace

void QueryMomentsTable::Add(int64_t layer, const float* q, int64_t rows, const int64_t* positions) {
  // The window: the last kQueryWindow new rows (earlier ones would be overwritten).
  int64_t r0 = 0;
  while (r0 < rows && positions[r0] < next_position_) ++r0;
  for (int64_t r = std::max(r0, rows - kQueryWindow); r < rows; ++r) {
    const int64_t j = window_next_[layer]++ % kQueryWindow;
    window_positions_[static_cast<size_t>(layer * kQueryWindow + j)] = positions[r];
    for (int64_t h = 0; h < heads_; ++h) {
      std::copy_n(q + (r * heads_ + h) * dim_, dim_,
                  window_.data() + ((layer * heads_ + h) * kQueryWindow + j) * dim_);
    }
  }
  const int64_t first = std::max(next_position_, kQueryMomentsFirstPosition);
  std::vector<int64_t> kept;
  for (int64_t r = 0; r < rows; ++r) {
    if (positions[r] >= first) kept.push_back(r);
  }
  if (kept.empty()) return;
  const auto d = static_cast<size_t>(dim_);
  const int64_t na = count_[layer], nb = static_cast<int64_t>(kept.size());
  const auto fa = static_cast<float>(na), fb = static_cast<float>(nb);
  const float fn = fa + fb;
  // The chunk's rows centred on its mean, per head: [heads][nb][d].
  std::vector<float> centred(static_cast<size_t>(heads_ * nb) * d), delta(d);
  std::vector<float> means(static_cast<size_t>(heads_) * d);
  for (int64_t h = 0; h < heads_; ++h) {
    float* m = means.data() + h * d;
    for (int64_t r : kept) {
      const float* x = q + (r * heads_ + h) * dim_;
      for (size_t c = 0; c < d; ++c) m[c] += x[c];
    }
    for (size_t c = 0; c < d; ++c) m[c] /= fb;
    float* out = centred.data() + static_cast<size_t>(h * nb) * d;
    for (int64_t b = 0; b < nb; ++b) {
      const float* x = q + (kept[b] * heads_ + h) * dim_;
      for (size_t c = 0; c < d; ++c) out[b * d + c] = x[c] - m[c];
    }
  }
  // The chunk's centred sums of outer products, one batched GEMM [heads, d, nb] x [heads, nb, d]
  // (a single query's is zero: a decode step skips it).
  torch::Tensor m2;
  if (nb > 1) {
    const torch::Tensor x = torch::from_blob(centred.data(), {heads_, nb, dim_}, torch::kFloat32);
    m2 = torch::bmm(x.transpose(1, 2), x).contiguous();
  }
  for (int64_t h = 0; h < heads_; ++h) {
    float* mean = mean_.data() + static_cast<size_t>(layer * heads_ + h) * d;
    float* cov = cov_.data() + static_cast<size_t>(layer * heads_ + h) * d * d;
    const float* m = means.data() + h * d;
    for (size_t c = 0; c < d; ++c) delta[c] = m[c] - mean[c];
    MergeCov(cov, m2.defined() ? m2.data_ptr<float>() + h * dim_ * dim_ : nullptr, delta.data(),
             dim_, fa, fb);
    for (size_t c = 0; c < d; ++c) mean[c] += delta[c] * fb / fn;
  }
  count_[layer] = na + nb;
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
                      .next_position = next_position_,
                      .recent = std::min(window_next_[layer], kQueryWindow),
                      .recent_queries = window_.data() + first * kQueryWindow * d,
                      .recent_positions = window_positions_.data() + layer * kQueryWindow};
}

}  // namespace vtoken::model
