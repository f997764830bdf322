// Internal to lib/cuda: the raw kernel launchers implemented in the .cu files. They launch and
// return the launch's error code; argument validation and Status conversion happen in the public
// .cc wrappers (relocate.cc, kv_hash.cc, paged_attention.cc).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "lib/cuda/views.h"

namespace vtoken::cuda::internal {

// Largest head_dim the attention kernels support (registers hold head_dim / 32 per lane).
inline constexpr int32_t kMaxHeadDim = 256;

// kv: device view; copies: device [num_copies]. REQUIRES num_copies > 0.
cudaError_t LaunchRelocate(const KvLayersView& kv, const SlotPair* copies, int64_t num_copies,
                           cudaStream_t stream);

// kv: device view; slots, hashes: device [num_tokens]. REQUIRES num_tokens > 0.
cudaError_t LaunchHashTokenRows(const KvLayersView& kv, const int64_t* slots, int64_t num_tokens,
                                uint64_t* hashes, cudaStream_t stream);

// One thread spinning for `microseconds` on `stream` (spin.cu). REQUIRES microseconds >= 0.
cudaError_t LaunchSpin(int64_t microseconds, cudaStream_t stream);

// args: device pointers, validated. REQUIRES num_seqs > 0.
cudaError_t LaunchPagedDecode(const PagedDecodeArgs& args, cudaStream_t stream);

}  // namespace vtoken::cuda::internal
