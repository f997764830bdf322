// Per-token KV hash: XXH64 (seed 0) of a token's bytes over all layers, for each layer the K row
// then the V row. It equals vtoken::TokenKvHash (lib/core/host_kv_store.h) of a HostKvStore whose
// token bytes are K row ++ V row, so `check` can verify device relocations with the core's
// before/after hash protocol.
#pragma once

#include <cstdint>

#include "lib/core/status.h"
#include "lib/cuda/device.h"
#include "lib/cuda/views.h"

namespace vtoken::cuda {

// Enqueues hashing of slots[i] into hashes[i] on `stream` (one thread per token).
//   kv:     device view
//   slots:  device [num_tokens], each in [0, kv.num_slots)
//   hashes: device [num_tokens]
// Returns InvalidArgument for a malformed view or a negative count, Internal when the launch
// fails.
Status HashTokenRows(const KvLayersView& kv, const int64_t* slots, int64_t num_tokens,
                     uint64_t* hashes, Stream stream);

// CPU reference over a host view: libxxhash's streaming XXH64 fed row by row.
// REQUIRES: ValidateKvLayersView(kv).ok(), 0 <= slot < kv.num_slots.
uint64_t HashTokenRowsReference(const KvLayersView& kv, int64_t slot);

// The device kernel's own XXH64 code (xxh64_rows.h) compiled for the host, over a host view, so
// the device algorithm is checked against libxxhash where no GPU is present.
// REQUIRES: as HashTokenRowsReference.
uint64_t HashTokenRowsPortable(const KvLayersView& kv, int64_t slot);

}  // namespace vtoken::cuda
