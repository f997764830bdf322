// QueryMomentsTable: one request's running query statistics (lib/core/token_signal.h's
// QueryMoments) per layer and query head: the count, mean and covariance of the queries before
// RoPE at positions >= kQueryMomentsFirstPosition. LlamaRunner keeps one per request whose inputs
// set RunnerInput::keep_query_moments and the forward paths add each layer's queries to it; a
// signal that reads queries (ExpectedAttention) sees a KV row's query heads through Of().
//
// Chunks merge by Chan et al.'s pairwise update (chunk mean and centred sum of outer products,
// one batched GEMM per layer, then the shift of the means), in fp32: the covariance is never
// formed as E[qq^T] - mean mean^T, which cancels. A decode step's single query has no centred
// sum: it costs the merge alone (d^2 per query head).
// Positions below next_position() are a recomputation (a preempted request's prompt again): they
// are left out, so every query counts once. Beside the moments it keeps the last kQueryWindow
// queries of each head (every position, the sinks' too) in a ring: a window of observed queries.

#pragma once

#include <cstdint>
#include <vector>

#include "lib/core/token_signal.h"

namespace vtoken::model {

class QueryMomentsTable {
 public:
  // `inv_freq`: [head_dim / 2] RoPE angles per position (copied).
  QueryMomentsTable(int64_t layers, int64_t heads, int64_t kv_heads, int64_t head_dim,
                    std::vector<float> inv_freq);

  // Adds layer `layer`'s queries of `rows` batch rows: row r's query head h at
  // q[(r * heads + h) * head_dim], before RoPE, at position positions[r]. Rows at positions
  // below next_position() are left out, and from the moments those below
  // kQueryMomentsFirstPosition.
  void Add(int64_t layer, const float* q, int64_t rows, const int64_t* positions);
  // After every layer of a step: the positions up to `end` (exclusive) are counted.
  void Advance(int64_t end);

  int64_t next_position() const { return next_position_; }
  // The statistics of the query heads that read KV head `kv_head` of `layer` (valid while the
  // table is unchanged).
  QueryMoments Of(int64_t layer, int64_t kv_head) const;

 private:
  int64_t heads_, kv_heads_, dim_;
  std::vector<float> inv_freq_;
  int64_t next_position_ = 0;
  std::vector<int64_t> count_;  // [layers]: every head of a layer counts the same queries.
  std::vector<float> mean_;     // [layers][heads][dim]
  std::vector<float> cov_;      // [layers][heads][dim][dim]
  // The window's ring: query j of (layer, head) at ((layer * heads + head) * kQueryWindow + j) *
  // dim, its position at window_positions_[layer * kQueryWindow + j]; the next query goes to
  // entry window_next_[layer] % kQueryWindow.
  std::vector<float> window_;
  std::vector<int64_t> window_positions_, window_next_;
};

}  // namespace vtoken::model
