// Relocation kernels over the copy-major row order (copy, layer, K|V). Rows of a multiple of 16
// bytes (every model's: head_dim * dtype size) take the vector kernel: each warp loads a whole
// pass (several short rows, or a segment of a long one) into registers before it stores any of
// it, with streaming (non-temporal) loads and stores. Other rows take the scalar fallback.
#include <algorithm>
#include <cstdint>

#include "lib/cuda/kernels.h"

namespace vtoken::cuda::internal {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
// 16-byte words each lane holds between its loads and its stores: a warp issues every load of a
// pass before its first store, so up to 32 * 8 * 16 = 4 KiB per warp are in flight.
constexpr int kInFlight = 8;

// Where row `row` of the copy-major row order (copy, layer, K|V) reads and writes.
struct RowEnds {
  const uint8_t* src;
  uint8_t* dst;
};
__device__ __forceinline__ RowEnds RowAt(const KvLayersView& kv,
                                         const SlotPair* __restrict__ copies, int64_t row) {
  const int64_t copy = row / (2 * kv.num_layers);
  const int32_t rest = static_cast<int32_t>(row - copy * 2 * kv.num_layers);
  void* const* layers = (rest & 1) ? kv.v_layers : kv.k_layers;
  uint8_t* base = static_cast<uint8_t*>(layers[rest >> 1]);
  const SlotPair pair = copies[copy];
  return {base + pair.src * kv.bytes_per_row, base + pair.dst * kv.bytes_per_row};
}

template <typename Word>
__device__ __forceinline__ void CopyRow(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst,
                                        int64_t bytes, int lane) {
  const Word* s = reinterpret_cast<const Word*>(src);
  Word* d = reinterpret_cast<Word*>(dst);
  const int64_t words = bytes / static_cast<int64_t>(sizeof(Word));
  for (int64_t i = lane; i < words; i += 32) d[i] = s[i];
}

// The 16-byte path (rows and layer bases 16-byte aligned, the common case). A row is split into
// segments of at most 32 * kInFlight words; a warp's pass covers `rows_per_pass` whole rows when
// one segment is the whole row (short rows: several rows per warp, so that each lane still has
// several loads in flight), else one segment. Each lane loads all of its words of the pass, then
// stores them: whole-row loads before stores. The sources are dead after the copy, so their loads
// are streaming (evict-first); the destinations are written once and read at most once per layer
// by the next forward, so their stores are streaming too.
__global__ void __launch_bounds__(kThreads)
    RelocateVectorKernel(KvLayersView kv, const SlotPair* __restrict__ copies, int64_t num_copies,
                         int32_t words_per_lane, int32_t rows_per_pass, int32_t segments_per_row) {
  const int lane = threadIdx.x % 32;
  const int64_t words = kv.bytes_per_row / 16;
  const int64_t segment_words = static_cast<int64_t>(words_per_lane) * 32;
  const int64_t rows = num_copies * kv.num_layers * 2;
  const int64_t units =
      segments_per_row > 1 ? rows * segments_per_row : (rows + rows_per_pass - 1) / rows_per_pass;
  const int64_t warp_stride = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t unit = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
       unit < units; unit += warp_stride) {
    const int64_t first_row = segments_per_row > 1 ? unit / segments_per_row : unit * rows_per_pass;
    const int64_t first_word = segments_per_row > 1 ? (unit % segments_per_row) * segment_words : 0;
    // Layer bases from cudaMalloc or torch are 256-byte aligned; a caller's odd base takes the
    // scalar copy (warp-uniform: every lane checks the same rows).
    uintptr_t alignment = 0;
    for (int r = 0; r < rows_per_pass && first_row + r < rows; ++r) {
      const RowEnds ends = RowAt(kv, copies, first_row + r);
      alignment |= reinterpret_cast<uintptr_t>(ends.src) | reinterpret_cast<uintptr_t>(ends.dst);
    }
    if (alignment % 16 != 0) {
      const int64_t begin = first_word * 16;
      const int64_t bytes = segment_words * 16 < kv.bytes_per_row - begin
                                ? segment_words * 16
                                : kv.bytes_per_row - begin;
      for (int r = 0; r < rows_per_pass && first_row + r < rows; ++r) {
        const RowEnds ends = RowAt(kv, copies, first_row + r);
        if (alignment % 4 == 0) {
          CopyRow<uint32_t>(ends.src + begin, ends.dst + begin, bytes, lane);
        } else {
          CopyRow<uint8_t>(ends.src + begin, ends.dst + begin, bytes, lane);
        }
      }
      continue;
    }
    // Register i of the pass holds word `word` of row `row`, when it is in the pass at all.
    auto slot = [&](int i, int64_t& row, int64_t& word) {
      const int r = i / words_per_lane;
      row = first_row + r;
      word = first_word + lane + 32 * (i % words_per_lane);
      return r < rows_per_pass && row < rows && word < words;
    };
    uint4 buffer[kInFlight];
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      int64_t row, word;
      if (slot(i, row, word)) {
        buffer[i] = __ldcs(reinterpret_cast<const uint4*>(RowAt(kv, copies, row).src) + word);
      }
    }
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      int64_t row, word;
      if (slot(i, row, word)) {
        __stcs(reinterpret_cast<uint4*>(RowAt(kv, copies, row).dst) + word, buffer[i]);
      }
    }
  }
}

// The fallback for rows that are not whole 16-byte words: one warp per row, 4-byte words when
// the alignment allows, else bytes.
__global__ void __launch_bounds__(kThreads)
    RelocateScalarKernel(KvLayersView kv, const SlotPair* __restrict__ copies, int64_t num_copies) {
  const int lane = threadIdx.x % 32;
  const int64_t rows = num_copies * kv.num_layers * 2;
  const int64_t warp_stride = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
       row < rows; row += warp_stride) {
    const RowEnds ends = RowAt(kv, copies, row);
    const uintptr_t alignment = reinterpret_cast<uintptr_t>(ends.src) |
                                reinterpret_cast<uintptr_t>(ends.dst) |
                                static_cast<uintptr_t>(kv.bytes_per_row);
    if (alignment % 4 == 0) {
      CopyRow<uint32_t>(ends.src, ends.dst, kv.bytes_per_row, lane);
    } else {
      CopyRow<uint8_t>(ends.src, ends.dst, kv.bytes_per_row, lane);
    }
  }
}

// The vector kernel needs rows of whole 16-byte words; it checks the bases itself (the pointer
// arrays are device memory, which the host cannot read).
bool RowsAreVectorSized(const KvLayersView& kv) { return kv.bytes_per_row % 16 == 0; }

}  // namespace

cudaError_t LaunchRelocate(const KvLayersView& kv, const SlotPair* copies, int64_t num_copies,
                           cudaStream_t stream) {
  const int64_t rows = num_copies * kv.num_layers * 2;
  if (!RowsAreVectorSized(kv)) {
    // Enough blocks to fill any current GPU several times over; the kernel strides past the rest.
    const int64_t blocks = std::min<int64_t>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock, 8192);
    RelocateScalarKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(kv, copies,
                                                                                 num_copies);
    return cudaGetLastError();
  }
  const int64_t words = kv.bytes_per_row / 16;
  const int64_t max_segment = 32 * kInFlight;
  const int32_t segments_per_row = static_cast<int32_t>((words + max_segment - 1) / max_segment);
  const int64_t segment_words = (words + segments_per_row - 1) / segments_per_row;
  const int32_t words_per_lane = static_cast<int32_t>((segment_words + 31) / 32);
  const int32_t rows_per_pass = segments_per_row > 1 ? 1 : kInFlight / words_per_lane;
  const int64_t units =
      segments_per_row > 1 ? rows * segments_per_row : (rows + rows_per_pass - 1) / rows_per_pass;
  const int64_t blocks = std::min<int64_t>((units + kWarpsPerBlock - 1) / kWarpsPerBlock, 8192);
  RelocateVectorKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      kv, copies, num_copies, words_per_lane, rows_per_pass, segments_per_row);
  return cudaGetLastError();
}

}  // namespace vtoken::cuda::internal
