// Kernel-facing views: small, non-owning, trivially copyable structs that kernels take by value
// (FlashInfer's paged_kv_t style). They carry raw pointers only, so the same struct describes
// device memory (for the launchers) or host memory (for the CPU references); which one is the
// caller's contract, stated by each function taking a view.
//
// This header is included by nvcc-compiled .cu files: C++17, no project or CUDA headers.
#pragma once

#include <cstdint>

namespace vtoken::cuda {

// The paged KV cache of a model: per layer one K and one V array, each contiguous
// [num_slots, num_kv_heads, head_dim] of any dtype, so a token's row in one layer is
// `bytes_per_row` bytes at `base + slot * bytes_per_row`.
struct KvLayersView {
  void* const* k_layers = nullptr;  // [num_layers] pointers to [num_slots, num_kv_heads, head_dim]
  void* const* v_layers = nullptr;  // [num_layers] pointers to [num_slots, num_kv_heads, head_dim]
  int32_t num_layers = 0;
  int64_t num_slots = 0;
  int64_t bytes_per_row = 0;  // num_kv_heads * head_dim * sizeof(dtype)
};

// One relocated row: slot `src` is copied to slot `dst` in every layer, K and V. Same layout as
// vtoken::SlotCopy (lib/core/types.h), so a copy list uploads without conversion.
struct SlotPair {
  int64_t src = 0;
  int64_t dst = 0;
};

// One layer's paged decode attention over per-sequence live-slot lists in CSR form: sequence s
// attends to the slots slots[seq_offsets[s] .. seq_offsets[s+1]) in that (logical) order.
// Query head h reads KV head h / (num_heads / num_kv_heads) (GQA).
struct PagedDecodeArgs {
  const float* q = nullptr;              // [num_seqs, num_heads, head_dim]
  const float* k = nullptr;              // [num_slots, num_kv_heads, head_dim]
  const float* v = nullptr;              // [num_slots, num_kv_heads, head_dim]
  const int64_t* seq_offsets = nullptr;  // [num_seqs + 1], nondecreasing, [0] = 0
  const int64_t* slots = nullptr;        // [num_tokens], each in [0, num_slots)
  float* out = nullptr;                  // [num_seqs, num_heads, head_dim]
  // Optional outputs (nullptr = not computed):
  float* lse = nullptr;         // [num_seqs, num_heads]: log(sum_t exp(scale * q.k_t))
  float* token_mass = nullptr;  // [num_tokens]: softmax weight of each token averaged over heads
                                // (the policies' attention signal); REQUIRES lse != nullptr
  int32_t num_seqs = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int64_t num_slots = 0;
  int64_t num_tokens = 0;  // == seq_offsets[num_seqs]
  float scale = 1.0f;      // Usually 1 / sqrt(head_dim).
};

// The element type of a PagedBatchArgs' q, K/V cache and out (all the same).
enum class AttnDtype : int32_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

// One layer's attention for a whole batch, CSR-shaped (the GPU counterpart of lib/model's
// CpuAttentionBatch, same meaning field for field). Sequence s owns query rows [q_offsets[s],
// q_offsets[s+1]) (its new tokens). KV head h reads key range u = s * groups_per_seq +
// head_group[h] ([key_offsets[u], key_offsets[u+1]) of slots / key_positions: the group's live
// context in logical order, then the sequence's new tokens). New token i sees the context and new
// tokens 0..i (causal); with sliding_window W > 0 only keys at RoPE position p with
// query_position - p < W. Query head q reads KV head q / (num_heads / num_kv_heads). KV head h of
// slot `slot` starts at element slot * slot_stride + h * kv_head_stride of the cache.
// Signals (attn_sum / norm_sum non-null, want_signals[s] != 0: both signals, whatever bits are
// set; lib/model's CPU kernel reads the bits, but here the norms come from K rows already
// loaded, so skipping them saves nothing): attn_sum[key] += the probability
// the key received summed over its query heads and the last num_signal[s] (clamped to [1, n])
// query rows; norm_sum[key] += |K row| / norm_heads, per KV head reading the key. Both accumulate
// (+=) across calls, in fp32, whatever the dtype. Sequences with skip[s] != 0 are not touched.
struct PagedBatchArgs {
  AttnDtype dtype = AttnDtype::kFloat32;
  const void* q = nullptr;                 // [num_rows, num_heads, head_dim]
  const void* k_cache = nullptr;           // [num_slots, slot_stride]
  const void* v_cache = nullptr;           // [num_slots, slot_stride]
  void* out = nullptr;                     // [num_rows, num_heads, head_dim]
  const int64_t* q_offsets = nullptr;      // [num_seqs + 1], [0] = 0, [num_seqs] = num_rows
  const int64_t* head_group = nullptr;     // [num_kv_heads] in [0, groups_per_seq); null: all 0
  const int64_t* key_offsets = nullptr;    // [num_seqs * groups_per_seq + 1], [0] = 0
  const int64_t* slots = nullptr;          // [num_keys], each in [0, num_slots)
  const int64_t* key_positions = nullptr;  // [num_keys], nondecreasing per range; read (and
                                           // required) only with a sliding window
  const int64_t* num_signal = nullptr;     // [num_seqs]: signal query rows (the last ones)
  const uint8_t* want_signals = nullptr;   // [num_seqs] or null (no signals)
  float* attn_sum = nullptr;               // [num_keys] or null
  float* norm_sum = nullptr;               // [num_keys] or null
  const uint8_t* skip = nullptr;           // [num_seqs] or null: sequences left to the caller
  int32_t num_seqs = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int64_t num_rows = 0;        // Query rows of the batch: q_offsets[num_seqs].
  int64_t num_keys = 0;        // key_offsets[num_seqs * groups_per_seq].
  int64_t num_slots = 0;       // Slots of the cache.
  int64_t slot_stride = 0;     // Elements per slot: num_kv_heads * head_dim, or head_dim.
  int64_t kv_head_stride = 0;  // Elements between KV heads in a slot: head_dim, or 0.
  int64_t groups_per_seq = 1;  // G: key ranges per sequence.
  int64_t norm_heads = 1;      // KV heads of this layer that share a key range.
  int64_t sliding_window = 0;  // 0: full causal attention.
  // Host bounds over the sequences not skipped (they size the grid and the workspace):
  int64_t max_query_rows = 0;   // >= every sequence's query rows.
  int64_t max_keys = 0;         // >= every key range's length.
  int64_t max_signal_rows = 0;  // >= every signal sequence's signal rows; 0 without signals.
  float scale = 1.0f;           // Usually 1 / sqrt(head_dim).
};

}  // namespace vtoken::cuda
