// CpuPagedAttention: one layer's attention for a whole batch in one call, reading K and V where
// they lie in the paged store through per-sequence slot lists (no gather copy, no BLAS), in fp32
// over an fp32 or fp16 cache (CpuKvElement), with the eviction signals accumulated in the same
// pass. It is what LlamaModel::ForwardPaged
// runs on the CPU in fp32; the torch ops it replaces stay as the reference in tests.
//
// The batch is CSR-shaped: sequence s owns query rows [q_offsets[s], q_offsets[s+1]) (its new
// tokens). Its keys are per KV group (lib/core/types.h): with G = groups_per_seq, KV head h of
// this layer reads key range u = s * G + head_group[h], that is [key_offsets[u],
// key_offsets[u+1]) of `slots` / `key_positions` (the group's live context in logical order, then
// the new tokens). At token granularity G = 1 and every head reads range s. New token i of a
// sequence sees the context and new tokens 0..i (causal); with a sliding window W > 0, only keys
// whose position p satisfies query_position - p < W (Mistral's rule, by RoPE position, so it holds
// after evictions too). Query head q reads KV head q / (num_heads / num_kv_heads); each K and V
// row is loaded once per query row for all the query heads that read it. KV head h of slot `slot`
// starts at cache + slot * slot_stride + h * kv_head_stride.
//
// Signals (when attn_sum / norm_sum are non-null and want_signals[s] has the kAttnSignal /
// kKeyNormSignal bit of lib/core/policy.h; the key norms are a second pass over the K rows, so a
// policy that reads no norm saves it): attn_sum[key] += the
// attention probability the key received, summed over the query heads reading it and the last
// num_signal[s] query rows; norm_sum[key] += the L2 norm of its K row / norm_heads. The caller
// divides by layers (and heads x signal rows) after the last layer.
//
// Split over keys: each key range is cut into chunks of kCpuAttentionChunkKeys keys. A chunk (one
// unit of work, for all the KV heads that read the range, so that the rows of a slot, adjacent in
// memory, are read together and not once per head) computes, per query row and head, its largest
// score m, l = sum exp(score - m) and acc = sum exp(score - m) v; a second pass per sequence
// combines the chunks (out = sum w acc / sum w l, w = exp(m - the largest m)) and adds the signals.
// The chunks of one sequence can run on different threads, so a batch of one long sequence uses
// every thread. The chunking depends on the keys only, never on the thread count: any split of the
// work gives the same bits.
//
// Vectorized for x86-64-v4 (AVX-512) / v3 (AVX2 + FMA) / baseline x86-64 by function
// multiversioning (the CPU picks at load time).
#pragma once

#include <algorithm>
#include <cstdint>

namespace vtoken::model {

class CpuPool;

inline constexpr int64_t kCpuAttentionChunkKeys = 128;

// The element type of the K and V caches the kernels read: fp32, or IEEE binary16 (half the
// bytes per token; the rows are widened to fp32 exactly as they are loaded, and all arithmetic
// stays fp32, so an fp16 cache gives the bits of an fp32 cache holding the same values).
enum class CpuKvElement : uint8_t { kFloat32, kFloat16 };

struct CpuAttentionBatch {
  int64_t num_seqs = 0;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  float scale = 1;
  int64_t sliding_window = 0;     // 0: full causal attention.
  const float* q = nullptr;       // [num query rows, num_heads, head_dim]
  const void* k_cache = nullptr;  // [num_slots, slot_stride] of kv_element
  const void* v_cache = nullptr;  // [num_slots, slot_stride] of kv_element
  CpuKvElement kv_element = CpuKvElement::kFloat32;
  int64_t slot_stride = 0;               // Elements per slot: num_kv_heads * head_dim, or head_dim.
  int64_t kv_head_stride = 0;            // Elements between KV heads in a slot: head_dim, or 0.
  float* out = nullptr;                  // [num query rows, num_heads, head_dim]
  const int64_t* q_offsets = nullptr;    // [num_seqs + 1]
  int64_t groups_per_seq = 1;            // G: key ranges per sequence.
  const int64_t* head_group = nullptr;   // [num_kv_heads]: the range each KV head reads; null: 0.
  const int64_t* key_offsets = nullptr;  // [num_seqs * G + 1]
  const int64_t* slots = nullptr;        // [key_offsets[num_seqs * G]]: context, then new tokens
  const int64_t* key_positions = nullptr;  // Same shape: RoPE positions; read (and required)
                                           // only with a sliding window.
  const int64_t* num_signal = nullptr;     // [num_seqs]: signal query rows (the last ones).
  const uint8_t* want_signals = nullptr;   // [num_seqs]: signal bits (kAttnSignal | ...)
  float* attn_sum = nullptr;               // [key_offsets[num_seqs * G]] or null
  float* norm_sum = nullptr;               // [key_offsets[num_seqs * G]] or null
  int64_t norm_heads = 1;                  // KV heads of this layer that share a key range.
  const uint8_t* skip = nullptr;           // [num_seqs] or null: sequences left to the caller.
};

// REQUIRES: every slot < the cache's num_slots; every key range of sequence s holds at least
// q_offsets[s+1] - q_offsets[s] >= 1 keys, the new tokens last; num_heads a multiple of
// num_kv_heads.
//
// Sequences [seq_begin, seq_end) on the calling thread. Calls on disjoint ranges write disjoint
// outputs and may run in parallel.
void CpuPagedAttention(const CpuAttentionBatch& batch, int64_t seq_begin, int64_t seq_end);

// The whole batch on `pool`'s threads, chunk by chunk (two pool calls; one when no range has more
// than one chunk). The same bits as the call above over [0, num_seqs).
void CpuPagedAttention(const CpuAttentionBatch& batch, CpuPool& pool);

// The units of work the call above spreads over its threads: one per chunk of each (sequence,
// key range) with all the KV heads that read it, skipped sequences excluded.
int64_t CpuAttentionUnits(const CpuAttentionBatch& batch);

// Writes n fp32 values into a cache of `element` from element `at` on: a copy, or each rounded to
// the nearest binary16, ties to even (as torch's `.to(torch::kHalf)` rounds).
void CpuStoreKvRow(CpuKvElement element, const float* from, int64_t n, void* cache, int64_t at);

// The reverse: y[0..n) = the n elements of a cache of `element` from element `at` on, as fp32 (a
// copy, or each binary16 widened exactly).
void CpuLoadKvRow(CpuKvElement element, const void* cache, int64_t at, int64_t n, float* y);

namespace internal {

// The CPU attention kernels' shared reading of a batch (cpu_paged_attention.cc,
// cpu_prefill_attention.cc).
struct KeyRange {
  int64_t k0, keys;
};

// The key range KV head g of sequence s reads.
inline KeyRange RangeOf(const CpuAttentionBatch& b, int64_t s, int64_t g) {
  const int64_t u = s * b.groups_per_seq + (b.head_group != nullptr ? b.head_group[g] : 0);
  return {b.key_offsets[u], b.key_offsets[u + 1] - b.key_offsets[u]};
}

// Query row i of a range with ctx context keys sees keys [WindowStart, ctx + i + 1).
inline int64_t WindowStart(const CpuAttentionBatch& b, const int64_t* kpos, int64_t ctx,
                           int64_t i) {
  if (b.sliding_window <= 0) return 0;
  // Keys increase in position: the first one inside the window.
  return std::upper_bound(kpos, kpos + ctx + i + 1, kpos[ctx + i] - b.sliding_window) - kpos;
}

}  // namespace internal

}  // namespace vtoken::model
