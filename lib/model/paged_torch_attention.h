// The torch-ops attention of a paged step over per-(sequence, KV group) key lists: the reference
// path of LlamaModel::ForwardPaged (llama_paged_torch.cc) and the fused CPU path's BLAS path for
// long prefill chunks (llama_paged_cpu.cc).
// A batch is CSR-shaped as LlamaModel::PagedBatch: unit u = s * num_groups + g (sequence s, KV
// group g) owns keys [key_offsets[u], key_offsets[u + 1]), the group's live context then the new
// tokens. Internal to lib/model.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "lib/model/kv_tensors.h"

namespace vtoken::model::internal {

// The CSR arrays of a batch (LlamaModel::PagedBatch), read-only.
struct BatchView {
  int64_t num_groups;
  const int64_t* q_offsets;    // [num_seqs + 1]
  const int64_t* key_offsets;  // [num_seqs * num_groups + 1]
  const int64_t* key_slots;
  const int64_t* key_positions;
};

// The gather index and the additive mask (causal among the new tokens, sliding window) of unit
// u; the mask is undefined when nothing is masked. key_slots / key_positions are b's arrays as
// int64 tensors [num keys] on the model's device (the step's upload): the index is a view of
// key_slots and the mask is built there, so nothing is copied from the host.
using GatherMask = std::pair<torch::Tensor, torch::Tensor>;
GatherMask GatherAndMask(const BatchView& b, int64_t u, int64_t sliding_window,
                         const torch::Tensor& key_slots, const torch::Tensor& key_positions);

// A unit's signal accumulators: views [keys] of the step's fp32 sums, summed over layers in
// place.
struct SignalTensors {
  torch::Tensor attn, norm;
};

// Attention with torch ops: q [n, H, hd] over K/V [num_slots, kv_heads, hd] gathered at `gather`
// (query head h reads KV head h / (H / kv_heads)); returns [n, H * hd] and, when `signals` is
// non-null, adds the signals of the last num_signal queries to it. The queries are causal: row
// i sees no key past keys - n + i (the mask may hide more). They are computed in blocks of
// kAttendQueryRows rows, each over the keys its rows may see.
inline constexpr int64_t kAttendQueryRows = 128;
torch::Tensor AttendTorch(const torch::Tensor& q, const torch::Tensor& k_layer,
                          const torch::Tensor& v_layer, const torch::Tensor& gather,
                          const torch::Tensor& mask, int64_t kv_heads, torch::Dtype dtype,
                          int64_t num_signal, SignalTensors* signals);

// Signal accumulators for every unit of the sequences `seqs` that want signals (null entries
// otherwise, and all null when `sums` is undefined), indexed by unit: views of sums
// [2, num keys] fp32 (attention mass, key norms, indexed like b.key_slots).
std::vector<std::unique_ptr<SignalTensors>> SignalAccumulators(const std::vector<int64_t>& seqs,
                                                               const BatchView& b,
                                                               const uint8_t* want,
                                                               const torch::Tensor& sums,
                                                               int64_t num_seqs);

// Sequence s's attention in layer `layer`: q [n, H, hd] over the K/V of the groups its KV heads
// read (gather_mask and signals indexed by unit); returns [n, H * hd]. At token and layer
// granularity every KV head of a layer reads one group: one AttendTorch; at head granularity one
// per KV head.
torch::Tensor AttendSeqLayer(const torch::Tensor& q, KvTensors& kv, int64_t layer, int64_t s,
                             int64_t num_groups, const std::vector<GatherMask>& gather_mask,
                             const std::vector<std::unique_ptr<SignalTensors>>& signals,
                             torch::Dtype dtype, int64_t num_signal);

}  // namespace vtoken::model::internal
