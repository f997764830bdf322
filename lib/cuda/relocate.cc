#include "lib/cuda/relocate.h"

#include <cstring>
#include <string>

#include "lib/cuda/cuda_check.h"
#include "lib/cuda/kernels.h"

namespace vtoken::cuda {

Status ValidateKvLayersView(const KvLayersView& kv) {
  if (kv.num_layers <= 0 || kv.num_slots <= 0 || kv.bytes_per_row <= 0) {
    return InvalidArgumentError("KvLayersView: num_layers (" + std::to_string(kv.num_layers) +
                                "), num_slots (" + std::to_string(kv.num_slots) +
                                ") and bytes_per_row (" + std::to_string(kv.bytes_per_row) +
                                ") must be positive");
  }
  if (kv.k_layers == nullptr || kv.v_layers == nullptr) {
    return InvalidArgumentError("KvLayersView: k_layers and v_layers must not be null");
  }
  return Status::Ok();
}

Status RelocateRows(const KvLayersView& kv, const SlotPair* copies, int64_t num_copies,
                    Stream stream) {
  VTOKEN_RETURN_IF_ERROR(ValidateKvLayersView(kv));
  if (num_copies < 0) {
    return InvalidArgumentError("RelocateRows: num_copies " + std::to_string(num_copies) +
                                " is negative");
  }
  if (num_copies == 0) return Status::Ok();
  if (copies == nullptr) return InvalidArgumentError("RelocateRows: copies is null");
  return CudaStatus(internal::LaunchRelocate(kv, copies, num_copies, stream),
                    "RelocateRows: kernel launch");
}

Status RelocateRowsReference(const KvLayersView& kv, std::span<const SlotPair> copies) {
  VTOKEN_RETURN_IF_ERROR(ValidateKvLayersView(kv));
  for (size_t i = 0; i < copies.size(); ++i) {
    const SlotPair& c = copies[i];
    if (c.src < 0 || c.src >= kv.num_slots || c.dst < 0 || c.dst >= kv.num_slots) {
      return InvalidArgumentError("RelocateRowsReference: copy " + std::to_string(i) + " (" +
                                  std::to_string(c.src) + " -> " + std::to_string(c.dst) +
                                  ") is out of range [0, " + std::to_string(kv.num_slots) + ")");
    }
  }
  const size_t row = static_cast<size_t>(kv.bytes_per_row);
  for (int32_t layer = 0; layer < kv.num_layers; ++layer) {
    for (void* base : {kv.k_layers[layer], kv.v_layers[layer]}) {
      char* bytes = static_cast<char*>(base);
      for (const SlotPair& c : copies) std::memcpy(bytes + c.dst * row, bytes + c.src * row, row);
    }
  }
  return Status::Ok();
}

}  // namespace vtoken::cuda
