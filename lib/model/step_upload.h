// StepUpload: the int64 index arrays of one paged step (tokens, positions, write slots, the key
// CSR, the CUDA kernel's tables), sent to the model's device as ONE tensor: on CUDA one
// non-blocking copy from pinned memory per step, whatever the batch holds. Segments are recorded
// by pointer and copied once, straight into the pinned block, when Send runs. Internal to
// lib/model; one step, one thread.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <deque>
#include <vector>

namespace vtoken::model::internal {

class StepUpload {
 public:
  // Appends `count` values at `data`; returns their offset (in int64 words) in the sent array.
  // REQUIRES: the values stay valid and unchanged until Send returns.
  int64_t Add(const int64_t* data, int64_t count);
  int64_t Add(const std::vector<int64_t>& values) {
    return Add(values.data(), static_cast<int64_t>(values.size()));
  }
  // Appends a copy of `count` bytes, zero-padded to whole int64 words; returns their word offset.
  int64_t AddBytes(const uint8_t* data, int64_t count);

  // int64 words added so far.
  int64_t size() const { return size_; }

  // One int64 tensor [size()] on `device` with every segment at its offset. On CUDA the host side
  // is pinned and the copy does not block the host (torch's caching host allocator keeps the
  // block until the copy has run); on the CPU the host tensor itself.
  torch::Tensor Send(const torch::Device& device) const;

 private:
  struct Segment {
    const int64_t* data;
    int64_t count;
  };
  std::vector<Segment> segments_;
  std::deque<std::vector<int64_t>> owned_;  // AddBytes' words; a deque never moves them.
  int64_t size_ = 0;
};

}  // namespace vtoken::model::internal
