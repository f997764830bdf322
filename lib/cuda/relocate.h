// Relocation: copies token rows (src slot -> dst slot) in every layer, K and V, in one kernel
// launch, plus the CPU reference over the same layout. This is the data movement of a vToken
// reclamation; the CudaCopyEngine (cuda_copy_engine.h) drives it from a copy list.
#pragma once

#include <cstdint>
#include <span>

#include "lib/core/status.h"
#include "lib/cuda/device.h"
#include "lib/cuda/views.h"

namespace vtoken::cuda {

// Enqueues the copies on `stream` and returns without waiting.
//   kv:     device view (pointer arrays and layers in device memory)
//   copies: device [num_copies]
// num_copies == 0 launches nothing. Returns InvalidArgument for a malformed view or a negative
// count, Internal when the launch fails.
// REQUIRES: every src and dst in [0, kv.num_slots); no slot is the dst of two copies, and no dst is
// also a src (rows are copied in parallel, in no particular order).
Status RelocateRows(const KvLayersView& kv, const SlotPair* copies, int64_t num_copies,
                    Stream stream);

// CPU reference: the same copies over a host view. Returns InvalidArgument for a malformed view
// or a slot out of range, naming the copy at fault.
Status RelocateRowsReference(const KvLayersView& kv, std::span<const SlotPair> copies);

// Returns InvalidArgument unless the view has layers, rows and non-null layer arrays.
Status ValidateKvLayersView(const KvLayersView& kv);

}  // namespace vtoken::cuda
