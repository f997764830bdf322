// KvTensors: the physical KV store of a paged cache. A slot holds the K and V rows of one KV group
// (lib/core/types.h, Granularity) of one token; the layout follows the granularity:
//   token  per layer one K and one V tensor [num_slots, num_kv_heads, head_dim]: a slot holds
//          every layer's rows;
//   layer  ONE K and ONE V tensor [num_slots, num_kv_heads, head_dim] shared by all layers: a
//          slot holds one layer's rows (which layer is the core's business);
//   head   ONE K and ONE V tensor [num_slots, 1, head_dim]: a slot holds one (layer, KV head) row.
// For the same token capacity every layout takes the same bytes (layer: num_layers times more
// slots, head: num_layers * num_kv_heads times more). It holds data only; which slot belongs to
// which token and group is the core's business (lib/core), so relocation here is a plain row copy
// driven by the caller.
//
// Not thread-safe: one writer at a time (the forward pass or a copy).
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "lib/core/status.h"
#include "lib/core/token_signal.h"
#include "lib/core/types.h"

namespace vtoken::model {

struct KvTensorsOptions {
  int64_t num_layers = 0;                // Decoder layers.
  int64_t num_slots = 0;                 // Group slots: num_blocks * block_size.
  int64_t num_kv_heads = 0;              // Key/value heads per layer.
  int64_t head_dim = 0;                  // Channels per head.
  torch::Dtype dtype = torch::kFloat32;  // Storage dtype; the forward pass casts into it.
  torch::Device device = torch::kCPU;
  Granularity granularity = Granularity::kToken;  // What a slot holds (see above).
  // Slots allocated past num_slots that no slot list of the caller may name: the static decode
  // step's padding rows write and read them (static_decode.h). num_slots(), CheckSlots and
  // CopySlots cover only [0, num_slots).
  int64_t scratch_slots = 0;
};

// The bytes of one token's K and V over every layer and KV head (any granularity):
// 2 * num_layers * num_kv_heads * head_dim * element size.
int64_t KvBytesPerToken(const KvTensorsOptions& options);

class KvTensors {
 public:
  // Allocates zero-filled tensors of num_slots + scratch_slots slots. Returns InvalidArgument
  // when a size is not positive or scratch_slots is negative.
  static StatusOr<KvTensors> Create(const KvTensorsOptions& options);

  const KvTensorsOptions& options() const { return options_; }
  // The caller's slots; the scratch slots follow them.
  int64_t num_slots() const { return options_.num_slots; }
  // Slots the tensors hold: num_slots() + scratch_slots.
  int64_t allocated_slots() const { return options_.num_slots + options_.scratch_slots; }
  Granularity granularity() const { return options_.granularity; }
  // KV groups of a token: 1, num_layers or num_layers * num_kv_heads.
  int32_t num_kv_groups() const;
  // K (and as many V) rows of head_dim values a slot holds: num_layers * num_kv_heads,
  // num_kv_heads or 1.
  int64_t rows_per_slot() const;
  // 2 * rows_per_slot() * head_dim * element size: the bytes one slot copy moves.
  int64_t bytes_per_slot() const;

  // The tensor layer `layer` reads and writes: [allocated_slots, num_kv_heads, head_dim], or
  // [allocated_slots, 1, head_dim] at head granularity. REQUIRES: 0 <= layer < num_layers.
  torch::Tensor& k(int64_t layer) { return k_[k_.size() == 1 ? 0 : layer]; }
  torch::Tensor& v(int64_t layer) { return v_[v_.size() == 1 ? 0 : layer]; }
  // The distinct tensors (num_layers at token granularity, else 1), in layer order.
  const std::vector<torch::Tensor>& k_tensors() const { return k_; }
  const std::vector<torch::Tensor>& v_tensors() const { return v_; }

  // Copies the K and V rows of src_slots[i] to dst_slots[i] in every distinct tensor (a
  // relocation). All sources are read before any destination is written, so overlapping moves
  // behave like a parallel copy. Returns InvalidArgument on a length mismatch or a slot out of
  // range.
  Status CopySlots(const std::vector<int64_t>& src_slots, const std::vector<int64_t>& dst_slots);

  // Appends the K and V rows of `slots` to `out` as bytes on the host: per distinct tensor (in
  // layer order) the K rows of every slot, then their V rows; bytes_per_slot() per slot in all.
  Status ReadSlots(std::span<const int64_t> slots, std::vector<std::byte>& out) const;
  // The query statistics of KV row (layer, KV head) for a signal that reads queries; an empty
  // function when the runner keeps none for the scope's request.
  using MomentsOf = std::function<QueryMoments(int64_t layer, int64_t kv_head)>;
  // ModelRunner::TokenSignals over this store: per slot, each signal's columns (one: the mean
  // over the rows the slot holds; a view's: per layer or per row, TokenSignalInfo::columns)
  // (ReduceTokenSignals' order and bits, relative signals' anchors taken over
  // `slots` as TokenSignalAnchors does; a set function's values over `slots` at
  // scope.positions, with `moments` of the row for one that reads queries), appended to `out`
  // slot-major. On the CPU in fp32 it reads the rows in place; elsewhere it copies the slots'
  // rows to the host as fp32 first. InvalidArgument for a slot out of range or positions not one
  // per slot with a set function; FailedPrecondition for a signal that reads queries when
  // `moments` gives none.
  Status TokenSignals(std::span<const int64_t> slots,
                      std::span<const TokenSignalInfo* const> signals,
                      const TokenSignalScope& scope, const MomentsOf& moments,
                      std::vector<float>& out) const;
  // Writes bytes in ReadSlots' layout into `slots`. InvalidArgument on a size mismatch or a slot
  // out of range.
  Status WriteSlots(std::span<const int64_t> slots, std::span<const std::byte> bytes);
  // Returns InvalidArgument unless every slot lies in [0, num_slots).
  Status CheckSlots(std::span<const int64_t> slots) const;

 private:
  KvTensorsOptions options_;
  std::vector<torch::Tensor> k_;
  std::vector<torch::Tensor> v_;
};

}  // namespace vtoken::model
