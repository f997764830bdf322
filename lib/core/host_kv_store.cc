#include "lib/core/host_kv_store.h"

#include <xxhash.h>

#include <cstring>

namespace vtoken {

HostKvStore::HostKvStore(int32_t num_layers, int64_t num_slots, int64_t bytes_per_token)
    : num_layers_(num_layers),
      num_slots_(num_slots),
      bytes_per_token_(bytes_per_token),
      data_(static_cast<size_t>(num_layers) * num_slots * bytes_per_token) {}

void HostKvStore::CopySlots(std::span<const SlotCopy> copies) {
  size_t i = 0;
  while (i < copies.size()) {
    size_t run = 1;
    while (i + run < copies.size() && copies[i + run].src == copies[i].src + SlotIndex(run) &&
           copies[i + run].dst == copies[i].dst + SlotIndex(run)) {
      ++run;
    }
    const size_t bytes = run * bytes_per_token_;
    for (int32_t layer = 0; layer < num_layers_; ++layer) {
      std::memcpy(data_.data() + Offset(layer, copies[i].dst),
                  data_.data() + Offset(layer, copies[i].src), bytes);
    }
    i += run;
  }
}

uint64_t TokenKvHash(const HostKvStore& store, SlotIndex slot) {
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  for (int32_t layer = 0; layer < store.num_layers(); ++layer) {
    std::span<const std::byte> bytes = store.Token(layer, slot);
    XXH64_update(state, bytes.data(), bytes.size());
  }
  const uint64_t hash = XXH64_digest(state);
  XXH64_freeState(state);
  return hash;
}

}  // namespace vtoken
