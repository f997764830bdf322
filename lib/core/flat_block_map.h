// FlatBlockMap: BlockId -> int32_t, open addressing with linear probing in one flat array (no
// node per entry, no tombstones: erase shifts the probe run back). What a token table uses to
// find a held block's position: a per-head table holds a few dozen blocks, looked up on every
// eviction and relocation, and a new one is added every block_size appends.
// Not thread-safe.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "lib/core/types.h"

namespace vtoken {

class FlatBlockMap {
 public:
  size_t size() const { return size_; }
  // Slots of the flat array (a power of two, at most half full; 0 when empty).
  size_t bucket_count() const { return table_.size(); }
  int64_t MemoryBytes() const { return static_cast<int64_t>(table_.capacity() * sizeof(Slot)); }

  // The value of `block`, or -1 when absent. REQUIRES: block >= 0.
  int32_t Find(BlockId block) const {
    if (table_.empty()) return -1;
    for (size_t i = Home(block);; i = (i + 1) & mask_) {
      const Slot& s = table_[i];
      if (s.block == block) return s.value;
      if (s.block == kEmpty) return -1;
    }
  }
  bool Contains(BlockId block) const { return Find(block) >= 0; }
  // REQUIRES: Contains(block).
  int32_t& At(BlockId block) {
    size_t i = Home(block);
    while (table_[i].block != block) {
      assert(table_[i].block != kEmpty);
      i = (i + 1) & mask_;
    }
    return table_[i].value;
  }

  // REQUIRES: !Contains(block), block >= 0, value >= 0.
  void Insert(BlockId block, int32_t value) {
    assert(block >= 0 && value >= 0 && !Contains(block));
    if (2 * (size_ + 1) > table_.size()) Rehash(table_.empty() ? 8 : 2 * table_.size());
    size_t i = Home(block);
    while (table_[i].block != kEmpty) i = (i + 1) & mask_;
    table_[i] = Slot{block, value};
    ++size_;
  }

  // REQUIRES: Contains(block).
  void Erase(BlockId block) {
    size_t i = Home(block);
    while (table_[i].block != block) i = (i + 1) & mask_;
    // Backward shift: move later entries of the probe run into the hole when their home allows.
    for (size_t j = (i + 1) & mask_; table_[j].block != kEmpty; j = (j + 1) & mask_) {
      const size_t home = Home(table_[j].block);
      // Entry j may fill hole i when its home is not in the cyclic range (i, j].
      if (((j - home) & mask_) >= ((j - i) & mask_)) {
        table_[i] = table_[j];
        i = j;
      }
    }
    table_[i] = Slot{};
    --size_;
  }

 private:
  static constexpr BlockId kEmpty = -1;
  struct Slot {
    BlockId block = kEmpty;
    int32_t value = -1;
  };

  size_t Home(BlockId block) const {
    // Fibonacci hashing: block ids are dense and consecutive, the top bits spread them.
    return static_cast<size_t>((static_cast<uint32_t>(block) * 0x9E3779B1u) >> shift_) & mask_;
  }

  void Rehash(size_t buckets) {
    std::vector<Slot> old = std::move(table_);
    table_.assign(buckets, Slot{});
    mask_ = buckets - 1;
    shift_ = 32;
    for (size_t b = buckets; b > 1; b >>= 1) --shift_;
    size_ = 0;
    for (const Slot& s : old) {
      if (s.block != kEmpty) Insert(s.block, s.value);
    }
  }

  std::vector<Slot> table_;
  size_t size_ = 0;
  size_t mask_ = 0;
  int shift_ = 32;
};

}  // namespace vtoken
