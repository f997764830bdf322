// XXH64 (seed 0) of one token's KV bytes: for layer 0..L-1, the K row then the V row. The same
// byte order as vtoken::TokenKvHash over a HostKvStore whose token bytes are K row ++ V row, so
// device hashes and the core's check hashes are comparable.
//
// Internal to lib/cuda. Compiled twice from this one source: into the hash kernel (nvcc) and
// into HashTokenRowsPortable (host compiler), so the device algorithm is tested against libxxhash
// on machines without a GPU. The algorithm follows the XXH64 specification (xxhash.h,
// XXH64_update / XXH64_digest) reading the virtual concatenation of the rows without buffering.
#pragma once

#include <cstdint>

#include "lib/cuda/views.h"

#if defined(__CUDACC__)
#define VTOKEN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define VTOKEN_HOST_DEVICE inline
#endif

namespace vtoken::cuda::xxh64 {

inline constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ULL;
inline constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4FULL;
inline constexpr uint64_t kPrime3 = 0x165667B19E3779F9ULL;
inline constexpr uint64_t kPrime4 = 0x85EBCA77C2B2AE63ULL;
inline constexpr uint64_t kPrime5 = 0x27D4EB2F165667C5ULL;

VTOKEN_HOST_DEVICE uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

VTOKEN_HOST_DEVICE uint64_t Round(uint64_t acc, uint64_t input) {
  acc += input * kPrime2;
  return Rotl(acc, 31) * kPrime1;
}

VTOKEN_HOST_DEVICE uint64_t MergeRound(uint64_t acc, uint64_t val) {
  acc ^= Round(0, val);
  return acc * kPrime1 + kPrime4;
}

// Reads the rows of one token as one byte stream: segment 2*l is layer l's K row, 2*l+1 its V row.
class RowStream {
 public:
  VTOKEN_HOST_DEVICE RowStream(const KvLayersView& kv, int64_t slot) : kv_(kv), slot_(slot) {
    Seek(0);
  }
  // Next `n` (<= 8) bytes as a little-endian integer, crossing row boundaries as needed.
  VTOKEN_HOST_DEVICE uint64_t Next(int n) {
    uint64_t value = 0;
    for (int i = 0; i < n; ++i) {
      if (offset_ == kv_.bytes_per_row) Seek(segment_ + 1);
      value |= static_cast<uint64_t>(row_[offset_++]) << (8 * i);
    }
    return value;
  }

 private:
  VTOKEN_HOST_DEVICE void Seek(int32_t segment) {
    segment_ = segment;
    void* const* layers = (segment & 1) ? kv_.v_layers : kv_.k_layers;
    row_ = static_cast<const uint8_t*>(layers[segment >> 1]) + slot_ * kv_.bytes_per_row;
    offset_ = 0;
  }

  const KvLayersView& kv_;
  int64_t slot_;
  int32_t segment_ = 0;
  const uint8_t* row_ = nullptr;
  int64_t offset_ = 0;
};

// True when every row is a whole number of 32-byte stripes at an 8-byte aligned address, so
// stripes never straddle rows and lanes load as aligned 64-bit words (the common fp16/bf16 case).
VTOKEN_HOST_DEVICE bool StripesAligned(const KvLayersView& kv) {
  if (kv.bytes_per_row % 32 != 0) return false;
  for (int32_t l = 0; l < kv.num_layers; ++l) {
    if ((reinterpret_cast<uintptr_t>(kv.k_layers[l]) |
         reinterpret_cast<uintptr_t>(kv.v_layers[l])) %
            8 !=
        0) {
      return false;
    }
  }
  return true;
}

VTOKEN_HOST_DEVICE uint64_t Avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= kPrime2;
  h ^= h >> 29;
  h *= kPrime3;
  h ^= h >> 32;
  return h;
}

VTOKEN_HOST_DEVICE uint64_t MergeAccumulators(uint64_t v1, uint64_t v2, uint64_t v3, uint64_t v4) {
  uint64_t h = Rotl(v1, 1) + Rotl(v2, 7) + Rotl(v3, 12) + Rotl(v4, 18);
  h = MergeRound(h, v1);
  h = MergeRound(h, v2);
  h = MergeRound(h, v3);
  return MergeRound(h, v4);
}

// XXH64 with seed 0 of the token at `slot`. REQUIRES: kv points to memory this code can read
// (device memory in a kernel, host memory on the host), 0 <= slot < kv.num_slots.
VTOKEN_HOST_DEVICE uint64_t HashTokenRows(const KvLayersView& kv, int64_t slot) {
  const uint64_t total = 2 * static_cast<uint64_t>(kv.num_layers) * kv.bytes_per_row;
  uint64_t v1 = kPrime1 + kPrime2, v2 = kPrime2, v3 = 0, v4 = 0 - kPrime1;
  uint64_t h;
  uint64_t consumed = 0;
  if (total >= 32 && StripesAligned(kv)) {
    for (int32_t segment = 0; segment < 2 * kv.num_layers; ++segment) {
      void* const* layers = (segment & 1) ? kv.v_layers : kv.k_layers;
      const uint64_t* row = reinterpret_cast<const uint64_t*>(
          static_cast<const uint8_t*>(layers[segment >> 1]) + slot * kv.bytes_per_row);
      for (int64_t w = 0; w < kv.bytes_per_row / 8; w += 4) {
        v1 = Round(v1, row[w]);
        v2 = Round(v2, row[w + 1]);
        v3 = Round(v3, row[w + 2]);
        v4 = Round(v4, row[w + 3]);
      }
    }
    return Avalanche(MergeAccumulators(v1, v2, v3, v4) + total);
  }
  RowStream stream(kv, slot);
  if (total >= 32) {
    for (; consumed + 32 <= total; consumed += 32) {
      v1 = Round(v1, stream.Next(8));
      v2 = Round(v2, stream.Next(8));
      v3 = Round(v3, stream.Next(8));
      v4 = Round(v4, stream.Next(8));
    }
    h = MergeAccumulators(v1, v2, v3, v4);
  } else {
    h = kPrime5;
  }
  h += total;
  for (; consumed + 8 <= total; consumed += 8) {
    h ^= Round(0, stream.Next(8));
    h = Rotl(h, 27) * kPrime1 + kPrime4;
  }
  if (consumed + 4 <= total) {
    h ^= stream.Next(4) * kPrime1;
    h = Rotl(h, 23) * kPrime2 + kPrime3;
    consumed += 4;
  }
  for (; consumed < total; ++consumed) {
    h ^= stream.Next(1) * kPrime5;
    h = Rotl(h, 11) * kPrime1;
  }
  return Avalanche(h);
}

}  // namespace vtoken::cuda::xxh64
