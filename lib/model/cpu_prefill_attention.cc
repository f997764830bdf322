#include "lib/model/cpu_prefill_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "lib/core/policy.h"
#include "lib/model/cpu_blas_gemm.h"
#include "lib/model/cpu_isa.h"
#include "lib/model/cpu_simd.h"

namespace vtoken::model {
namespace {

using internal::KeyRange;
using internal::RangeOf;
using internal::WindowStart;
using simd::Exp;
using simd::kLanes;
using simd::Lanes16;
using simd::V16;
using simd::V4;
using simd::V8;

// One sequence's plan and buffers.
struct Plan {
  const CpuAttentionBatch* b = nullptr;
  int64_t s = 0, n = 0, q0 = 0, group = 0, blocks = 0, pairs = 0, max_keys = 0;
  int64_t first_signal = 0;
  bool attn = false, norm = false;
  std::vector<KeyRange> ranges;  // [kv heads]
  std::vector<float> k, v;       // [kv heads][max_keys][head_dim]
  std::vector<float> attn_part;  // [blocks][kv heads][max_keys]
};

// p[j] = exp(p[j] - m) / l on [lo, hi) (m the largest, l the sum), 0 on [0, lo) and [hi, seen);
// returns nothing. The sum in Lanes16's order.
template <typename N>
VTOKEN_INLINE void SoftmaxRow(float* p, int64_t lo, int64_t hi, int64_t seen) {
  using L = Lanes16<N>;
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = lo; j < hi; ++j) m = std::max(m, p[j]);
  for (int64_t j = lo; j < hi; ++j) p[j] = Exp(p[j] - m);
  L acc = L::Zero();
  int64_t j = lo;
  for (; j + kLanes <= hi; j += kLanes) acc.Add(L::Load(p + j));
  float l = acc.Reduce();
  for (; j < hi; ++j) l += p[j];
  const float inv = 1.0f / l;
  for (int64_t t = lo; t < hi; ++t) p[t] *= inv;
  std::fill(p, p + lo, 0.0f);
  std::fill(p + hi, p + seen, 0.0f);
}

// Query block `block` of KV head g: every query head of its group.
template <typename N>
VTOKEN_INLINE void AttendBlockOn(Plan& pl, int64_t g, int64_t block) {
  thread_local std::vector<float> scores;
  const CpuAttentionBatch& b = *pl.b;
  const int64_t hd = b.head_dim, q_row = b.num_heads * hd;
  const KeyRange r = pl.ranges[g];
  const int64_t ctx = r.keys - pl.n;
  const int64_t r0 = block * kPrefillQueryRows;
  const int64_t rows = std::min(kPrefillQueryRows, pl.n - r0), seen = ctx + r0 + rows;
  const int64_t* kpos = b.sliding_window > 0 ? b.key_positions + r.k0 : nullptr;
  const float* kg = pl.k.data() + g * pl.max_keys * hd;
  const float* vg = pl.v.data() + g * pl.max_keys * hd;
  scores.resize(static_cast<size_t>(rows * seen));
  float* part =
      pl.attn ? pl.attn_part.data() + (block * b.num_kv_heads + g) * pl.max_keys : nullptr;
  if (part != nullptr) std::fill(part, part + r.keys, 0.0f);
  for (int64_t h = 0; h < pl.group; ++h) {
    const int64_t qh = g * pl.group + h;
    const float* q = b.q + (pl.q0 + r0) * q_row + qh * hd;
    Sgemm(rows, seen, hd, b.scale, q, q_row, kg, hd, /*b_transposed=*/true, 0.0f, scores.data(),
          seen);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t row = r0 + i;
      float* p = scores.data() + i * seen;
      SoftmaxRow<N>(p, WindowStart(b, kpos, ctx, row), ctx + row + 1, seen);
      if (part != nullptr && row >= pl.first_signal) {
        for (int64_t j = 0; j < seen; ++j) part[j] += p[j];
      }
    }
    Sgemm(rows, hd, seen, 1.0f, scores.data(), seen, vg, hd, /*b_transposed=*/false, 0.0f,
          b.out + (pl.q0 + r0) * q_row + qh * hd, q_row);
  }
}

#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"))) void AttendBlockAvx512(Plan& pl, int64_t g,
                                                                 int64_t block) {
  AttendBlockOn<V16>(pl, g, block);
}
__attribute__((target("arch=x86-64-v3"))) void AttendBlockAvx2(Plan& pl, int64_t g, int64_t block) {
  AttendBlockOn<V8>(pl, g, block);
}
#endif

void AttendBlock(Plan& pl, int64_t g, int64_t block) {
  switch (ActiveCpuIsa()) {
#if defined(__x86_64__)
    case CpuIsa::kAvx512:
      return AttendBlockAvx512(pl, g, block);
    case CpuIsa::kAvx2:
      return AttendBlockAvx2(pl, g, block);
#endif
    default:
      return AttendBlockOn<V4>(pl, g, block);
  }
}

// The L2 norm of a row, in Lanes16's order (CpuPagedAttention's DotRow).
template <typename N>
VTOKEN_INLINE float NormOn(const float* a, int64_t n) {
  using L = Lanes16<N>;
  L acc = L::Zero();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) acc.MulAdd(L::Load(a + i), L::Load(a + i));
  float s = acc.Reduce();
  for (; i < n; ++i) s = L::TailMulAdd(s, a[i], a[i]);
  return std::sqrt(s);
}

#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"))) float NormAvx512(const float* a, int64_t n) {
  return NormOn<V16>(a, n);
}
__attribute__((target("arch=x86-64-v3"))) float NormAvx2(const float* a, int64_t n) {
  return NormOn<V8>(a, n);
}
#endif

float Norm(const float* a, int64_t n) {
  switch (ActiveCpuIsa()) {
#if defined(__x86_64__)
    case CpuIsa::kAvx512:
      return NormAvx512(a, n);
    case CpuIsa::kAvx2:
      return NormAvx2(a, n);
#endif
    default:
      return NormOn<V4>(a, n);
  }
}

Plan& CallerPlan() {
  thread_local Plan plan;
  return plan;
}

}  // namespace

void CpuPrefillAttention(const CpuAttentionBatch& b, int64_t s, CpuPool& pool) {
  Plan& pl = CallerPlan();
  const int64_t kvh = b.num_kv_heads, hd = b.head_dim;
  pl.b = &b;
  pl.s = s;
  pl.q0 = b.q_offsets[s];
  pl.n = b.q_offsets[s + 1] - pl.q0;
  pl.group = b.num_heads / kvh;
  pl.blocks = (pl.n + kPrefillQueryRows - 1) / kPrefillQueryRows;
  pl.pairs = (pl.blocks + 1) / 2;
  pl.first_signal = pl.n - std::clamp<int64_t>(b.num_signal[s], 1, pl.n);
  const uint8_t want = b.want_signals != nullptr ? b.want_signals[s] : 0;
  pl.attn = (want & kAttnSignal) != 0 && b.attn_sum != nullptr;
  pl.norm = (want & kKeyNormSignal) != 0 && b.norm_sum != nullptr;
  pl.ranges.resize(static_cast<size_t>(kvh));
  pl.max_keys = 0;
  for (int64_t g = 0; g < kvh; ++g) {
    pl.ranges[g] = RangeOf(b, s, g);
    pl.max_keys = std::max(pl.max_keys, pl.ranges[g].keys);
  }
  pl.k.resize(static_cast<size_t>(kvh * pl.max_keys * hd));
  pl.v.resize(pl.k.size());
  if (pl.attn) pl.attn_part.resize(static_cast<size_t>(pl.blocks * kvh * pl.max_keys));
  // Gather each KV head's rows; the key norms, KV head by KV head in order for each key (heads
  // of a layer may share one key range, and so one norm_sum entry).
  const float inv_heads = 1.0f / static_cast<float>(b.norm_heads);
  pool.ParallelFor(
      pl.max_keys,
      [&](int64_t begin, int64_t end) {
        for (int64_t g = 0; g < kvh; ++g) {
          const KeyRange r = pl.ranges[g];
          const int64_t* slots = b.slots + r.k0;
          float* kd = pl.k.data() + g * pl.max_keys * hd;
          float* vd = pl.v.data() + g * pl.max_keys * hd;
          for (int64_t j = begin; j < std::min(end, r.keys); ++j) {
            const int64_t at = slots[j] * b.slot_stride + g * b.kv_head_stride;
            CpuLoadKvRow(b.kv_element, b.k_cache, at, hd, kd + j * hd);
            CpuLoadKvRow(b.kv_element, b.v_cache, at, hd, vd + j * hd);
            if (pl.norm) b.norm_sum[r.k0 + j] += Norm(kd + j * hd, hd) * inv_heads;
          }
        }
      },
      64);
  // Units: (KV head, pair p) = query blocks p and blocks - 1 - p.
  pool.ParallelFor(kvh * pl.pairs, [&](int64_t begin, int64_t end) {
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t g = unit / pl.pairs, p = unit % pl.pairs;
      AttendBlock(pl, g, p);
      if (pl.blocks - 1 - p != p) AttendBlock(pl, g, pl.blocks - 1 - p);
    }
  });
  if (!pl.attn) return;
  // The attention signal: each key's partial sums in block order, KV head by KV head in order.
  pool.ParallelFor(
      pl.max_keys,
      [&](int64_t begin, int64_t end) {
        for (int64_t g = 0; g < kvh; ++g) {
          const KeyRange r = pl.ranges[g];
          const int64_t ctx = r.keys - pl.n;
          for (int64_t j = begin; j < std::min(end, r.keys); ++j) {
            float sum = b.attn_sum[r.k0 + j];
            for (int64_t block = 0; block < pl.blocks; ++block) {
              // Block `block` saw keys [0, ctx + its last row + 1) and wrote no further.
              const int64_t seen = ctx + std::min(pl.n, (block + 1) * kPrefillQueryRows);
              if (j < seen) sum += pl.attn_part[(block * kvh + g) * pl.max_keys + j];
            }
            b.attn_sum[r.k0 + j] = sum;
          }
        }
      },
      64);
}

}  // namespace vtoken::model
