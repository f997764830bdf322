// Batched paged attention, one call per layer: every sequence of a step (decode rows and prefill
// chunks alike) attends to its KV groups' live keys through CSR slot lists, with the eviction
// signals of lib/model's CpuPagedAttention in the same pass. q, K/V and out are fp32, bf16 or fp16
// (one dtype); scores, softmax and accumulators are fp32; signals are fp32. See PagedBatchArgs
// (views.h) for the batch's layout and meaning.
//
// Kernel design (paged_batch_attention.cu):
//  - One CTA per (sequence, KV head, query tile, key partition). A query tile is up to 16 query
//    vectors (8 at head_dim > 128): all the query heads of the KV head times as many of the
//    sequence's rows as fit, so each K and V row is loaded once for all of them (GQA sharing;
//    a decode row with 8 query heads per KV head is one tile).
//  - Keys stream through shared memory 16 at a time with 16-byte loads (scalar loads when a row
//    is not 16-byte aligned or head_dim is not a multiple of the vector width); online softmax.
//  - Split-K: when the batch alone gives too few CTAs to fill the GPU, each key range is cut into
//    PagedBatchPartitions(args) partitions whose partial (max, sum, accumulator) states a merge
//    kernel combines.
//  - Signals without re-reading K: the main pass writes the raw scores of the signal rows to the
//    workspace and computes each key's |K| from the row it has already loaded (only keys no query
//    row of the last tile sees, those left of a sliding window, are loaded just for their norm);
//    a light kernel then turns the scores into probabilities with the final log-sum-exp and adds
//    them to attn_sum. Both sums are accumulated with fp32 atomics (order not deterministic).
//
// Thread safety: the functions are stateless; calls on one stream run in order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "lib/core/status.h"
#include "lib/cuda/device.h"
#include "lib/cuda/views.h"

namespace vtoken::cuda {

// Returns InvalidArgument (naming the field) unless: a known dtype; num_seqs in [0, 2^20];
// num_heads in [1, 256] a multiple of num_kv_heads >= 1; head_dim in [1, 256]; num_slots > 0;
// slot_stride >= head_dim and kv_head_stride >= 0 with KV head num_kv_heads - 1 inside the slot;
// groups_per_seq >= 1; norm_heads >= 1; sliding_window >= 0; num_rows, num_keys >= 0;
// max_query_rows in [1, 65535] and max_keys >= 1 when num_seqs > 0; max_signal_rows >= 1 when
// want_signals and attn_sum are set; q, k_cache, v_cache, out, q_offsets, key_offsets and slots
// non-null; key_positions non-null with a sliding window (without one the kernels never read
// it); num_signal non-null when want_signals is. Contents are the caller's
// contract (the reference checks them).
Status ValidatePagedBatchArgs(const PagedBatchArgs& args);

// Key partitions per range (split-K) the kernel uses for `args`: 1 when the sequences x KV heads x
// query tiles already make ~2 CTAs per SM of a 132-SM GPU or max_keys < 512, else enough to get
// there, at most 32 and at least 256 keys each. A pure function of the host fields.
int32_t PagedBatchPartitions(const PagedBatchArgs& args);

// Device workspace bytes a call with `args` needs (0 when neither split-K nor signals are used):
// the partial states when PagedBatchPartitions(args) > 1, and with attention signals the
// log-sum-exps and min(num_rows, num_seqs * max_signal_rows) * num_heads * max_keys fp32 scores
// (a decode batch of 64 sequences, 32 heads and 32k keys: 268 MB, reused by every layer).
size_t PagedBatchWorkspaceBytes(const PagedBatchArgs& args);

// Enqueues the attention and signals on `stream`; every pointer in `args` and `workspace` is
// device memory, `workspace` holds PagedBatchWorkspaceBytes(args) bytes, 4-byte aligned. Returns
// ValidatePagedBatchArgs's errors, InvalidArgument for a small or null workspace or more than
// 65535 query tiles (max_query_rows / (16 / query heads per KV head), at least 1 row per tile),
// Internal when a launch fails.
Status PagedBatchAttention(const PagedBatchArgs& args, void* workspace, size_t workspace_bytes,
                           Stream stream);

// CPU reference in double precision (CpuPagedAttention's algorithm); every pointer in `args` is
// host memory, bf16 / fp16 as their raw 16-bit patterns. Also checks the contents: InvalidArgument
// for offsets that do not start at 0 or end at num_rows / num_keys; a sequence without query rows
// (q_offsets not increasing); a key range shorter than its sequence's query rows (so key_offsets
// increase); a slot or head_group out of range; key positions decreasing within a range (with a
// window); a max_* bound exceeded by a sequence not skipped.
Status PagedBatchAttentionReference(const PagedBatchArgs& args);

// Host conversions of one bf16 / fp16 value (raw bits), round to nearest even; for kFloat32 the
// functions are not defined (REQUIRES dtype != kFloat32).
float HalfBitsToFloat(uint16_t bits, AttnDtype dtype);
uint16_t FloatToHalfBits(float value, AttnDtype dtype);

}  // namespace vtoken::cuda
