// HostKvStore: raw KV bytes in host memory, laid out [layer][slot][bytes_per_token] (a token's K
// and V for one layer are bytes_per_token contiguous bytes). It stands in for the model's KV
// tensors so core tests and `vtoken-cli check` can verify that relocation moves the right bytes.
//
// Thread-compatible: concurrent access to distinct slots is safe (copy engines rely on it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "lib/core/types.h"

namespace vtoken {

class HostKvStore {
 public:
  HostKvStore(int32_t num_layers, int64_t num_slots, int64_t bytes_per_token);

  int32_t num_layers() const { return num_layers_; }
  int64_t num_slots() const { return num_slots_; }
  int64_t bytes_per_token() const { return bytes_per_token_; }

  // The bytes of one token in one layer. REQUIRES: 0 <= slot < num_slots().
  std::span<std::byte> Token(int32_t layer, SlotIndex slot) {
    return {data_.data() + Offset(layer, slot), static_cast<size_t>(bytes_per_token_)};
  }
  std::span<const std::byte> Token(int32_t layer, SlotIndex slot) const {
    return {data_.data() + Offset(layer, slot), static_cast<size_t>(bytes_per_token_)};
  }

  // Copies each src slot's bytes to its dst slot in every layer. Runs of consecutive source and
  // destination slots are copied with one memcpy per layer. REQUIRES: no dst is also a src.
  void CopySlots(std::span<const SlotCopy> copies);

 private:
  size_t Offset(int32_t layer, SlotIndex slot) const {
    return (static_cast<size_t>(layer) * num_slots_ + slot) * bytes_per_token_;
  }

  int32_t num_layers_;
  int64_t num_slots_;
  int64_t bytes_per_token_;
  std::vector<std::byte> data_;
};

// xxhash64 of a token's KV bytes over all layers (K and V), in layer order.
uint64_t TokenKvHash(const HostKvStore& store, SlotIndex slot);

}  // namespace vtoken
