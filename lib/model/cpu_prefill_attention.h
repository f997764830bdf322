// CpuPrefillAttention: the attention of one sequence of a CpuAttentionBatch (cpu_paged_attention.h)
// whose query rows are a long prefill chunk, on the fused step's pool, its scores and weighted
// sums as sgemm calls (cpu_blas_gemm.h): the GEMM-shaped part a BLAS kernel does best, the mask
// and softmax in vector loops here. The fused CPU step runs it for chunks of at least
// kBlasAttentionMinQueries rows (llama_ops.h), where CpuPagedAttention's row-by-row loop is slower.
//
// The contract is CpuPagedAttention's for that sequence: causal, the sliding window by position,
// the attn and key-norm signals added to attn_sum / norm_sum. Its sums run in another order, so
// its bits differ from CpuPagedAttention's by float rounding (cpu_prefill_attention_test).
//
// Work: each KV head's K and V rows gathered into contiguous [keys, head_dim] blocks; then units
// of (KV head, a pair of query blocks of kPrefillQueryRows rows: block b and its mirror, so that
// every unit has about the same causal work and contiguous shares balance); a unit, per query
// head of the group: scores = q K^T * scale (one sgemm), a masked softmax per row, out = p V (one
// sgemm). Attention signals go into one partial sum per (query block, KV head), added in block
// order afterwards: the thread count changes no bit, nor does AVX2 against AVX-512 (the sums run
// in Lanes16's order, cpu_simd.h).
#pragma once

#include <cstdint>

#include "lib/model/cpu_paged_attention.h"
#include "lib/model/cpu_pool.h"

namespace vtoken::model {

inline constexpr int64_t kPrefillQueryRows = 64;

// REQUIRES: PoolSgemmAvailable() and the caller holds OneBlasThread (cpu_blas_gemm.h);
// CpuPagedAttention's requirements for sequence s.
void CpuPrefillAttention(const CpuAttentionBatch& batch, int64_t s, CpuPool& pool);

}  // namespace vtoken::model
