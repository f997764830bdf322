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
using simd::KvValue;
using simd::Lanes16;
using simd::LoadKv;
using simd::Max;
using simd::V16;
using simd::V4;
using simd::V8;

// Slots are scattered: fetch the rows a few keys ahead so that their cache misses overlap.
constexpr int64_t kPrefetchAhead = 8;
template <typename E>
VTOKEN_INLINE void PrefetchRow(const E* row, int64_t elements) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t off = 0; off < elements * static_cast<int64_t>(sizeof(E)); off += 64) {
    __builtin_prefetch(p + off);
  }
}

// a . b: 16 lanes (in native vectors N, cpu_simd.h's Lanes16), Reduce16's tree, then the tail.
// A and B: float, or uint16_t for a row of an fp16 cache (widened as loaded).
template <typename N, typename A, typename B>
VTOKEN_INLINE float DotRow(const A* a, const B* b, int64_t n) {
  using L = Lanes16<N>;
  L acc = L::Zero();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) acc.MulAdd(LoadKv<N>(a + i), LoadKv<N>(b + i));
  float s = acc.Reduce();
  for (; i < n; ++i) s = L::TailMulAdd(s, KvValue(a[i]), KvValue(b[i]));
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
// stored once per K rows instead of once per row. E: the cache's element (float or uint16_t).
template <typename N, int K, typename E>
VTOKEN_INLINE void AxpyRows(const float* p, const E* const* x, float* y, int64_t n) {
  using L = Lanes16<N>;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    L acc = L::Load(y + i);
    for (int r = 0; r < K; ++r) acc.MulAdd(p[r], LoadKv<N>(x[r] + i));
    acc.Store(y + i);
  }
  for (; i < n; ++i) {
    float acc = y[i];
    for (int r = 0; r < K; ++r) acc = L::TailMulAdd(acc, p[r], KvValue(x[r][i]));
    y[i] = acc;
  }
}

// Where one (sequence, KV head) pair's chunk results and signal inputs live in the workspace.
struct HeadPlan {
  int64_t partials = 0;  // Floats: [chunks][rows][group][2 + head_dim].
  int64_t scores = -1;   // Floats: [signal rows][group][keys], or -1.
  int64_t norms = -1;    // Floats: [keys], or -1.
};

// One key range of a sequence and the KV heads that read it (all of them at token granularity,
// one at head granularity): a unit of work is one chunk of a range, for all its heads, so that a
// slot's K and V rows of every head are read together (they are adjacent in the slot) instead of
// once per head, a slot apart each time.
struct RangePlan {
  int64_t s = 0;
  int64_t heads_begin = 0, heads_end = 0;  // Its KV heads: range_heads[heads_begin, heads_end).
  int64_t first_unit = 0, chunks = 0;      // Its units: [first_unit, first_unit + chunks).
};

struct Workspace {
  int64_t seq_begin = 0, max_chunks = 0;
  std::vector<HeadPlan> heads;       // [(seq - seq_begin) * num_kv_heads + kv head]
  std::vector<RangePlan> ranges;     // By sequence, then range.
  std::vector<int64_t> seq_ranges;   // [seq - seq_begin + 1]: each sequence's first range.
  std::vector<int64_t> range_heads;  // KV heads, range by range.
  std::vector<int64_t> unit_range;   // Unit -> its index in `ranges`.
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
  ws.ranges.clear();
  ws.seq_ranges.assign(1, 0);
  ws.range_heads.clear();
  ws.unit_range.clear();
  int64_t partials = 0, scores = 0, norms = 0;
  for (int64_t s = seq_begin; s < seq_end; ++s) {
    if (b.skip == nullptr || b.skip[s] == 0) {
      const int64_t n = b.q_offsets[s + 1] - b.q_offsets[s];
      const uint8_t want = b.want_signals != nullptr ? b.want_signals[s] : 0;
      for (int64_t g = 0; g < kvh; ++g) {
        const KeyRange r = RangeOf(b, s, g);
        const int64_t chunks = (r.keys + kCpuAttentionChunkKeys - 1) / kCpuAttentionChunkKeys;
        // Consecutive heads that read the same range share its plan (at token granularity all
        // of them do; at head granularity none).
        const int64_t u = b.head_group != nullptr ? b.head_group[g] : 0;
        if (g == 0 || u != (b.head_group != nullptr ? b.head_group[g - 1] : 0)) {
          ws.ranges.push_back(RangePlan{.s = s, .chunks = chunks});
        }
        ws.range_heads.push_back(g);
        ws.ranges.back().heads_end = static_cast<int64_t>(ws.range_heads.size());
        ws.max_chunks = std::max(ws.max_chunks, chunks);
        HeadPlan& hp = ws.heads[(s - seq_begin) * kvh + g];
        hp.partials = partials;
        partials += chunks * n * group * (2 + hd);
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
    ws.seq_ranges.push_back(static_cast<int64_t>(ws.ranges.size()));
  }
  int64_t head = 0;
  for (size_t i = 0; i < ws.ranges.size(); ++i) {
    RangePlan& rp = ws.ranges[i];
    rp.heads_begin = head;
    head = rp.heads_end;
    rp.first_unit = static_cast<int64_t>(ws.unit_range.size());
    ws.unit_range.insert(ws.unit_range.end(), rp.chunks, static_cast<int64_t>(i));
  }
  ws.partials.resize(static_cast<size_t>(partials));
  ws.scores.resize(static_cast<size_t>(scores));
  ws.norms.resize(static_cast<size_t>(norms));
}

// One unit: keys [c * C, (c + 1) * C) of one (sequence, key range), for each KV head reading the
// range, each query row and each query head of the KV head's group: m = the largest score, l =
// sum exp(score - m), acc = sum exp(score - m) v; and, for the signal rows, the exp(score - m)
// values themselves; and the keys' norms. Each head's arithmetic is the same whichever heads
// share its unit. On native vectors N (cpu_isa.h) over a cache of E (float, or uint16_t for
// fp16): AttendChunk below picks them.
template <typename N, typename E>
VTOKEN_INLINE void AttendChunkOn(const CpuAttentionBatch& b, Workspace& ws, int64_t unit) {
  thread_local std::vector<float> scratch;  // [heads of the unit][group][C]
  const int64_t kvh = b.num_kv_heads, group = b.num_heads / kvh, hd = b.head_dim;
  const int64_t kv_row = b.slot_stride, q_row = b.num_heads * hd, part_row = 2 + hd;
  constexpr int64_t C = kCpuAttentionChunkKeys;
  const RangePlan& rp = ws.ranges[ws.unit_range[unit]];
  const int64_t s = rp.s, c = unit - rp.first_unit;
  const int64_t* heads = ws.range_heads.data() + rp.heads_begin;
  const int64_t nh = rp.heads_end - rp.heads_begin;
  const KeyRange r = RangeOf(b, s, heads[0]);
  const int64_t q0 = b.q_offsets[s], n = b.q_offsets[s + 1] - q0, ctx = r.keys - n;
  const int64_t first_signal = n - SignalRows(b, s, n);
  const int64_t a = c * C, e = std::min(a + C, r.keys);
  const int64_t* slots = b.slots + r.k0;
  const int64_t* kpos = b.sliding_window > 0 ? b.key_positions + r.k0 : nullptr;
  auto plan = [&](int64_t x) -> const HeadPlan& {
    return ws.heads[(s - ws.seq_begin) * kvh + heads[x]];
  };
  // Head x's rows of a slot; at token granularity the heads' rows are adjacent.
  const E* k_cache = static_cast<const E*>(b.k_cache);
  const E* v_cache = static_cast<const E*>(b.v_cache);
  auto k_row = [&](int64_t x, int64_t slot) {
    return k_cache + heads[x] * b.kv_head_stride + slot * kv_row;
  };
  auto v_row = [&](int64_t x, int64_t slot) {
    return v_cache + heads[x] * b.kv_head_stride + slot * kv_row;
  };
  scratch.resize(static_cast<size_t>(nh * group * C));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t ja = std::max(a, WindowStart(b, kpos, ctx, i)), jb = std::min(e, ctx + i + 1);
    auto part_of = [&](int64_t x) {
      return ws.partials.data() + plan(x).partials + (c * n + i) * group * part_row;
    };
    if (ja >= jb) {  // The row sees no key of this chunk.
      for (int64_t x = 0; x < nh; ++x) {
        for (int64_t h = 0; h < group; ++h) {
          float* ph = part_of(x) + h * part_row;
          ph[0] = -std::numeric_limits<float>::infinity();
          std::fill(ph + 1, ph + part_row, 0.0f);
        }
      }
      continue;
    }
    const int64_t len = jb - ja;
    const float* qi = b.q + (q0 + i) * q_row;
    float* sc = scratch.data();
    for (int64_t j = ja; j < jb; ++j) {
      for (int64_t x = 0; j + kPrefetchAhead < jb && x < nh; ++x) {
        PrefetchRow(k_row(x, slots[j + kPrefetchAhead]), hd);
      }
      for (int64_t x = 0; x < nh; ++x) {
        const E* kj = k_row(x, slots[j]);
        const float* qg = qi + heads[x] * group * hd;
        for (int64_t h = 0; h < group; ++h) {
          sc[(x * group + h) * C + (j - ja)] = b.scale * DotRow<N>(qg + h * hd, kj, hd);
        }
      }
    }
    for (int64_t x = 0; x < nh; ++x) {
      for (int64_t h = 0; h < group; ++h) {
        float* row = sc + (x * group + h) * C;
        const float m = Max(row, len);
        for (int64_t j = 0; j < len; ++j) row[j] = Exp(row[j] - m);
        float* ph = part_of(x) + h * part_row;
        ph[0] = m;
        ph[1] = SumRow<N>(row, len);
        std::fill(ph + 2, ph + part_row, 0.0f);
      }
    }
    int64_t j = ja;
    for (; j + 4 <= jb; j += 4) {
      for (int64_t t = j + kPrefetchAhead; t < std::min(j + kPrefetchAhead + 4, jb); ++t) {
        for (int64_t x = 0; x < nh; ++x) PrefetchRow(v_row(x, slots[t]), hd);
      }
      for (int64_t x = 0; x < nh; ++x) {
        const E* rows[4] = {v_row(x, slots[j]), v_row(x, slots[j + 1]), v_row(x, slots[j + 2]),
                            v_row(x, slots[j + 3])};
        float* part = part_of(x);
        for (int64_t h = 0; h < group; ++h) {
          AxpyRows<N, 4>(sc + (x * group + h) * C + (j - ja), rows, part + h * part_row + 2, hd);
        }
      }
    }
    for (; j < jb; ++j) {
      for (int64_t x = 0; x < nh; ++x) {
        const E* rows[1] = {v_row(x, slots[j])};
        float* part = part_of(x);
        for (int64_t h = 0; h < group; ++h) {
          AxpyRows<N, 1>(sc + (x * group + h) * C + (j - ja), rows, part + h * part_row + 2, hd);
        }
      }
    }
    if (i >= first_signal) {
      for (int64_t x = 0; x < nh; ++x) {
        if (plan(x).scores < 0) continue;
        float* kept = ws.scores.data() + plan(x).scores + (i - first_signal) * group * r.keys;
        for (int64_t h = 0; h < group; ++h) {
          const float* row = sc + (x * group + h) * C;
          std::copy(row, row + len, kept + h * r.keys + ja);
        }
      }
    }
  }
  const float inv_heads = 1.0f / static_cast<float>(b.norm_heads);
  for (int64_t x = 0; x < nh; ++x) {
    if (plan(x).norms < 0) continue;
    float* norms = ws.norms.data() + plan(x).norms;
    for (int64_t jj = a; jj < e; ++jj) {
      const E* kj = k_row(x, slots[jj]);
      norms[jj] = std::sqrt(DotRow<N>(kj, kj, hd)) * inv_heads;
    }
  }
}

// The instantiation for the batch's cache element.
template <typename N>
VTOKEN_INLINE void AttendChunkOnCache(const CpuAttentionBatch& b, Workspace& ws, int64_t unit) {
  if (b.kv_element == CpuKvElement::kFloat16) return AttendChunkOn<N, uint16_t>(b, ws, unit);
  AttendChunkOn<N, float>(b, ws, unit);
}

#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"))) void AttendChunkAvx512(const CpuAttentionBatch& b,
                                                                 Workspace& ws, int64_t unit) {
  AttendChunkOnCache<V16>(b, ws, unit);
}
__attribute__((target("arch=x86-64-v3"))) void AttendChunkAvx2(const CpuAttentionBatch& b,
                                                               Workspace& ws, int64_t unit) {
  AttendChunkOnCache<V8>(b, ws, unit);
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
      return AttendChunkOnCache<V4>(b, ws, unit);
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
    const int64_t chunks = (r.keys + C - 1) / C;
    const int64_t ctx = r.keys - n;
    const int64_t* kpos = b.sliding_window > 0 ? b.key_positions + r.k0 : nullptr;
    const float* parts = ws.partials.data() + hp.partials;
    float* attn_sum = hp.scores >= 0 ? b.attn_sum + r.k0 : nullptr;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t lo = WindowStart(b, kpos, ctx, i), hi = ctx + i + 1;
      for (int64_t h = 0; h < group; ++h) {
        auto part = [&](int64_t c) { return parts + ((c * n + i) * group + h) * part_row; };
        float top = -std::numeric_limits<float>::infinity();
        for (int64_t c = 0; c < chunks; ++c) {
          if (part(c)[1] > 0) top = std::max(top, part(c)[0]);
        }
        float total = 0;
        for (int64_t c = 0; c < chunks; ++c) {
          weights[c] = part(c)[1] > 0 ? Exp(part(c)[0] - top) : 0.0f;
          total += weights[c] * part(c)[1];
        }
        const float inv = 1.0f / total;
        float* o = b.out + (q0 + i) * q_row + (g * group + h) * hd;
        std::fill(o, o + hd, 0.0f);
        for (int64_t c = 0; c < chunks; ++c) {
          if (weights[c] == 0) continue;
          const float f = weights[c] * inv;
          const float* acc = part(c) + 2;
          for (int64_t d = 0; d < hd; ++d) o[d] += f * acc[d];
        }
        if (attn_sum == nullptr || i < first_signal) continue;
        const float* kept =
            ws.scores.data() + hp.scores + ((i - first_signal) * group + h) * r.keys;
        for (int64_t c = 0; c < chunks; ++c) {
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

// to[0..n) = from[0..n) rounded to binary16 (a prefill chunk writes thousands of rows: F16C's
// conversion, not the compiler's call per element).
template <typename N>
VTOKEN_INLINE void NarrowOn(const float* from, int64_t n, uint16_t* to) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) simd::StoreF16<N>(Lanes16<N>::Load(from + i), to + i);
  for (; i < n; ++i) to[i] = simd::NarrowF16(from[i]);
}

// y[0..n) = the n binary16 values at x, widened (exact).
template <typename N>
VTOKEN_INLINE void WidenOn(const uint16_t* x, int64_t n, float* y) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) simd::LoadF16<N>(x + i).Store(y + i);
  for (; i < n; ++i) y[i] = simd::WidenF16(x[i]);
}

#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"))) void WidenAvx512(const uint16_t* x, int64_t n, float* y) {
  WidenOn<V16>(x, n, y);
}
__attribute__((target("arch=x86-64-v3"))) void WidenAvx2(const uint16_t* x, int64_t n, float* y) {
  WidenOn<V8>(x, n, y);
}
__attribute__((target("arch=x86-64-v4"))) void NarrowAvx512(const float* from, int64_t n,
                                                            uint16_t* to) {
  NarrowOn<V16>(from, n, to);
}
__attribute__((target("arch=x86-64-v3"))) void NarrowAvx2(const float* from, int64_t n,
                                                          uint16_t* to) {
  NarrowOn<V8>(from, n, to);
}
#endif

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
  for (int64_t u = 0; u < static_cast<int64_t>(ws.unit_range.size()); ++u)
    AttendChunk(batch, ws, u);
  for (int64_t s = seq_begin; s < seq_end; ++s) CombineSeq(batch, ws, s);
}

void CpuStoreKvRow(CpuKvElement element, const float* from, int64_t n, void* cache, int64_t at) {
  if (element == CpuKvElement::kFloat32) {
    std::copy(from, from + n, static_cast<float*>(cache) + at);
    return;
  }
  uint16_t* to = static_cast<uint16_t*>(cache) + at;
  switch (ActiveCpuIsa()) {
#if defined(__x86_64__)
    case CpuIsa::kAvx512:
      return NarrowAvx512(from, n, to);
    case CpuIsa::kAvx2:
      return NarrowAvx2(from, n, to);
#endif
    default:
      return NarrowOn<V4>(from, n, to);
  }
}

void CpuLoadKvRow(CpuKvElement element, const void* cache, int64_t at, int64_t n, float* y) {
  if (element == CpuKvElement::kFloat32) {
    const float* x = static_cast<const float*>(cache) + at;
    std::copy(x, x + n, y);
    return;
  }
  const uint16_t* x = static_cast<const uint16_t*>(cache) + at;
  switch (ActiveCpuIsa()) {
#if defined(__x86_64__)
    case CpuIsa::kAvx512:
      return WidenAvx512(x, n, y);
    case CpuIsa::kAvx2:
      return WidenAvx2(x, n, y);
#endif
    default:
      return WidenOn<V4>(x, n, y);
  }
}

int64_t CpuAttentionUnits(const CpuAttentionBatch& batch) {
  Workspace& ws = CallerWorkspace();
  BuildPlan(batch, 0, batch.num_seqs, ws);
  return static_cast<int64_t>(ws.unit_range.size());
}

void CpuPagedAttention(const CpuAttentionBatch& batch, CpuPool& pool) {
  Workspace& ws = CallerWorkspace();
  BuildPlan(batch, 0, batch.num_seqs, ws);
  if (ws.max_chunks <= 1) {
    // One chunk per range: each sequence's two phases in one share (one pool call).
    pool.ParallelFor(batch.num_seqs, [&](int64_t begin, int64_t end) {
      for (int64_t s = begin; s < end; ++s) {
        for (int64_t x = ws.seq_ranges[s]; x < ws.seq_ranges[s + 1]; ++x) {
          AttendChunk(batch, ws, ws.ranges[x].first_unit);
        }
        CombineSeq(batch, ws, s);
      }
    });
    return;
  }
  pool.ParallelFor(static_cast<int64_t>(ws.unit_range.size()), [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) AttendChunk(batch, ws, u);
  });
  pool.ParallelFor(batch.num_seqs, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) CombineSeq(batch, ws, s);
  });
}

}  // namespace vtoken::model
