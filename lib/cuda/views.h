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

}  // namespace vtoken::cuda
