#include "lib/cuda/kv_hash.h"

#include <xxhash.h>

#include <string>

#include "lib/cuda/cuda_check.h"
#include "lib/cuda/kernels.h"
#include "lib/cuda/relocate.h"
#include "lib/cuda/xxh64_rows.h"

namespace vtoken::cuda {

Status HashTokenRows(const KvLayersView& kv, const int64_t* slots, int64_t num_tokens,
                     uint64_t* hashes, Stream stream) {
  VTOKEN_RETURN_IF_ERROR(ValidateKvLayersView(kv));
  if (num_tokens < 0) {
    return InvalidArgumentError("HashTokenRows: num_tokens " + std::to_string(num_tokens) +
                                " is negative");
  }
  if (num_tokens == 0) return Status::Ok();
  if (slots == nullptr || hashes == nullptr) {
    return InvalidArgumentError("HashTokenRows: slots and hashes must not be null");
  }
  return CudaStatus(internal::LaunchHashTokenRows(kv, slots, num_tokens, hashes, stream),
                    "HashTokenRows: kernel launch");
}

uint64_t HashTokenRowsReference(const KvLayersView& kv, int64_t slot) {
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  const size_t row = static_cast<size_t>(kv.bytes_per_row);
  for (int32_t layer = 0; layer < kv.num_layers; ++layer) {
    XXH64_update(state, static_cast<const char*>(kv.k_layers[layer]) + slot * row, row);
    XXH64_update(state, static_cast<const char*>(kv.v_layers[layer]) + slot * row, row);
  }
  const uint64_t hash = XXH64_digest(state);
  XXH64_freeState(state);
  return hash;
}

uint64_t HashTokenRowsPortable(const KvLayersView& kv, int64_t slot) {
  return xxh64::HashTokenRows(kv, slot);
}

}  // namespace vtoken::cuda
