// Random CpuAttentionBatch problems and a double-precision reference for the CPU attention kernels
// tests (cpu_paged_attention_test, paged_prefill_attention_test): batches of long and short key
// ranges, several query rows, GQA, token- and head-granularity slot layouts, sliding windows,
// skipped sequences and every signal bit.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "lib/core/policy.h"
#include "lib/model/cpu_paged_attention.h"

namespace vtoken::model::testing {

struct SeqSpec {
  int64_t rows = 1;
  std::vector<int64_t> context;  // Per key range (group) of the sequence.
  int64_t num_signal = 1;
  uint8_t want = 0;
  bool skip = false;
};

// A batch's host arrays and the kernel's view of them.
struct Problem {
  int64_t heads = 0, kv_heads = 0, head_dim = 0, groups = 1, window = 0;
  bool per_head = false;
  std::vector<SeqSpec> seqs;
  std::vector<float> q, k, v;
  std::vector<int64_t> q_offsets{0}, key_offsets{0}, slots, positions, num_signal, head_group;
  std::vector<uint8_t> want, skip;
  int64_t num_keys() const { return key_offsets.back(); }

  CpuAttentionBatch Batch(float* out, float* attn, float* norm) const {
    return {.num_seqs = static_cast<int64_t>(seqs.size()),
            .num_heads = heads,
            .num_kv_heads = kv_heads,
            .head_dim = head_dim,
            .scale = 1.0f / std::sqrt(static_cast<float>(head_dim)),
            .sliding_window = window,
            .q = q.data(),
            .k_cache = k.data(),
            .v_cache = v.data(),
            .slot_stride = per_head ? head_dim : kv_heads * head_dim,
            .kv_head_stride = per_head ? 0 : head_dim,
            .out = out,
            .q_offsets = q_offsets.data(),
            .groups_per_seq = groups,
            .head_group = per_head ? head_group.data() : nullptr,
            .key_offsets = key_offsets.data(),
            .slots = slots.data(),
            .key_positions = positions.data(),
            .num_signal = num_signal.data(),
            .want_signals = want.data(),
            .attn_sum = attn,
            .norm_sum = norm,
            .norm_heads = per_head ? 1 : kv_heads,
            .skip = skip.data()};
  }
};

// prefill_rows > 0: every sequence a prefill chunk of 16 to 15 + prefill_rows query rows after up
// to 299 context keys (the fused step's CpuPrefillAttention cases); else mostly decode rows.
inline Problem RandomProblem(std::mt19937_64& rng, int64_t prefill_rows = 0) {
  auto pick = [&](int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); };
  Problem p;
  const int64_t group = std::vector<int64_t>{1, 3, 4}[pick(3)];
  p.kv_heads = 1 + pick(2);
  p.heads = group * p.kv_heads;
  p.head_dim = std::vector<int64_t>{8, 33, 64}[pick(3)];
  p.per_head = pick(2) == 1;
  p.groups = p.per_head ? p.kv_heads : 1;
  p.window = std::vector<int64_t>{0, 0, 5, 130, 300}[pick(5)];
  for (int64_t g = 0; g < p.kv_heads; ++g) p.head_group.push_back(g);
  const int64_t boundaries[] = {kCpuAttentionChunkKeys - 1, kCpuAttentionChunkKeys,
                                2 * kCpuAttentionChunkKeys};
  p.seqs.resize(static_cast<size_t>(1 + pick(4)));
  for (SeqSpec& s : p.seqs) {
    s.rows = prefill_rows > 0 ? 16 + pick(prefill_rows) : pick(3) == 0 ? 2 + pick(14) : 1;
    for (int64_t g = 0; g < p.groups; ++g) {
      // Context plus rows lands on a chunk boundary now and then.
      s.context.push_back(prefill_rows > 0 ? pick(300)
                          : pick(4) == 0   ? std::max<int64_t>(0, boundaries[pick(3)] - s.rows)
                                           : pick(700));
    }
    s.num_signal = 1 + pick(s.rows + 2);
    s.want = static_cast<uint8_t>(pick(4));  // None, attention, norms, both.
    s.skip = pick(6) == 0;
  }
  int64_t rows = 0;
  for (const SeqSpec& s : p.seqs) {
    rows += s.rows;
    p.q_offsets.push_back(rows);
    p.num_signal.push_back(s.num_signal);
    p.want.push_back(s.want);
    p.skip.push_back(s.skip ? 1 : 0);
    for (int64_t g = 0; g < p.groups; ++g) {
      const int64_t keys = s.context[g] + s.rows;
      p.key_offsets.push_back(p.key_offsets.back() + keys);
      int64_t pos = pick(3);
      for (int64_t j = 0; j < keys; ++j) {
        p.positions.push_back(pos);
        pos += j < s.context[g] ? 1 + pick(3) : 1;  // Evictions leave gaps in the context.
      }
    }
  }
  // Distinct slots from a larger pool, in random order.
  std::vector<int64_t> pool(static_cast<size_t>(p.num_keys() * 2 + 5));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  p.slots.assign(pool.begin(), pool.begin() + p.num_keys());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t slot_floats = p.per_head ? p.head_dim : p.kv_heads * p.head_dim;
  p.k.resize(pool.size() * slot_floats);
  p.v.resize(p.k.size());
  p.q.resize(static_cast<size_t>(rows * p.heads * p.head_dim));
  for (float& x : p.k) x = 2.0f * normal(rng);  // Sharp attention, so errors show.
  for (float& x : p.v) x = normal(rng);
  for (float& x : p.q) x = 2.0f * normal(rng);
  return p;
}

struct Result {
  std::vector<float> out, attn, norm;
};

// p's K and V as an fp16 cache (CpuKvElement::kFloat16): k and v the binary16 rounding of each
// value (CpuStoreKvRow), `rounded` p with those values widened back to fp32 (by the compiler's
// _Float16, not the kernels' code): the kernels must give the same bits on both.
struct F16Cache {
  Problem rounded;
  std::vector<uint16_t> k, v;

  CpuAttentionBatch Batch(float* out, float* attn, float* norm) const {
    CpuAttentionBatch b = rounded.Batch(out, attn, norm);
    b.k_cache = k.data();
    b.v_cache = v.data();
    b.kv_element = CpuKvElement::kFloat16;
    return b;
  }
};

inline F16Cache ToF16Cache(const Problem& p) {
  F16Cache h{p, std::vector<uint16_t>(p.k.size()), std::vector<uint16_t>(p.v.size())};
  const auto n = static_cast<int64_t>(p.k.size());
  CpuStoreKvRow(CpuKvElement::kFloat16, p.k.data(), n, h.k.data(), 0);
  CpuStoreKvRow(CpuKvElement::kFloat16, p.v.data(), n, h.v.data(), 0);
  for (size_t i = 0; i < h.k.size(); ++i) {
    h.rounded.k[i] = static_cast<float>(std::bit_cast<_Float16>(h.k[i]));
    h.rounded.v[i] = static_cast<float>(std::bit_cast<_Float16>(h.v[i]));
  }
  return h;
}

// The reference: per sequence, KV head, row and query head, the visible keys' softmax in double.
inline Result Reference(const Problem& p) {
  const int64_t group = p.heads / p.kv_heads, hd = p.head_dim;
  const int64_t slot_floats = p.per_head ? hd : p.kv_heads * hd;
  std::vector<double> out(p.q.size(), 0.0), attn(p.num_keys(), 0.0), norm(p.num_keys(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<float>(hd));
  for (size_t s = 0; s < p.seqs.size(); ++s) {
    const SeqSpec& spec = p.seqs[s];
    if (spec.skip) continue;
    const int64_t n = spec.rows, q0 = p.q_offsets[s];
    for (int64_t g = 0; g < p.kv_heads; ++g) {
      const int64_t u = static_cast<int64_t>(s) * p.groups + (p.per_head ? g : 0);
      const int64_t k0 = p.key_offsets[u], keys = p.key_offsets[u + 1] - k0, ctx = keys - n;
      auto row = [&](const std::vector<float>& cache, int64_t j) {
        return cache.data() + p.slots[k0 + j] * slot_floats + (p.per_head ? 0 : g * hd);
      };
      for (int64_t i = 0; i < n; ++i) {
        const int64_t hi = ctx + i + 1, me = p.positions[k0 + ctx + i];
        for (int64_t h = 0; h < group; ++h) {
          const float* qv = p.q.data() + ((q0 + i) * p.heads + g * group + h) * hd;
          std::vector<double> score(static_cast<size_t>(hi), -INFINITY);
          double top = -INFINITY;
          for (int64_t j = 0; j < hi; ++j) {
            if (p.window > 0 && me - p.positions[k0 + j] >= p.window) continue;
            double dot = 0;
            for (int64_t d = 0; d < hd; ++d) dot += static_cast<double>(qv[d]) * row(p.k, j)[d];
            score[j] = dot * scale;
            top = std::max(top, score[j]);
          }
          double total = 0;
          for (double& x : score) total += (x = std::exp(x - top));
          for (int64_t j = 0; j < hi; ++j) {
            const double prob = score[j] / total;
            for (int64_t d = 0; d < hd; ++d) {
              out[((q0 + i) * p.heads + g * group + h) * hd + d] += prob * row(p.v, j)[d];
            }
            const bool signal_row = i >= n - std::clamp<int64_t>(spec.num_signal, 1, n);
            if ((spec.want & kAttnSignal) && signal_row) attn[k0 + j] += prob;
          }
        }
      }
      if (spec.want & kKeyNormSignal) {
        for (int64_t j = 0; j < keys; ++j) {
          double sq = 0;
          for (int64_t d = 0; d < hd; ++d)
            sq += static_cast<double>(row(p.k, j)[d]) * row(p.k, j)[d];
          norm[k0 + j] += std::sqrt(sq) / (p.per_head ? 1 : p.kv_heads);
        }
      }
    }
  }
  return {std::vector<float>(out.begin(), out.end()), std::vector<float>(attn.begin(), attn.end()),
          std::vector<float>(norm.begin(), norm.end())};
}

}  // namespace vtoken::model::testing
