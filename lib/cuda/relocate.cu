// Relocation kernel: one warp copies one (copy, layer, K|V) row; 16-byte vector copies when both
// row addresses and the row size allow, else 4-byte, else byte copies.
#include <algorithm>
#include <cstdint>

#include "lib/cuda/kernels.h"

namespace vtoken::cuda::internal {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;

template <typename Word>
__device__ __forceinline__ void CopyRow(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst,
                                        int64_t bytes, int lane) {
  const Word* s = reinterpret_cast<const Word*>(src);
  Word* d = reinterpret_cast<Word*>(dst);
  const int64_t words = bytes / static_cast<int64_t>(sizeof(Word));
  for (int64_t i = lane; i < words; i += 32) d[i] = s[i];
}

__global__ void RelocateKernel(KvLayersView kv, const SlotPair* __restrict__ copies,
                               int64_t num_copies) {
  const int lane = threadIdx.x % 32;
  const int64_t rows = num_copies * kv.num_layers * 2;
  const int64_t warp_stride = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  // Rows are ordered copy-major so neighbouring warps read neighbouring copy-list entries.
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
       row < rows; row += warp_stride) {
    const int64_t copy = row / (2 * kv.num_layers);
    const int32_t rest = static_cast<int32_t>(row - copy * 2 * kv.num_layers);
    const int32_t layer = rest >> 1;
    void* const* layers = (rest & 1) ? kv.v_layers : kv.k_layers;
    uint8_t* base = static_cast<uint8_t*>(layers[layer]);
    const SlotPair pair = copies[copy];
    const uint8_t* src = base + pair.src * kv.bytes_per_row;
    uint8_t* dst = base + pair.dst * kv.bytes_per_row;
    const uintptr_t alignment = reinterpret_cast<uintptr_t>(src) |
                                reinterpret_cast<uintptr_t>(dst) |
                                static_cast<uintptr_t>(kv.bytes_per_row);
    if (alignment % 16 == 0) {
      CopyRow<uint4>(src, dst, kv.bytes_per_row, lane);
    } else if (alignment % 4 == 0) {
      CopyRow<uint32_t>(src, dst, kv.bytes_per_row, lane);
    } else {
      CopyRow<uint8_t>(src, dst, kv.bytes_per_row, lane);
    }
  }
}

}  // namespace

cudaError_t LaunchRelocate(const KvLayersView& kv, const SlotPair* copies, int64_t num_copies,
                           cudaStream_t stream) {
  const int64_t rows = num_copies * kv.num_layers * 2;
  // Enough blocks to fill any current GPU several times over; the kernel strides past the rest.
  const int64_t blocks = std::min<int64_t>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock, 8192);
  RelocateKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(kv, copies, num_copies);
  return cudaGetLastError();
}

}  // namespace vtoken::cuda::internal
