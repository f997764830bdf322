// Batched paged attention kernels (design in paged_batch_attention.h). Scores are kept in base 2:
// q is pre-scaled by scale * log2(e), so exp2f replaces expf and the log-sum-exps in the
// workspace are log2 values.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "lib/cuda/paged_batch_kernels.h"

namespace vtoken::cuda::internal {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 16;  // Keys per shared-memory chunk.
constexpr float kLog2e = 1.4426950408889634f;

// Element access per dtype: scalar load / store and the unpacking of one 16-byte vector.
template <typename T>
struct Elem;

template <>
struct Elem<float> {
  static constexpr int kVec = 4;
  __device__ static float Load(const float* p) { return *p; }
  __device__ static void Store(float* p, float v) { *p = v; }
  __device__ static void Unpack(const uint4& raw, float* out) {
    out[0] = __uint_as_float(raw.x);
    out[1] = __uint_as_float(raw.y);
    out[2] = __uint_as_float(raw.z);
    out[3] = __uint_as_float(raw.w);
  }
};

template <>
struct Elem<__nv_bfloat16> {
  static constexpr int kVec = 8;
  __device__ static float Load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
  __device__ static void Store(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }
  __device__ static void Unpack(const uint4& raw, float* out) {
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[i]));
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
};

template <>
struct Elem<__half> {
  static constexpr int kVec = 8;
  __device__ static float Load(const __half* p) { return __half2float(*p); }
  __device__ static void Store(__half* p, float v) { *p = __float2half_rn(v); }
  __device__ static void Unpack(const uint4& raw, float* out) {
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&words[i]));
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
};

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset /= 2) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// The first key of [0, hi) inside query row i's window (CpuPagedAttention's upper_bound):
// the first position > query_position - window, positions nondecreasing.
// The query is key hi - 1. kpos is read only with a window (it may be null without one).
__device__ int64_t WindowStart(const int64_t* kpos, int64_t hi, int64_t window) {
  if (window <= 0) return 0;
  const int64_t bound = kpos[hi - 1] - window;
  int64_t lo = 0;
  int64_t count = hi;
  while (count > 0) {
    const int64_t step = count / 2;
    if (kpos[lo + step] <= bound) {
      lo += step + 1;
      count -= step + 1;
    } else {
      count = step;
    }
  }
  return lo;
}

__device__ __forceinline__ int64_t SignalRows(const PagedBatchArgs& a, int seq, int64_t n) {
  if (a.want_signals == nullptr || a.attn_sum == nullptr || a.want_signals[seq] == 0) return 0;
  const int64_t rows = a.num_signal[seq] < 1 ? 1 : (a.num_signal[seq] > n ? n : a.num_signal[seq]);
  return rows < a.max_signal_rows ? rows : a.max_signal_rows;
}

// Where the score of signal row i (of the sequence's n rows, first_signal the first signal row)
// of sequence `seq` (query rows from q0), query head `head` and key j lies in ws.scores.
__device__ __forceinline__ int64_t ScoreIndex(const PagedBatchArgs& a, bool by_row, int seq,
                                              int64_t q0, int64_t i, int64_t first_signal,
                                              int64_t head, int64_t j) {
  const int64_t score_row =
      by_row ? q0 + i : static_cast<int64_t>(seq) * a.max_signal_rows + (i - first_signal);
  return (score_row * a.num_heads + head) * a.max_keys + j;
}

// One CTA: query vectors (row r, head h of its tile) qv = r * heads_in_tile + h of one sequence
// and KV head, over the keys of one partition. kMaxQ query vectors, kMaxDim head dims; the
// accumulator (kMaxQ x head_dim) is spread over the threads' registers.
template <typename T, int kMaxDim, int kMaxQ>
__global__ void __launch_bounds__(kThreads)
    PagedBatchKernel(PagedBatchArgs a, PagedBatchTiling t, PagedBatchWorkspace ws,
                     bool vectorized) {
  constexpr int kAccRegs = kMaxQ * kMaxDim / kThreads;
  constexpr int kKvStride = kMaxDim + 1;  // Odd row stride: column reads hit distinct banks.
  __shared__ float q_s[kMaxQ * kMaxDim];
  __shared__ float k_s[kChunk * kKvStride];
  __shared__ float v_s[kChunk * kKvStride];
  __shared__ float p_s[kMaxQ * kChunk];
  __shared__ float m_s[kMaxQ], l_s[kMaxQ], corr_s[kMaxQ];
  __shared__ int64_t lo_s[kMaxQ], hi_s[kMaxQ], slot_s[kChunk];

  const int seq = blockIdx.x / a.num_kv_heads;
  const int kv_head = blockIdx.x % a.num_kv_heads;
  const int row_tile = blockIdx.y / t.head_tiles;
  const int head_tile = blockIdx.y % t.head_tiles;
  const int part = blockIdx.z;
  if (a.skip != nullptr && a.skip[seq] != 0) return;
  const int64_t q0 = a.q_offsets[seq];
  const int64_t n = a.q_offsets[seq + 1] - q0;
  const int64_t r0 = static_cast<int64_t>(row_tile) * t.rows_per_tile;
  if (r0 >= n) return;
  const int rows = static_cast<int>(n - r0 < t.rows_per_tile ? n - r0 : t.rows_per_tile);
  const int group = a.num_heads / a.num_kv_heads;
  const int h0 = kv_head * group + head_tile * t.heads_per_tile;  // First query head.
  const int heads = min(t.heads_per_tile, group - head_tile * t.heads_per_tile);
  const int num_q = rows * heads;
  const int dim = a.head_dim;
  const int tid = threadIdx.x;

  const int64_t u = static_cast<int64_t>(seq) * a.groups_per_seq +
                    (a.head_group != nullptr ? a.head_group[kv_head] : 0);
  const int64_t k0 = a.key_offsets[u];
  const int64_t keys = a.key_offsets[u + 1] - k0;
  const int64_t ctx = keys - n;
  const int64_t* slots = a.slots + k0;
  const int64_t* kpos = a.sliding_window > 0 ? a.key_positions + k0 : nullptr;
  const int64_t signal_rows = SignalRows(a, seq, n);
  const int64_t first_signal = n - signal_rows;
  const bool signals = a.want_signals != nullptr && a.want_signals[seq] != 0;
  // The last row tile sees every key up to the end; its first head tile owns the key norms.
  const bool norm_owner = signals && a.norm_sum != nullptr && r0 + rows == n && head_tile == 0;
  const float inv_norm_heads = 1.0f / static_cast<float>(a.norm_heads);

  const int64_t width = ((keys + t.partitions - 1) / t.partitions + kChunk - 1) / kChunk * kChunk;
  const int64_t p0 = part * width < keys ? part * width : keys;
  const int64_t p1 = p0 + width < keys ? p0 + width : keys;

  const T* k_cache = static_cast<const T*>(a.k_cache) + kv_head * a.kv_head_stride;
  const T* v_cache = static_cast<const T*>(a.v_cache) + kv_head * a.kv_head_stride;
  const T* q = static_cast<const T*>(a.q);
  const float q_scale = a.scale * kLog2e;
  for (int e = tid; e < num_q * dim; e += kThreads) {
    const int qv = e / dim, d = e % dim;
    const int64_t row = q0 + r0 + qv / heads;
    q_s[qv * dim + d] =
        Elem<T>::Load(q + (row * a.num_heads + h0 + qv % heads) * dim + d) * q_scale;
  }
  if (tid < rows) {
    const int64_t i = r0 + tid;
    hi_s[tid] = ctx + i + 1;
    lo_s[tid] = WindowStart(kpos, ctx + i + 1, a.sliding_window);
  }
  if (tid < num_q) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
  }
  __syncthreads();
  int64_t tile_lo = lo_s[0];
  for (int r = 1; r < rows; ++r) tile_lo = lo_s[r] < tile_lo ? lo_s[r] : tile_lo;
  const int64_t tile_hi = hi_s[rows - 1];
  const int64_t begin = p0 > tile_lo ? p0 : tile_lo;
  const int64_t end = p1 < tile_hi ? p1 : tile_hi;

  if (norm_owner) {  // Keys left of every row's window: loaded for their norm only.
    const int warp = tid / 32, lane = tid % 32;
    const int64_t stop = p1 < tile_lo ? p1 : tile_lo;
    for (int64_t j = p0 + warp; j < stop; j += kWarps) {
      const T* k = k_cache + slots[j] * a.slot_stride;
      float sq = 0.0f;
      for (int d = lane; d < dim; d += 32) {
        const float x = Elem<T>::Load(k + d);
        sq += x * x;
      }
      sq = WarpSum(sq);
      if (lane == 0) atomicAdd(a.norm_sum + k0 + j, sqrtf(sq) * inv_norm_heads);
    }
  }

  // Threads per score: enough lanes that M x kChunk dot products keep all threads busy.
  const int pairs = num_q * kChunk;
  int lanes_per_dot = 1;
  while (lanes_per_dot < 32 && pairs * lanes_per_dot * 2 <= kThreads) lanes_per_dot *= 2;
  const int dots_per_pass = kThreads / lanes_per_dot;
  const int passes = (pairs + dots_per_pass - 1) / dots_per_pass;

  // Accumulator element i of this thread is (query vector qv, dim d), packed as qv << 16 | d.
  float acc[kAccRegs];
  int acc_at[kAccRegs];
#pragma unroll
  for (int i = 0; i < kAccRegs; ++i) {
    acc[i] = 0.0f;
    const int e = tid + i * kThreads;
    acc_at[i] = (e / dim) << 16 | (e % dim);
  }

  for (int64_t c0 = begin; c0 < end; c0 += kChunk) {
    const int count = static_cast<int>(end - c0 < kChunk ? end - c0 : kChunk);
    if (tid < kChunk) slot_s[tid] = tid < count ? slots[c0 + tid] : -1;
    __syncthreads();
    if (vectorized) {
      constexpr int kVec = Elem<T>::kVec;
      const int per_row = dim / kVec;
      for (int idx = tid; idx < kChunk * per_row; idx += kThreads) {
        const int c = idx / per_row, d = (idx % per_row) * kVec;
        float kx[kVec], vx[kVec];
        if (slot_s[c] >= 0) {
          const int64_t offset = slot_s[c] * a.slot_stride + d;
          Elem<T>::Unpack(*reinterpret_cast<const uint4*>(k_cache + offset), kx);
          Elem<T>::Unpack(*reinterpret_cast<const uint4*>(v_cache + offset), vx);
        } else {
#pragma unroll
          for (int e = 0; e < kVec; ++e) kx[e] = vx[e] = 0.0f;
        }
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          k_s[c * kKvStride + d + e] = kx[e];
          v_s[c * kKvStride + d + e] = vx[e];
        }
      }
    } else {
      for (int idx = tid; idx < kChunk * dim; idx += kThreads) {
        const int c = idx / dim, d = idx % dim;
        const bool live = slot_s[c] >= 0;
        const int64_t offset = live ? slot_s[c] * a.slot_stride + d : 0;
        k_s[c * kKvStride + d] = live ? Elem<T>::Load(k_cache + offset) : 0.0f;
        v_s[c * kKvStride + d] = live ? Elem<T>::Load(v_cache + offset) : 0.0f;
      }
    }
    __syncthreads();

    if (norm_owner && tid < count) {
      float sq = 0.0f;
      for (int d = 0; d < dim; ++d) sq += k_s[tid * kKvStride + d] * k_s[tid * kKvStride + d];
      atomicAdd(a.norm_sum + k0 + c0 + tid, sqrtf(sq) * inv_norm_heads);
    }
    for (int pass = 0; pass < passes; ++pass) {
      const int pair = pass * dots_per_pass + tid / lanes_per_dot;
      const int sub = tid % lanes_per_dot;
      const int qv = pair / kChunk, c = pair % kChunk;
      float dot = 0.0f;
      if (pair < pairs) {
        for (int d = sub; d < dim; d += lanes_per_dot) {
          dot += q_s[qv * dim + d] * k_s[c * kKvStride + d];
        }
      }
      for (int offset = lanes_per_dot / 2; offset > 0; offset /= 2) {
        dot += __shfl_xor_sync(0xffffffffu, dot, offset);
      }
      if (pair < pairs && sub == 0) {
        const int r = qv / heads;
        const int64_t j = c0 + c;
        const bool visible = c < count && j >= lo_s[r] && j < hi_s[r];
        p_s[qv * kChunk + c] = visible ? dot : -INFINITY;
        const int64_t i = r0 + r;
        if (c < count && i >= first_signal && j < a.max_keys) {
          ws.scores[ScoreIndex(a, t.scores_by_row, seq, q0, i, first_signal, h0 + qv % heads, j)] =
              dot;
        }
      }
    }
    __syncthreads();

    {  // Online softmax: one warp per query vector, a lane per key of the chunk.
      const int warp = tid / 32, lane = tid % 32;
      for (int qv = warp; qv < num_q; qv += kWarps) {
        const float s = lane < kChunk ? p_s[qv * kChunk + lane] : -INFINITY;
        const float m_old = m_s[qv];
        const float m_new = fmaxf(m_old, WarpMax(s));
        const float p = m_new == -INFINITY ? 0.0f : exp2f(s - m_new);
        const float sum = WarpSum(p);
        if (lane < kChunk) p_s[qv * kChunk + lane] = p;
        if (lane == 0) {
          const float corr = m_new == -INFINITY ? 1.0f : exp2f(m_old - m_new);
          corr_s[qv] = corr;
          l_s[qv] = l_s[qv] * corr + sum;
          m_s[qv] = m_new;
        }
      }
    }
    __syncthreads();

#pragma unroll
    for (int i = 0; i < kAccRegs; ++i) {
      const int qv = acc_at[i] >> 16, d = acc_at[i] & 0xffff;
      if (qv < num_q) {
        float x = acc[i] * corr_s[qv];
#pragma unroll
        for (int c = 0; c < kChunk; ++c) x += p_s[qv * kChunk + c] * v_s[c * kKvStride + d];
        acc[i] = x;
      }
    }
  }

  if (t.partitions == 1) {
    T* out = static_cast<T*>(a.out);
#pragma unroll
    for (int i = 0; i < kAccRegs; ++i) {
      const int qv = acc_at[i] >> 16, d = acc_at[i] & 0xffff;
      if (qv < num_q) {
        const int64_t row = q0 + r0 + qv / heads;
        const float l = l_s[qv];
        Elem<T>::Store(out + (row * a.num_heads + h0 + qv % heads) * dim + d,
                       l > 0.0f ? acc[i] / l : 0.0f);
      }
    }
    if (ws.lse != nullptr && tid < num_q) {
      const int64_t row = q0 + r0 + tid / heads;
      ws.lse[row * a.num_heads + h0 + tid % heads] =
          l_s[tid] > 0.0f ? m_s[tid] + log2f(l_s[tid]) : -INFINITY;
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < kAccRegs; ++i) {
    const int qv = acc_at[i] >> 16, d = acc_at[i] & 0xffff;
    if (qv < num_q) {
      const int64_t row = q0 + r0 + qv / heads;
      const int64_t state = (part * a.num_rows + row) * a.num_heads + h0 + qv % heads;
      ws.part_acc[state * dim + d] = acc[i];
    }
  }
  if (tid < num_q) {
    const int64_t row = q0 + r0 + tid / heads;
    const int64_t state = (part * a.num_rows + row) * a.num_heads + h0 + tid % heads;
    ws.part_max[state] = m_s[tid];
    ws.part_sum[state] = l_s[tid];
  }
}

// Combines the partitions' states of query row blockIdx.y of sequence blockIdx.x, all heads.
template <typename T>
__global__ void __launch_bounds__(256)
    MergePartitionsKernel(PagedBatchArgs a, PagedBatchWorkspace ws, int32_t partitions) {
  extern __shared__ float weight_s[];  // [num_heads, partitions]
  const int seq = blockIdx.x;
  if (a.skip != nullptr && a.skip[seq] != 0) return;
  const int64_t i = blockIdx.y;
  if (i >= a.q_offsets[seq + 1] - a.q_offsets[seq]) return;
  const int64_t row = a.q_offsets[seq] + i;
  for (int h = threadIdx.x; h < a.num_heads; h += blockDim.x) {
    float m = -INFINITY;
    for (int p = 0; p < partitions; ++p) {
      const int64_t state = (p * a.num_rows + row) * a.num_heads + h;
      if (ws.part_sum[state] > 0.0f) m = fmaxf(m, ws.part_max[state]);
    }
    float l = 0.0f;
    for (int p = 0; p < partitions; ++p) {
      const int64_t state = (p * a.num_rows + row) * a.num_heads + h;
      const float w = ws.part_sum[state] > 0.0f ? exp2f(ws.part_max[state] - m) : 0.0f;
      weight_s[h * partitions + p] = w;
      l += ws.part_sum[state] * w;
    }
    for (int p = 0; p < partitions; ++p) {
      weight_s[h * partitions + p] = l > 0.0f ? weight_s[h * partitions + p] / l : 0.0f;
    }
    if (ws.lse != nullptr) ws.lse[row * a.num_heads + h] = l > 0.0f ? m + log2f(l) : -INFINITY;
  }
  __syncthreads();
  T* out = static_cast<T*>(a.out);
  const int dim = a.head_dim;
  for (int e = threadIdx.x; e < a.num_heads * dim; e += blockDim.x) {
    const int h = e / dim, d = e % dim;
    float x = 0.0f;
    for (int p = 0; p < partitions; ++p) {
      const float w = weight_s[h * partitions + p];
      if (w != 0.0f) x += w * ws.part_acc[((p * a.num_rows + row) * a.num_heads + h) * dim + d];
    }
    Elem<T>::Store(out + (row * a.num_heads + h) * dim + d, x);
  }
}

// attn_sum += the signal rows' probabilities, from the scores the main pass wrote and the final
// log-sum-exps: one CTA per (sequence, KV head), a thread per key, rows in batches of kRowBatch.
__global__ void __launch_bounds__(256)
    AttnSignalKernel(PagedBatchArgs a, PagedBatchWorkspace ws, bool scores_by_row) {
  constexpr int kRowBatch = 64;
  __shared__ int64_t lo_s[kRowBatch], hi_s[kRowBatch];
  const int seq = blockIdx.x / a.num_kv_heads;
  const int kv_head = blockIdx.x % a.num_kv_heads;
  if (a.skip != nullptr && a.skip[seq] != 0) return;
  const int64_t q0 = a.q_offsets[seq];
  const int64_t n = a.q_offsets[seq + 1] - q0;
  const int64_t signal_rows = SignalRows(a, seq, n);
  if (signal_rows == 0) return;
  const int64_t first_signal = n - signal_rows;
  const int group = a.num_heads / a.num_kv_heads;
  const int64_t u = static_cast<int64_t>(seq) * a.groups_per_seq +
                    (a.head_group != nullptr ? a.head_group[kv_head] : 0);
  const int64_t k0 = a.key_offsets[u];
  const int64_t keys = a.key_offsets[u + 1] - k0;
  const int64_t ctx = keys - n;
  const int64_t* kpos = a.sliding_window > 0 ? a.key_positions + k0 : nullptr;
  const int64_t scored = keys < a.max_keys ? keys : a.max_keys;
  for (int64_t rb = 0; rb < signal_rows; rb += kRowBatch) {
    const int batch = static_cast<int>(signal_rows - rb < kRowBatch ? signal_rows - rb : kRowBatch);
    __syncthreads();
    if (threadIdx.x < batch) {
      const int64_t i = first_signal + rb + threadIdx.x;
      hi_s[threadIdx.x] = ctx + i + 1;
      lo_s[threadIdx.x] = WindowStart(kpos, ctx + i + 1, a.sliding_window);
    }
    __syncthreads();
    for (int64_t j = threadIdx.x; j < scored; j += blockDim.x) {
      float sum = 0.0f;
      for (int r = 0; r < batch; ++r) {
        if (j < lo_s[r] || j >= hi_s[r]) continue;
        const int64_t i = first_signal + rb + r;
        for (int h = kv_head * group; h < (kv_head + 1) * group; ++h) {
          const float score =
              ws.scores[ScoreIndex(a, scores_by_row, seq, q0, i, first_signal, h, j)];
          sum += exp2f(score - ws.lse[(q0 + i) * a.num_heads + h]);
        }
      }
      if (sum != 0.0f) atomicAdd(a.attn_sum + k0 + j, sum);
    }
  }
}

template <typename T, int kMaxDim, int kMaxQ>
cudaError_t LaunchMain(const PagedBatchArgs& a, const PagedBatchTiling& t,
                       const PagedBatchWorkspace& ws, bool vectorized, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.num_seqs) * static_cast<unsigned>(a.num_kv_heads),
                  static_cast<unsigned>(t.row_tiles * t.head_tiles),
                  static_cast<unsigned>(t.partitions));
  PagedBatchKernel<T, kMaxDim, kMaxQ><<<grid, kThreads, 0, stream>>>(a, t, ws, vectorized);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchTyped(const PagedBatchArgs& a, const PagedBatchTiling& t,
                        const PagedBatchWorkspace& ws, bool vectorized, cudaStream_t stream) {
  cudaError_t error;
  if (a.head_dim <= 64) {
    error = LaunchMain<T, 64, 16>(a, t, ws, vectorized, stream);
  } else if (a.head_dim <= 128) {
    error = LaunchMain<T, 128, 16>(a, t, ws, vectorized, stream);
  } else {
    error = LaunchMain<T, 256, 8>(a, t, ws, vectorized, stream);
  }
  if (error != cudaSuccess) return error;
  if (t.partitions > 1) {
    const dim3 grid(static_cast<unsigned>(a.num_seqs), static_cast<unsigned>(a.max_query_rows));
    const size_t smem = sizeof(float) * static_cast<size_t>(a.num_heads) * t.partitions;
    MergePartitionsKernel<T><<<grid, 256, smem, stream>>>(a, ws, t.partitions);
    error = cudaGetLastError();
    if (error != cudaSuccess) return error;
  }
  if (WantsAttnSignals(a)) {
    const unsigned blocks = static_cast<unsigned>(a.num_seqs) * a.num_kv_heads;
    AttnSignalKernel<<<blocks, 256, 0, stream>>>(a, ws, t.scores_by_row);
    error = cudaGetLastError();
  }
  return error;
}

}  // namespace

cudaError_t LaunchPagedBatch(const PagedBatchArgs& args, const PagedBatchTiling& tiling,
                             const PagedBatchWorkspace& ws, bool vectorized, cudaStream_t stream) {
  switch (args.dtype) {
    case AttnDtype::kBFloat16:
      return LaunchTyped<__nv_bfloat16>(args, tiling, ws, vectorized, stream);
    case AttnDtype::kFloat16:
      return LaunchTyped<__half>(args, tiling, ws, vectorized, stream);
    case AttnDtype::kFloat32:
      break;
  }
  return LaunchTyped<float>(args, tiling, ws, vectorized, stream);
}

}  // namespace vtoken::cuda::internal
