#include "lib/model/paged_torch_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace vtoken::model::internal {

GatherMask GatherAndMask(const BatchView& b, int64_t u, int64_t sliding_window,
                         const torch::Tensor& key_slots, const torch::Tensor& key_positions) {
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(key_slots.device());
  const int64_t s = u / b.num_groups;
  const int64_t k0 = b.key_offsets[u], keys = b.key_offsets[u + 1] - k0;
  const int64_t n = b.q_offsets[s + 1] - b.q_offsets[s], ctx = keys - n;
  torch::Tensor gather = key_slots.narrow(0, k0, keys);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  torch::Tensor mask;
  if (n > 1) mask = torch::full({n, keys}, neg_inf, f32).triu(ctx + 1);
  if (sliding_window > 0) {
    if (!mask.defined()) mask = torch::zeros({n, keys}, f32);
    auto kp = key_positions.narrow(0, k0, keys);
    auto qp = kp.narrow(0, ctx, n).unsqueeze(1);
    mask = mask.masked_fill((qp - kp.unsqueeze(0)) >= sliding_window, neg_inf);
  }
  return {gather, mask};
}

torch::Tensor AttendTorch(const torch::Tensor& q, const torch::Tensor& k_layer,
                          const torch::Tensor& v_layer, const torch::Tensor& gather,
                          const torch::Tensor& mask, int64_t kv_heads, torch::Dtype dtype,
                          int64_t num_signal, SignalTensors* signals) {
  const int64_t n = q.size(0), heads = q.size(1), hd = q.size(2), group = heads / kv_heads;
  const int64_t keys = gather.size(0), ctx = keys - n;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  auto ks = k_layer.index_select(0, gather).to(dtype);  // [S, KVH, hd]
  auto vs = v_layer.index_select(0, gather).to(dtype);
  const auto kt = ks.permute({1, 2, 0});  // [KVH, hd, S]
  const auto vt = vs.permute({1, 0, 2});  // [KVH, S, hd]
  // [n, H, hd] -> [KVH, G, n, hd]: query head h reads KV head h / G (HF repeat_kv).
  const auto q4 = q.view({n, kv_heads, group, hd}).permute({1, 2, 0, 3});
  auto out = torch::empty({n, heads * hd}, q.options().dtype(dtype));
  // Query rows in blocks of kAttendQueryRows. Row i sees no key past ctx + i, so a block attends
  // over the keys up to its last row's only: a causal prefill computes about half the scores,
  // and a block's scores stay in the cache (a 2,048-token SmolLM2 prefill in one block wrote
  // 151 MB of scores per layer, then as many for the mask's sum and the softmax).
  for (int64_t r0 = 0; r0 < n; r0 += kAttendQueryRows) {
    const int64_t rows = std::min(kAttendQueryRows, n - r0), seen = ctx + r0 + rows;
    auto qb = q4.narrow(2, r0, rows).reshape({kv_heads, group * rows, hd});
    auto scores = torch::bmm(qb, kt.narrow(2, 0, seen)) * scale;  // [KVH, G*rows, seen]
    scores = scores.view({kv_heads, group, rows, seen});
    if (mask.defined()) scores = scores + mask.narrow(0, r0, rows).narrow(1, 0, seen);
    auto probs = torch::softmax(scores, -1, torch::kFloat32);  // [KVH, G, rows, seen]
    auto block = torch::bmm(probs.to(dtype).view({kv_heads, group * rows, seen}),
                            vt.narrow(1, 0, seen));  // [KVH, G*rows, hd]
    out.narrow(0, r0, rows)
        .copy_(block.view({kv_heads, group, rows, hd})
                   .permute({2, 0, 1, 3})
                   .reshape({rows, heads * hd}));
    // The signal rows are the last num_signal queries.
    const int64_t lo = std::max(n - num_signal, r0), hi = r0 + rows;
    if (signals != nullptr && lo < hi) {
      signals->attn.narrow(0, 0, seen) += probs.narrow(2, lo - r0, hi - lo).sum({0, 1, 2});
    }
  }
  if (signals != nullptr) signals->norm += ks.to(torch::kFloat32).norm(2, -1).mean(-1);
  return out;
}

std::vector<std::unique_ptr<SignalTensors>> SignalAccumulators(const std::vector<int64_t>& seqs,
                                                               const BatchView& b,
                                                               const uint8_t* want,
                                                               const torch::Tensor& sums,
                                                               int64_t num_seqs) {
  std::vector<std::unique_ptr<SignalTensors>> acc(static_cast<size_t>(num_seqs * b.num_groups));
  if (!sums.defined()) return acc;
  const torch::Tensor attn = sums.select(0, 0), norm = sums.select(0, 1);
  for (int64_t s : seqs) {
    if (want[s] == 0) continue;
    for (int64_t u = s * b.num_groups; u < (s + 1) * b.num_groups; ++u) {
      const int64_t k0 = b.key_offsets[u], keys = b.key_offsets[u + 1] - k0;
      acc[u] = std::make_unique<SignalTensors>(
          SignalTensors{attn.narrow(0, k0, keys), norm.narrow(0, k0, keys)});
    }
  }
  return acc;
}

torch::Tensor AttendSeqLayer(const torch::Tensor& q, KvTensors& kv, int64_t layer, int64_t s,
                             int64_t num_groups, const std::vector<GatherMask>& gather_mask,
                             const std::vector<std::unique_ptr<SignalTensors>>& signals,
                             torch::Dtype dtype, int64_t num_signal) {
  const Granularity gran = kv.granularity();
  const int64_t kv_heads = kv.options().num_kv_heads;
  if (gran != Granularity::kHead) {
    const int64_t u = s * num_groups + KvGroupOf(gran, layer, 0, kv_heads);
    return AttendTorch(q, kv.k(layer), kv.v(layer), gather_mask[u].first, gather_mask[u].second,
                       kv_heads, dtype, num_signal, signals[u].get());
  }
  const int64_t per_kv_head = q.size(1) / kv_heads;
  std::vector<torch::Tensor> parts;
  parts.reserve(kv_heads);
  for (int64_t h = 0; h < kv_heads; ++h) {
    const int64_t u = s * num_groups + KvGroupOf(gran, layer, h, kv_heads);
    parts.push_back(AttendTorch(q.narrow(1, h * per_kv_head, per_kv_head), kv.k(layer), kv.v(layer),
                                gather_mask[u].first, gather_mask[u].second, 1, dtype, num_signal,
                                signals[u].get()));
  }
  return torch::cat(parts, 1);
}

}  // namespace vtoken::model::internal
