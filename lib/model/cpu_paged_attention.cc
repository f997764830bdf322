#include "lib/model/cpu_paged_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "lib/core/policy.h"
#include "lib/model/cpu_isa.h"
#include "lib/model/cpu_pool.h"
#include "lib/model/cpu_simd.h"

namespace vtoken::model {
namespace {

using internal::KeyRange;
using internal::RangeOf;
using internal::WindowStart;
using simd::Exp;
using simd::kLanes;
using simd::Lanes16;
using simd::Max;
using simd::V16;
using simd::V4;
using simd::V8;

// Slots are scattered: fetch the rows a few keys ahead so that their cache misses overlap.
constexpr int64_t kPrefetchAhead = 8;
VTOKEN_INLINE void PrefetchRow(const float* row, int64_t floats) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t off = 0; off < floats * 4; off += 64) __builtin_prefetch(p + off);
}

// a . b: 16 lanes (in native vectors N, cpu_simd.h's Lanes16), Reduce16's tree, then the tail.
template <typename N>
VTOKEN_INLINE float DotRow(const float* a, const float* b, int64_t n) {
  using L = Lanes16<N>;
  L acc = L::Zero();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) acc.MulAdd(L::Load(a + i), L::Load(b + i));
  float s = acc.Reduce();
  for (; i < n; ++i) s = L::TailMulAdd(s, a[i], b[i]);
  return s;
}

// The sum of a[0..n) in DotRow's order (not `omp simd`'s, which follows the vector width), so
// that AVX2 and AVX-512 give the same bits.
template <typename N>
VTOKEN_INLINE float SumRow(const float* a, int64_t n) {
  using L = Lanes16<N>;
  L acc = L::Zero();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) acc.Add(L::Load(a + i));
  float s = acc.Reduce();
  for (; i < n; ++i) s += a[i];
  return s;
}

// y += p[0] x[0] + ... + p[K-1] x[K-1], each element summed in that order: y is loaded and
// stored once per K rows instead of once per row.
template <typename N, int K>
VTOKEN_INLINE void AxpyRows(const float* p, const float* const* x, float* y, int64_t n) {
  using L = Lanes16<N>;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    L acc = L::Load(y + i);
    for (int r = 0; r < K; ++r) acc.MulAdd(p[r], L::Load(x[r] + i));
    acc.Store(y + i);
  }
  for (; i < n; ++i) {
    float acc = y[i];
    for (int r = 0; r < K; ++r) acc = L::TailMulAdd(acc, p[r], x[r][i]);
    y[i] = acc;
  }
}

// Where one (sequence, KV head) pair's chunk results and signal inputs live in the workspace.
struct HeadPlan {
  int64_t first_unit = 0, chunks = 0;  // Its units: [first_unit, first_unit + chunks).
  int64_t partials = 0;                // Floats: [chunks][rows][group][2 + head_dim].
  int64_t scores = -1;                 // Floats: [signal rows][group][keys], or -1.
  int64_t norms = -1;                  // Floats: [keys], or -1.
};

struct Workspace {
  int64_t seq_begin = 0, max_chunks = 0;
  std::vector<HeadPlan> heads;     // [(seq - seq_begin) * num_kv_heads + kv head]
  std::vector<int64_t> unit_head;  // Unit -> its index in `heads`.
  std::vector<float> partials, scores, norms;
};

VTOKEN_INLINE int64_t SignalRows(const CpuAttentionBatch& b, int64_t s, int64_t n) {
  return std::clamp<int64_t>(b.num_signal[s], 1, n);
}

void BuildPlan(const CpuAttentionBatch& b, int64_t seq_begin, int64_t seq_end, Workspace& ws) {
  const int64_t kvh = b.num_kv_heads, group = b.num_heads / kvh, hd = b.head_dim;
  ws.seq_begin = seq_begin;
  ws.max_chunks = 0;
  ws.heads.assign(static_cast<size_t>((seq_end - seq_begin) * kvh), HeadPlan{});
  ws.unit_head.clear();
  int64_t partials = 0, scores = 0, norms = 0;
  for (int64_t s = seq_begin; s < seq_end; ++s) {
    if (b.skip != nullptr && b.skip[s] != 0) continue;
    const int64_t n = b.q_offsets[s + 1] - b.q_offsets[s];
    const uint8_t want = b.want_signals != nullptr ? b.want_signals[s] : 0;
    for (int64_t g = 0; g < kvh; ++g) {
      const KeyRange r = RangeOf(b, s, g);
      const int64_t index = (s - seq_begin) * kvh + g;
      HeadPlan& hp = ws.heads[index];
      hp.first_unit = static_cast<int64_t>(ws.unit_head.size());
      hp.chunks = (r.keys + kCpuAttentionChunkKeys - 1) / kCpuAttentionChunkKeys;
      ws.unit_head.insert(ws.unit_head.end(), hp.chunks, index);
      ws.max_chunks = std::max(ws.max_chunks, hp.chunks);
      hp.partials = partials;
      partials += hp.chunks * n * group * (2 + hd);
      if ((want & kAttnSignal) && b.attn_sum != nullptr) {
        hp.scores = scores;
        scores += SignalRows(b, s, n) * group * r.keys;
      }
      if ((want & kKeyNormSignal) && b.norm_sum != nullptr) {
        hp.norms = norms;
        norms += r.keys;
      }
    }
  }
  ws.partials.resize(static_cast<size_t>(partials));
  ws.scores.resize(static_cast<size_t>(scores));
  ws.norms.resize(static_cast<size_t>(norms));
}

// One unit: keys [c * C, (c + 1) * C) of one (sequence, KV head) range, for each query row and
// each query head of the group: m = the largest score, l = sum exp(score - m), acc = sum exp(score
// - m) v; and, for the signal rows, the exp(score - m) values themselves; and the keys' norms.
// On native vectors N (cpu_isa.h): AttendChunk below picks them.
template <typename N>
VTOKEN_INLINE void AttendChunkOn(const CpuAttentionBatch& b, Workspace& ws, int64_t unit) {
  thread_local std::vector<float> scratch;  // [group][C]
  const int64_t kvh = b.num_kv_heads, group = b.num_heads / kvh, hd = b.head_dim;
  const int64_t kv_row = b.slot_stride, q_row = b.num_heads * hd, part_row = 2 + hd;
  constexpr int64_t C = kCpuAttentionChunkKeys;
  const int64_t index = ws.unit_head[unit];
  const HeadPlan& hp = ws.heads[index];
  const int64_t s = ws.seq_begin + index / kvh, g = index % kvh, c = unit - hp.first_unit;
  const KeyRange r = RangeOf(b, s, g);
  const int64_t q0 = b.q_offsets[s], n = b.q_offsets[s + 1] - q0, ctx = r.keys - n;
  const int64_t first_signal = n - SignalRows(b, s, n);
  const int64_t a = c * C, e = std::min(a + C, r.keys);
  const int64_t* slots = b.slots + r.k0;
  const int64_t* kpos = b.sliding_window > 0 ? b.key_positions + r.k0 : nullptr;
  const float* kg = b.k_cache + g * b.kv_head_stride;
  const float* vg = b.v_cache + g * b.kv_head_stride;
  scratch.resize(static_cast<size_t>(group * C));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t ja = std::max(a, WindowStart(b, kpos, ctx, i)), jb = std::min(e, ctx + i + 1);
    float* part = ws.partials.data() + hp.partials + (c * n + i) * group * part_row;
    if (ja >= jb) {  // The row sees no key of this chunk.
      for (int64_t h = 0; h < group; ++h) {
        float* ph = part + h * part_row;
        ph[0] = -std::numeric_limits<float>::infinity();
        std::fill(ph + 1, ph + part_row, 0.0f);
      }
      continue;
    }
    const int64_t len = jb - ja;
    const float* qi = b.q + (q0 + i) * q_row + g * group * hd;
    float* sc = scratch.data();
    for (int64_t j = ja; j < jb; ++j) {
      if (j + kPrefetchAhead < jb) PrefetchRow(kg + slots[j + kPrefetchAhead] * kv_row, hd);
      const float* kj = kg + slots[j] * kv_row;
      for (int64_t h = 0; h < group; ++h)
        sc[h * C + (j - ja)] = b.scale * DotRow<N>(qi + h * hd, kj, hd);
    }
    for (int64_t h = 0; h < group; ++h) {
      float* row = sc + h * C;
      const float m = Max(row, len);
      for (int64_t j = 0; j < len; ++j) row[j] = Exp(row[j] - m);
      float* ph = part + h * part_row;
      ph[0] = m;
      ph[1] = SumRow<N>(row, len);
      std::fill(ph + 2, ph + part_row, 0.0f);
    }
    int64_t j = ja;
    for (; j + 4 <= jb; j += 4) {
      for (int64_t t = j + kPrefetchAhead; t < std::min(j + kPrefetchAhead + 4, jb); ++t) {
        PrefetchRow(vg + slots[t] * kv_row, hd);
      }
      const float* rows[4] = {vg + slots[j] * kv_row, vg + slots[j + 1] * kv_row,
                              vg + slots[j + 2] * kv_row, vg + slots[j + 3] * kv_row};
      for (int64_t h = 0; h < group; ++h) {
        AxpyRows<N, 4>(sc + h * C + (j - ja), rows, part + h * part_row + 2, hd);
      }
    }
    for (; j < jb; ++j) {
      const float* rows[1] = {vg + slots[j] * kv_row};
      for (int64_t h = 0; h < group; ++h) {
        AxpyRows<N, 1>(sc + h * C + (j - ja), rows, part + h * part_row + 2, hd);
      }
    }
    if (hp.scores >= 0 && i >= first_signal) {
      float* kept = ws.scores.data() + hp.scores + (i - first_signal) * group * r.keys;
      for (int64_t h = 0; h < group; ++h) {
        std::copy(sc + h * C, sc + h * C + len, kept + h * r.keys + ja);
      }
    }
  }
  if (hp.norms >= 0) {
    float* norms = ws.norms.data() + hp.norms;
    const float inv_heads = 1.0f / static_cast<float>(b.norm_heads);
    for (int64_t jj = a; jj < e; ++jj) {
      const float* kj = kg + slots[jj] * kv_row;
      norms[jj] = std::sqrt(DotRow<N>(kj, kj, hd)) * inv_heads;
    }
  }
}

#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"))) void AttendChunkAvx512(const CpuAttentionBatch& b,
                                                                 Workspace& ws, int64_t unit) {
  AttendChunkOn<V16>(b, ws, unit);
}
__attribute__((target("arch=x86-64-v3"))) void AttendChunkAvx2(const CpuAttentionBatch& b,
                                                               Workspace& ws, int64_t unit) {
  AttendChunkOn<V8>(b, ws, unit);
}
#endif

void AttendChunk(const CpuAttentionBatch& b, Workspace& ws, int64_t unit) {
  switch (ActiveCpuIsa()) {
#if defined(__x86_64__)
    case CpuIsa::kAvx512:
      return AttendChunkAvx512(b, ws, unit);
    case CpuIsa::kAvx2:
      return AttendChunkAvx2(b, ws, unit);
#endif
    default:
      return AttendChunkOn<V4>(b, ws, unit);
  }
}

// Sequence s: each row and query head's output from its chunks, rescaled to the largest score
// (out = sum_c w_c acc_c / sum_c w_c l_c, w_c = exp(m_c - max m)); then the signals, KV head by
// KV head in order (heads of a layer may share one key range).
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void CombineSeq(
    const CpuAttentionBatch& b, const Workspace& ws, int64_t s) {
  if (b.skip != nullptr && b.skip[s] != 0) return;
  thread_local std::vector<float> weights;  // [chunks]
  const int64_t kvh = b.num_kv_heads, group = b.num_heads / kvh, hd = b.head_dim;
  const int64_t q_row = b.num_heads * hd, part_row = 2 + hd;
  constexpr int64_t C = kCpuAttentionChunkKeys;
  const int64_t q0 = b.q_offsets[s], n = b.q_offsets[s + 1] - q0;
  const int64_t first_signal = n - SignalRows(b, s, n);
  weights.resize(static_cast<size_t>(std::max<int64_t>(ws.max_chunks, 1)));
  for (int64_t g = 0; g < kvh; ++g) {
    const HeadPlan& hp = ws.heads[(s - ws.seq_begin) * kvh + g];
    const KeyRange r = RangeOf(b, s, g);
    const int64_t ctx = r.keys - n;
    const int64_t* kpos = b.sliding_window > 0 ? b.key_positions + r.k0 : nullptr;
    const float* parts = ws.partials.data() + hp.partials;
    float* attn_sum = hp.scores >= 0 ? b.attn_sum + r.k0 : nullptr;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t lo = WindowStart(b, kpos, ctx, i), hi = ctx + i + 1;
      for (int64_t h = 0; h < group; ++h) {
        auto part = [&](int64_t c) { return parts + ((c * n + i) * group + h) * part_row; };
        float top = -std::numeric_limits<float>::infinity();
        for (int64_t c = 0; c < hp.chunks; ++c) {
          if (part(c)[1] > 0) top = std::max(top, part(c)[0]);
        }
        float total = 0;
        for (int64_t c = 0; c < hp.chunks; ++c) {
          weights[c] = part(c)[1] > 0 ? Exp(part(c)[0] - top) : 0.0f;
          total += weights[c] * part(c)[1];
        }
        const float inv = 1.0f / total;
        float* o = b.out + (q0 + i) * q_row + (g * group + h) * hd;
        std::fill(o, o + hd, 0.0f);
        for (int64_t c = 0; c < hp.chunks; ++c) {
          if (weights[c] == 0) continue;
          const float f = weights[c] * inv;
          const float* acc = part(c) + 2;
          for (int64_t d = 0; d < hd; ++d) o[d] += f * acc[d];
        }
        if (attn_sum == nullptr || i < first_signal) continue;
        const float* kept =
            ws.scores.data() + hp.scores + ((i - first_signal) * group + h) * r.keys;
        for (int64_t c = 0; c < hp.chunks; ++c) {
          const int64_t ja = std::max(c * C, lo), jb = std::min((c + 1) * C, hi);
          const float f = weights[c] * inv;
          for (int64_t j = ja; j < jb; ++j) attn_sum[j] += kept[j] * f;
        }
      }
    }
    if (hp.norms >= 0) {
      float* norm_sum = b.norm_sum + r.k0;
      const float* norms = ws.norms.data() + hp.norms;
      for (int64_t j = 0; j < r.keys; ++j) norm_sum[j] += norms[j];
    }
  }
}

// The calling thread's plan and scratch, reused call after call. Returned by reference: a lambda
// naming the thread_local itself would reach the running thread's own copy, and the pool's
// workers must see the caller's.
Workspace& CallerWorkspace() {
  thread_local Workspace ws;
  return ws;
}

}  // namespace

void CpuPagedAttention(const CpuAttentionBatch& batch, int64_t seq_begin, int64_t seq_end) {
  Workspace& ws = CallerWorkspace();
  BuildPlan(batch, seq_begin, seq_end, ws);
  for (int64_t u = 0; u < static_cast<int64_t>(ws.unit_head.size()); ++u) AttendChunk(batch, ws, u);
  for (int64_t s = seq_begin; s < seq_end; ++s) CombineSeq(batch, ws, s);
}

int64_t CpuAttentionUnits(const CpuAttentionBatch& batch) {
  Workspace& ws = CallerWorkspace();
  BuildPlan(batch, 0, batch.num_seqs, ws);
  return static_cast<int64_t>(ws.unit_head.size());
}

void CpuPagedAttention(const CpuAttentionBatch& batch, CpuPool& pool) {
  Workspace& ws = CallerWorkspace();
  BuildPlan(batch, 0, batch.num_seqs, ws);
  if (ws.max_chunks <= 1) {
    // One chunk per range: each sequence's two phases in one share (one pool call).
    pool.ParallelFor(batch.num_seqs, [&](int64_t begin, int64_t end) {
      for (int64_t s = begin; s < end; ++s) {
        if (batch.skip != nullptr && batch.skip[s] != 0) continue;
        for (int64_t g = 0; g < batch.num_kv_heads; ++g) {
          AttendChunk(batch, ws, ws.heads[s * batch.num_kv_heads + g].first_unit);
        }
        CombineSeq(batch, ws, s);
      }
    });
    return;
  }
  pool.ParallelFor(static_cast<int64_t>(ws.unit_head.size()), [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) AttendChunk(batch, ws, u);
  });
  pool.ParallelFor(batch.num_seqs, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) CombineSeq(batch, ws, s);
  });
}

}  // namespace vtoken::model
