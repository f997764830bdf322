// TorchCopyEngine: a vtoken::CopyEngine over a KvTensors store. Each ticket is one batched
// relocation: per distinct KV tensor (KvTensors: one per layer at token granularity, else one),
// one index_select of the source rows and one index_copy_ into the destinations for K and for V
// (never a loop of per-token copies); a slot copy moves KvTensors::bytes_per_slot() bytes.
// Synchronous (copies inside Submit) or asynchronous (a worker thread copies in submission order
// while the scheduler thread runs the next forward; the reads are fenced by the core's pending-slot
// tracking).
//
// Submit/Wait/Poll are called from one thread. A failed copy (a slot out of range: a caller bug)
// is kept in status() and the ticket still completes.
#pragma once

#include <mutex>
#include <vector>

#include "lib/core/copy_engine.h"
#include "lib/core/status.h"
#include "lib/model/kv_tensors.h"

namespace vtoken::model {

class TorchCopyEngine final : public QueuedCopyEngine {
 public:
  TorchCopyEngine(KvTensors& kv, bool async);
  ~TorchCopyEngine() override { WaitAll(); }  // Queued copies use mu_ and status_.
  // The first copy error, or OK.
  Status status() const;

 private:
  int64_t Copy(KvTensors& kv, const std::vector<SlotCopy>& copies);

  mutable std::mutex mu_;
  Status status_;
};

// xxhash64 over the slot's K rows then V rows in every distinct tensor, in layer order (as
// lib/cuda's hash kernel): at token granularity a token's rows of every layer; else the one
// group's rows.
uint64_t TokenKvHash(KvTensors& kv, SlotIndex slot);

}  // namespace vtoken::model
