// Paged decode attention over live-slot lists, one layer per call: each sequence's single query
// attends to its live tokens, read through a CSR list of slots in logical order (what vToken
// keeps unchanged: relocation changes the slots, never the order or the result). Softmax is
// computed online (running max and sum), so long contexts do not overflow. fp32 only.
//
// See PagedDecodeArgs (views.h) for the tensors and their shapes.
#pragma once

#include "lib/core/status.h"
#include "lib/cuda/device.h"
#include "lib/cuda/views.h"

namespace vtoken::cuda {

// Returns InvalidArgument (naming the field) unless: num_seqs in [0, 65535]; num_heads and
// num_kv_heads positive with num_heads % num_kv_heads == 0; head_dim in [1, 256]; num_slots > 0;
// num_tokens >= 0; q, k, v, seq_offsets, out non-null (slots too when num_tokens > 0);
// token_mass only with lse. Contents (offsets, slot ranges) are the caller's contract.
Status ValidatePagedDecodeArgs(const PagedDecodeArgs& args);

// Enqueues the attention (and, when requested, lse and token_mass) on `stream`; every pointer in
// `args` is device memory. A sequence with no live token gets out = 0 and lse = -inf.
// Returns ValidatePagedDecodeArgs's errors, or Internal when a launch fails.
Status PagedDecodeAttention(const PagedDecodeArgs& args, Stream stream);

// CPU reference (two-pass softmax in double precision); every pointer in `args` is host memory.
// Also checks the contents: InvalidArgument for decreasing offsets, seq_offsets[num_seqs] !=
// num_tokens, or a slot out of range.
Status PagedDecodeAttentionReference(const PagedDecodeArgs& args);

}  // namespace vtoken::cuda
