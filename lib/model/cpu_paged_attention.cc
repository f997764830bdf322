#include "lib/model/cpu_paged_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "lib/core/policy.h"
#include "lib/model/cpu_simd.h"

namespace vtoken::model {
namespace {

using simd::Axpy;
using simd::Dot;
using simd::Max;
using simd::Sum;

// Slots are scattered: fetch the rows a few keys ahead so that their cache misses overlap.
constexpr int64_t kPrefetchAhead = 8;
VTOKEN_INLINE void PrefetchRow(const float* row, int64_t floats) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t off = 0; off < floats * 4; off += 64) __builtin_prefetch(p + off);
}

struct Scratch {
  std::vector<float> scores;  // [group, keys]
  std::vector<float> acc;     // [group, head_dim]
};

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void AttendSeqs(
    const CpuAttentionBatch& b, int64_t seq_begin, int64_t seq_end) {
  thread_local Scratch scratch;
  const int64_t hd = b.head_dim, kvh = b.num_kv_heads, group = b.num_heads / b.num_kv_heads;
  const int64_t kv_row = b.slot_stride, q_row = b.num_heads * hd;
  for (int64_t s = seq_begin; s < seq_end; ++s) {
    if (b.skip != nullptr && b.skip[s] != 0) continue;
    const int64_t q0 = b.q_offsets[s], n = b.q_offsets[s + 1] - q0;
    const uint8_t want = b.want_signals != nullptr ? b.want_signals[s] : 0;
    const int64_t first_signal = n - std::clamp<int64_t>(b.num_signal[s], 1, n);
    for (int64_t g = 0; g < kvh; ++g) {
      const int64_t u = s * b.groups_per_seq + (b.head_group != nullptr ? b.head_group[g] : 0);
      const int64_t k0 = b.key_offsets[u], keys = b.key_offsets[u + 1] - k0;
      const int64_t ctx = keys - n;
      const int64_t* slots = b.slots + k0;
      const int64_t* kpos = b.key_positions + k0;
      float* attn_sum = (want & kAttnSignal) && b.attn_sum != nullptr ? b.attn_sum + k0 : nullptr;
      scratch.scores.resize(static_cast<size_t>(group * keys));
      scratch.acc.resize(static_cast<size_t>(group * hd));
      const float* kg = b.k_cache + g * b.kv_head_stride;
      const float* vg = b.v_cache + g * b.kv_head_stride;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t hi = ctx + i + 1;
        int64_t lo = 0;
        if (b.sliding_window > 0) {
          // Keys increase in position: the first one inside the window.
          lo = std::upper_bound(kpos, kpos + hi, kpos[ctx + i] - b.sliding_window) - kpos;
        }
        const int64_t len = hi - lo;
        const float* qi = b.q + (q0 + i) * q_row + g * group * hd;
        float* sc = scratch.scores.data();
        for (int64_t j = lo; j < hi; ++j) {
          if (j + kPrefetchAhead < hi) PrefetchRow(kg + slots[j + kPrefetchAhead] * kv_row, hd);
          const float* kj = kg + slots[j] * kv_row;
          for (int64_t h = 0; h < group; ++h) {
            sc[h * keys + (j - lo)] = b.scale * Dot(qi + h * hd, kj, hd);
          }
        }
        std::fill(scratch.acc.begin(), scratch.acc.end(), 0.0f);
        for (int64_t h = 0; h < group; ++h) {
          float* row = sc + h * keys;
          const float max = Max(row, len);
          for (int64_t j = 0; j < len; ++j) row[j] -= max;
          for (int64_t j = 0; j < len; ++j) row[j] = simd::Exp(row[j]);
          const float inv = 1.0f / Sum(row, len);
          for (int64_t j = 0; j < len; ++j) row[j] *= inv;
        }
        for (int64_t j = lo; j < hi; ++j) {
          if (j + kPrefetchAhead < hi) PrefetchRow(vg + slots[j + kPrefetchAhead] * kv_row, hd);
          const float* vj = vg + slots[j] * kv_row;
          for (int64_t h = 0; h < group; ++h) {
            Axpy(sc[h * keys + (j - lo)], vj, scratch.acc.data() + h * hd, hd);
          }
        }
        float* oi = b.out + (q0 + i) * q_row + g * group * hd;
        std::copy(scratch.acc.begin(), scratch.acc.end(), oi);
        if (attn_sum != nullptr && i >= first_signal) {
          for (int64_t h = 0; h < group; ++h) {
            const float* row = sc + h * keys;
            for (int64_t j = 0; j < len; ++j) attn_sum[lo + j] += row[j];
          }
        }
      }
      if ((want & kKeyNormSignal) && b.norm_sum != nullptr) {
        float* norm_sum = b.norm_sum + k0;
        const float inv_heads = 1.0f / static_cast<float>(b.norm_heads);
        for (int64_t j = 0; j < keys; ++j) {
          const float* kj = kg + slots[j] * kv_row;
          norm_sum[j] += std::sqrt(Dot(kj, kj, hd)) * inv_heads;
        }
      }
    }
  }
}

}  // namespace

void CpuPagedAttention(const CpuAttentionBatch& batch, int64_t seq_begin, int64_t seq_end) {
  AttendSeqs(batch, seq_begin, seq_end);
}

}  // namespace vtoken::model
