// CudaCopyEngine: the vtoken::CopyEngine that relocates rows of a device-resident paged KV cache
// on a dedicated copy stream, so reclamation overlaps the next forward pass (DESIGN.md §7).
//
// Staging protocol, per Submit:
//   1. the copy stream waits on an event recorded on the compute stream, so it copies rows only
//      after every write already queued there (the forward pass that produced them);
//   2. the copy list goes into a pinned host staging buffer and is uploaded with an async
//      memcpy on the copy stream;
//   3. one relocation kernel copies every (src, dst) row in every layer, K and V;
//   4. an event is recorded on the copy stream; it is the ticket's completion.
// Poll = cudaEventQuery, Wait = cudaEventSynchronize. MakeStreamWait(ticket, stream) is the
// stage-aware fence: the next forward's stream waits for the copy on the GPU (cudaStreamWaitEvent)
// without blocking the host; FenceConsumer (what the reclaimer calls) applies it to the compute
// stream. Each in-flight ticket owns its staging buffers, which are recycled once its event has
// completed, so a later Submit never overwrites a list still being uploaded; Submit never frees
// a buffer (a device-synchronising cudaFree), it adds a larger one when a list does not fit.
//
// Errors: the Try* methods return Status. CopyEngine's own methods cannot (the interface has no
// error channel), and a relocation that failed on the GPU leaves the KV cache in an unknown state
// that the caller would otherwise treat as done (freeing source blocks over live data), so they
// print the error to stderr and abort. Callers that can recover use the Try* methods.
//
// Thread-compatible: Submit/Wait/Poll/MakeStreamWait from one thread, as CopyEngine requires.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "lib/core/copy_engine.h"
#include "lib/core/status.h"
#include "lib/core/types.h"
#include "lib/cuda/device.h"
#include "lib/cuda/views.h"

struct CUevent_st;  // The CUDA runtime's opaque event type (cudaEvent_t is CUevent_st*).

namespace vtoken::cuda {

struct CudaCopyEngineOptions {
  // The stream whose queued writes a relocation must follow: the forward pass's stream. nullptr is
  // the legacy default stream. Default: nullptr.
  Stream compute_stream = nullptr;
  // Copy-list capacity (pairs) of a new staging buffer; a longer list grows it. Default: 4096.
  int64_t initial_staging_copies = 4096;
};

class CudaCopyEngine final : public CopyEngine {
 public:
  // k_layers, v_layers: host arrays [num_layers] of device pointers, each to a contiguous
  // [num_slots, num_kv_heads, head_dim] array with rows of `bytes_per_row` bytes. The arrays are
  // copied; the KV memory itself must outlive the engine. Returns InvalidArgument for mismatched
  // or empty layer lists, null layers or non-positive sizes; CUDA failures as Status.
  static StatusOr<std::unique_ptr<CudaCopyEngine>> Create(
      std::span<void* const> k_layers, std::span<void* const> v_layers, int64_t num_slots,
      int64_t bytes_per_row, const CudaCopyEngineOptions& options = {});

  // Waits for every in-flight copy, then releases streams, events and buffers.
  ~CudaCopyEngine() override;
  CudaCopyEngine(const CudaCopyEngine&) = delete;
  CudaCopyEngine& operator=(const CudaCopyEngine&) = delete;

  // CopyEngine: as TrySubmit / TryWait / TryPoll, aborting on error (see above).
  CopyTicket Submit(std::vector<SlotCopy> copies) override;
  void Wait(CopyTicket ticket) override;
  bool Poll(CopyTicket ticket) override;
  int64_t bytes_copied() const override { return bytes_copied_; }
  // The device-side read fence: MakeStreamWait(ticket, options.compute_stream); never blocks the
  // host, so the reclaimer completes the relocation on a later Poll.
  bool FenceConsumer(CopyTicket ticket) override;

  // Enqueues the copies and returns their ticket (> 0, increasing) without waiting. An empty list
  // gets a ticket too. Returns InvalidArgument (naming the copy) for a slot out of range, a slot
  // that is the dst of two copies, or a dst that is also a src; CUDA failures as Status, after
  // which the engine is failed and every later call returns that error.
  StatusOr<CopyTicket> TrySubmit(std::span<const SlotCopy> copies);
  // Blocks until `ticket` and every earlier ticket completed. InvalidArgument for a ticket never
  // issued.
  Status TryWait(CopyTicket ticket);
  // Whether `ticket` completed; never blocks. InvalidArgument for a ticket never issued.
  StatusOr<bool> TryPoll(CopyTicket ticket);
  // Makes `stream` wait (on the GPU) until `ticket`'s copies are done; the host does not block.
  // A completed ticket needs no wait. InvalidArgument for a ticket never issued.
  Status MakeStreamWait(CopyTicket ticket, Stream stream);

  Stream copy_stream() const { return copy_stream_.get(); }
  // The device view the relocation kernel runs on.
  const KvLayersView& view() const { return view_; }
  // Tickets submitted and not yet observed complete by Poll/Wait.
  int64_t num_in_flight() const { return static_cast<int64_t>(in_flight_.size()); }

 private:
  struct Staging;
  struct InFlight {
    CopyTicket ticket = 0;
    int64_t bytes = 0;
    Staging* staging = nullptr;
  };

  CudaCopyEngine(const CudaCopyEngineOptions& options, DeviceBuffer layer_pointers,
                 const KvLayersView& view, CudaStream copy_stream);
  Status ValidateCopies(std::span<const SlotCopy> copies) const;
  Status CheckTicket(CopyTicket ticket) const;
  StatusOr<Staging*> AcquireStaging(int64_t num_copies);
  // Retires in-flight tickets whose events completed, oldest first, until one is still pending
  // (`block` = wait for the ones up to `ticket` instead).
  Status Retire(CopyTicket ticket, bool block);
  // Records the first CUDA failure; later calls return it.
  Status Fail(Status status);

  CudaCopyEngineOptions options_;
  DeviceBuffer layer_pointers_;  // [2 * num_layers]: K layer pointers, then V layer pointers.
  KvLayersView view_;
  CudaStream copy_stream_;
  CUevent_st* compute_ready_ = nullptr;  // Recorded on the compute stream per Submit.
  std::vector<std::unique_ptr<Staging>> staging_;
  std::vector<Staging*> free_staging_;
  std::deque<InFlight> in_flight_;
  CopyTicket next_ticket_ = 1;
  CopyTicket completed_ = 0;
  int64_t bytes_copied_ = 0;
  Status failure_;
};

}  // namespace vtoken::cuda
