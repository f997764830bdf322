// Internal to lib/cuda: the tiling, workspace layout and launcher of the batched paged attention
// (paged_batch_attention.{cc,cu}). Host-side inline functions, shared by the .cc (validation,
// workspace size) and the .cu (launch), so both agree on the grid and the workspace.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "lib/cuda/views.h"

namespace vtoken::cuda::internal {

inline constexpr int32_t kBatchMaxHeadDim = 256;
inline constexpr int32_t kBatchMaxHeads = 256;
// Split-K policy: aim for ~2 CTAs per SM of a 132-SM H100 / H200 (A100 has 108), partitions of
// at least kMinPartitionKeys keys, at most kMaxPartitions of them (the merge kernel keeps one
// weight per (head, partition) in shared memory).
inline constexpr int64_t kTargetCtas = 264;
inline constexpr int64_t kMinPartitionKeys = 256;
inline constexpr int32_t kMaxPartitions = 32;

// How the grid covers a batch: blockIdx.x = (sequence, KV head), blockIdx.y = (query row tile,
// query head tile), blockIdx.z = key partition.
struct PagedBatchTiling {
  int32_t max_query_vectors = 16;  // Query vectors (row x head) per CTA: 16, or 8 past dim 128.
  int32_t heads_per_tile = 1;      // Query heads of one KV head in a CTA.
  int32_t head_tiles = 1;
  int32_t rows_per_tile = 1;  // Query rows of one sequence in a CTA.
  int64_t row_tiles = 1;
  int32_t partitions = 1;
  // Signal scores indexed by batch row ([num_rows, ...]) rather than by (sequence, signal row)
  // ([num_seqs * max_signal_rows, ...]): whichever is smaller.
  bool scores_by_row = false;
};

// REQUIRES: args valid (ValidatePagedBatchArgs).
inline PagedBatchTiling TilingOf(const PagedBatchArgs& a) {
  PagedBatchTiling t;
  t.max_query_vectors = a.head_dim > 128 ? 8 : 16;
  const int32_t group = a.num_heads / a.num_kv_heads;
  t.heads_per_tile = std::min(group, t.max_query_vectors);
  t.head_tiles = (group + t.heads_per_tile - 1) / t.heads_per_tile;
  t.rows_per_tile = std::max(1, t.max_query_vectors / t.heads_per_tile);
  t.row_tiles = std::max<int64_t>(1, (a.max_query_rows + t.rows_per_tile - 1) / t.rows_per_tile);
  const int64_t base_ctas =
      static_cast<int64_t>(a.num_seqs) * a.num_kv_heads * t.head_tiles * t.row_tiles;
  if (a.max_keys >= 2 * kMinPartitionKeys && base_ctas < kTargetCtas) {
    const int64_t wanted = (kTargetCtas + base_ctas - 1) / std::max<int64_t>(base_ctas, 1);
    t.partitions = static_cast<int32_t>(
        std::min<int64_t>({wanted, kMaxPartitions, a.max_keys / kMinPartitionKeys}));
  }
  t.scores_by_row = a.num_rows < static_cast<int64_t>(a.num_seqs) * a.max_signal_rows;
  return t;
}

// Whether a call computes attention-mass signals (and so needs scores and log-sum-exps).
inline bool WantsAttnSignals(const PagedBatchArgs& a) {
  return a.want_signals != nullptr && a.attn_sum != nullptr;
}

// The device workspace, carved from the caller's buffer. Log-sum-exps are in base 2 (the kernels
// work with log2(e)-scaled scores).
struct PagedBatchWorkspace {
  float* part_max = nullptr;  // [partitions, num_rows, num_heads] when partitions > 1
  float* part_sum = nullptr;  // [partitions, num_rows, num_heads] when partitions > 1
  float* part_acc = nullptr;  // [partitions, num_rows, num_heads, head_dim] when partitions > 1
  float* lse = nullptr;       // [num_rows, num_heads] with attention signals
  float* scores = nullptr;    // With signals: [score rows, num_heads, max_keys], score rows =
                              // num_rows or num_seqs * max_signal_rows (scores_by_row)
};

// The workspace's layout over `base` (null: offsets from 0); returns the bytes it spans.
inline size_t CarveWorkspace(const PagedBatchArgs& a, const PagedBatchTiling& t, void* base,
                             PagedBatchWorkspace* ws) {
  size_t offset = 0;
  auto take = [&](int64_t floats) {
    float* p =
        base == nullptr ? nullptr : reinterpret_cast<float*>(static_cast<char*>(base) + offset);
    offset += (static_cast<size_t>(floats) * sizeof(float) + 255) / 256 * 256;
    return p;
  };
  const int64_t states = static_cast<int64_t>(t.partitions) * a.num_rows * a.num_heads;
  if (t.partitions > 1) {
    ws->part_max = take(states);
    ws->part_sum = take(states);
    ws->part_acc = take(states * a.head_dim);
  }
  if (WantsAttnSignals(a)) {
    ws->lse = take(a.num_rows * a.num_heads);
    const int64_t score_rows =
        t.scores_by_row ? a.num_rows : static_cast<int64_t>(a.num_seqs) * a.max_signal_rows;
    ws->scores = take(score_rows * a.num_heads * a.max_keys);
  }
  return offset;
}

// args, ws: device pointers, validated; vectorized: K/V rows may be read with 16-byte loads.
// REQUIRES num_seqs > 0.
cudaError_t LaunchPagedBatch(const PagedBatchArgs& args, const PagedBatchTiling& tiling,
                             const PagedBatchWorkspace& ws, bool vectorized, cudaStream_t stream);

}  // namespace vtoken::cuda::internal
