// Slots handed out the way a fragmented pool leaves them, for the paged attention tests: blocks of
// `block_size` slots in shuffled order, every third slot of a block dead (skipped), each key range
// starting in a fresh block. Header-only and free of CUDA headers: the GPU tests and the CPU
// emulation (tests/cuda_emu) both include it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace vtoken::cuda::testing {

class ScatteredSlots {
 public:
  // Enough blocks for `num_tokens` live tokens in `num_ranges` key ranges, shuffled with `rng`.
  ScatteredSlots(int64_t num_tokens, int64_t num_ranges, int64_t block_size, std::mt19937_64& rng)
      : block_size_(block_size),
        offset_(block_size),
        blocks_(static_cast<size_t>(num_tokens / LivePerBlock(block_size) + num_ranges + 1)) {
    std::iota(blocks_.begin(), blocks_.end(), 0);
    std::shuffle(blocks_.begin(), blocks_.end(), rng);
  }

  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  int64_t num_slots() const { return num_blocks() * block_size_; }

  // Makes the next slot the first of a fresh block.
  void StartRange() { offset_ = block_size_; }

  // Returns the next live slot. REQUIRES: at most the constructor's num_tokens in its num_ranges.
  int64_t Next() {
    do {
      if (offset_ == block_size_) {
        block_ = blocks_[next_block_++];
        offset_ = 0;
      }
    } while (block_size_ > 1 && offset_ % 3 == 2 && ++offset_);
    return block_ * block_size_ + offset_++;
  }

 private:
  static int64_t LivePerBlock(int64_t block_size) {
    return block_size == 1 ? 1 : block_size - block_size / 3;
  }

  int64_t block_size_;
  int64_t offset_;
  int64_t block_ = -1;
  size_t next_block_ = 0;
  std::vector<int64_t> blocks_;
};

}  // namespace vtoken::cuda::testing
