// Paged decode attention over live-slot lists. One thread block per (head, seq); its warps split
// the sequence's tokens round-robin, each keeping an online-softmax state (running max m, sum l,
// and a head_dim accumulator spread over the lanes), and the warps' states are merged at the end.
// The optional per-token mass is a second kernel that recomputes each token's scores against the
// final log-sum-exp, which keeps the first kernel free of per-token writes and atomics.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "lib/cuda/kernels.h"

namespace vtoken::cuda::internal {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

__device__ __forceinline__ float WarpSum(float value) {
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// kDimsPerLane = ceil(head_dim / 32) rounded up to a power of two, so the accumulator lives in
// registers.
template <int kDimsPerLane>
__global__ void __launch_bounds__(kThreads) PagedDecodeKernel(PagedDecodeArgs a) {
  const int head = blockIdx.x;
  const int seq = blockIdx.y;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int dim = a.head_dim;
  extern __shared__ float smem[];
  float* q_s = smem;                  // [head_dim], pre-scaled
  float* acc_s = q_s + dim;           // [kWarps, head_dim]
  float* m_s = acc_s + kWarps * dim;  // [kWarps]
  float* l_s = m_s + kWarps;          // [kWarps]

  const float* q = a.q + (static_cast<int64_t>(seq) * a.num_heads + head) * dim;
  for (int d = threadIdx.x; d < dim; d += kThreads) q_s[d] = q[d] * a.scale;
  __syncthreads();

  const int kv_head = head / (a.num_heads / a.num_kv_heads);
  const int64_t begin = a.seq_offsets[seq];
  const int64_t end = a.seq_offsets[seq + 1];
  float m = -INFINITY;
  float l = 0.0f;
  float acc[kDimsPerLane];
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) acc[i] = 0.0f;

  for (int64_t t = begin + warp; t < end; t += kWarps) {
    const int64_t row = (a.slots[t] * a.num_kv_heads + kv_head) * dim;
    const float* k = a.k + row;
    const float* v = a.v + row;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < dim) dot += q_s[d] * k[d];
    }
    dot = WarpSum(dot);
    const float m_new = fmaxf(m, dot);
    const float correction = expf(m - m_new);  // 0 on the warp's first token (m = -inf).
    const float p = expf(dot - m_new);
    l = l * correction + p;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < dim) acc[i] = acc[i] * correction + p * v[d];
    }
    m = m_new;
  }

#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < dim) acc_s[warp * dim + d] = acc[i];
  }
  if (lane == 0) {
    m_s[warp] = m;
    l_s[warp] = l;
  }
  __syncthreads();

  // Warps that saw no token have l = 0 and are skipped (their m is -inf).
  float m_all = -INFINITY;
  for (int w = 0; w < kWarps; ++w) {
    if (l_s[w] > 0.0f) m_all = fmaxf(m_all, m_s[w]);
  }
  float l_all = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    if (l_s[w] > 0.0f) l_all += l_s[w] * expf(m_s[w] - m_all);
  }
  float* out = a.out + (static_cast<int64_t>(seq) * a.num_heads + head) * dim;
  for (int d = threadIdx.x; d < dim; d += kThreads) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (l_s[w] > 0.0f) sum += acc_s[w * dim + d] * expf(m_s[w] - m_all);
    }
    out[d] = l_all > 0.0f ? sum / l_all : 0.0f;
  }
  if (a.lse != nullptr && threadIdx.x == 0) {
    a.lse[static_cast<int64_t>(seq) * a.num_heads + head] =
        l_all > 0.0f ? m_all + logf(l_all) : -INFINITY;
  }
}

// One warp per token: mass = mean over heads of exp(score - lse).
__global__ void __launch_bounds__(256) TokenMassKernel(PagedDecodeArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const int group = a.num_heads / a.num_kv_heads;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
       t < a.num_tokens; t += warps) {
    // The sequence owning t: the largest s with seq_offsets[s] <= t (skips empty sequences).
    int lo = 0;
    int hi = a.num_seqs - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (a.seq_offsets[mid] <= t) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const int seq = lo;
    const int64_t slot = a.slots[t];
    float mass = 0.0f;
    for (int h = 0; h < a.num_heads; ++h) {
      const float* q = a.q + (static_cast<int64_t>(seq) * a.num_heads + h) * a.head_dim;
      const float* k = a.k + (slot * a.num_kv_heads + h / group) * a.head_dim;
      float dot = 0.0f;
      for (int d = lane; d < a.head_dim; d += 32) dot += q[d] * a.scale * k[d];
      dot = WarpSum(dot);
      mass += expf(dot - a.lse[static_cast<int64_t>(seq) * a.num_heads + h]);
    }
    if (lane == 0) a.token_mass[t] = mass / static_cast<float>(a.num_heads);
  }
}

template <int kDimsPerLane>
cudaError_t LaunchDecode(const PagedDecodeArgs& args, cudaStream_t stream) {
  const size_t smem =
      sizeof(float) * (static_cast<size_t>(args.head_dim) * (1 + kWarps) + 2 * kWarps);
  const dim3 grid(static_cast<unsigned>(args.num_heads), static_cast<unsigned>(args.num_seqs));
  PagedDecodeKernel<kDimsPerLane><<<grid, kThreads, smem, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchPagedDecode(const PagedDecodeArgs& args, cudaStream_t stream) {
  cudaError_t error;
  if (args.head_dim <= 32) {
    error = LaunchDecode<1>(args, stream);
  } else if (args.head_dim <= 64) {
    error = LaunchDecode<2>(args, stream);
  } else if (args.head_dim <= 128) {
    error = LaunchDecode<4>(args, stream);
  } else {
    error = LaunchDecode<8>(args, stream);
  }
  if (error != cudaSuccess || args.token_mass == nullptr || args.num_tokens == 0) return error;
  constexpr int kMassThreads = 256;
  const int64_t blocks = std::min<int64_t>((args.num_tokens + 7) / 8, 8192);
  TokenMassKernel<<<static_cast<unsigned>(blocks), kMassThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace vtoken::cuda::internal
