// Per-token KV hash kernel: one thread hashes one token's rows (all layers, K then V) with the
// XXH64 of xxh64_rows.h. Hashing is a verification path (`check` mode), not a hot path, so the
// simple thread-per-token mapping is enough.
#include "lib/cuda/kernels.h"
#include "lib/cuda/xxh64_rows.h"

namespace vtoken::cuda::internal {
namespace {

constexpr int kThreads = 128;

__global__ void HashTokenRowsKernel(KvLayersView kv, const int64_t* __restrict__ slots,
                                    int64_t num_tokens, uint64_t* __restrict__ hashes) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= num_tokens) return;
  hashes[i] = xxh64::HashTokenRows(kv, slots[i]);
}

}  // namespace

cudaError_t LaunchHashTokenRows(const KvLayersView& kv, const int64_t* slots, int64_t num_tokens,
                                uint64_t* hashes, cudaStream_t stream) {
  const int64_t blocks = (num_tokens + kThreads - 1) / kThreads;
  HashTokenRowsKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(kv, slots, num_tokens,
                                                                              hashes);
  return cudaGetLastError();
}

}  // namespace vtoken::cuda::internal
