// KvTensors: the physical KV store of a paged cache. Per layer one K and one V tensor of shape
// [num_slots, num_kv_heads, head_dim] with num_slots = num_blocks * block_size. It holds data
// only; which slot belongs to which token is the core's business (lib/core), so relocation here
// is a plain row copy driven by the caller.
//
// Not thread-safe: one writer at a time (the forward pass or a copy).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "lib/core/status.h"

namespace vtoken::model {

struct KvTensorsOptions {
  int64_t num_layers = 0;                // Decoder layers; one K and one V tensor each.
  int64_t num_slots = 0;                 // num_blocks * block_size.
  int64_t num_kv_heads = 0;              // Key/value heads per layer.
  int64_t head_dim = 0;                  // Channels per head.
  torch::Dtype dtype = torch::kFloat32;  // Storage dtype; the forward pass casts into it.
  torch::Device device = torch::kCPU;
};

class KvTensors {
 public:
  // Allocates zero-filled tensors. Returns InvalidArgument when a size is not positive.
  static StatusOr<KvTensors> Create(const KvTensorsOptions& options);

  const KvTensorsOptions& options() const { return options_; }
  int64_t num_slots() const { return options_.num_slots; }

  // [num_slots, num_kv_heads, head_dim]. REQUIRES: 0 <= layer < num_layers.
  torch::Tensor& k(int64_t layer) { return k_[layer]; }
  torch::Tensor& v(int64_t layer) { return v_[layer]; }

  // Copies the K and V rows of src_slots[i] to dst_slots[i] in every layer (a relocation).
  // All sources are read before any destination is written, so overlapping moves behave like a
  // parallel copy. Returns InvalidArgument on a length mismatch or a slot out of range.
  Status CopySlots(const std::vector<int64_t>& src_slots, const std::vector<int64_t>& dst_slots);

  // Returns InvalidArgument unless every slot lies in [0, num_slots).
  Status CheckSlots(const std::vector<int64_t>& slots) const;

 private:
  KvTensorsOptions options_;
  std::vector<torch::Tensor> k_;
  std::vector<torch::Tensor> v_;
};

}  // namespace vtoken::model
