// CopyEngine: executes the slot copies of a relocation, possibly asynchronously, so the copies
// overlap compute. Tickets complete in submission order. The caller frees source blocks (via
// VirtualKvCache::CompleteRelocation) only once a ticket has completed, and must not read a
// destination slot before then.
//
// Implementations here copy HostKvStore bytes; lib/model adds torch (CPU thread / CUDA stream)
// engines over the model's KV tensors. Submit/Wait/Poll are called from one thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "lib/core/host_kv_store.h"
#include "lib/core/types.h"

namespace vtoken {

using CopyTicket = uint64_t;

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  // Starts copying every (src, dst) pair in every layer; returns a ticket > 0.
  virtual CopyTicket Submit(std::vector<SlotCopy> copies) = 0;
  // Blocks until `ticket` (and every earlier ticket) completed.
  virtual void Wait(CopyTicket ticket) = 0;
  // True when `ticket` has completed; never blocks.
  virtual bool Poll(CopyTicket ticket) = 0;
  // Bytes copied so far by completed tickets.
  virtual int64_t bytes_copied() const = 0;
  // The read fence: orders every read the consumer issues from now on (the next forward pass)
  // after `ticket`'s copies and every earlier ticket's. An engine that copies on a device queue
  // makes the consumer's queue wait for the copy there and returns true without blocking the host;
  // the ticket then completes later, and the caller still polls it before freeing its sources.
  // This default waits on the host (Wait) and returns false.
  virtual bool FenceConsumer(CopyTicket ticket) {
    Wait(ticket);
    return false;
  }
};

// The shared machinery of the concrete engines: runs a copy function either inside Submit
// (synchronous: every ticket is complete on return) or on one worker thread in submission order
// (asynchronous). `delay_us` stalls each asynchronous ticket before it copies, which widens the
// window where destinations are pending (used to test the read fence).
class QueuedCopyEngine : public CopyEngine {
 public:
  // Copies `copies` in every layer; returns the bytes it moved.
  using CopyFn = std::function<int64_t(const std::vector<SlotCopy>& copies)>;

  QueuedCopyEngine(CopyFn copy, bool async, int64_t delay_us = 0);
  ~QueuedCopyEngine() override;  // Finishes queued copies, then joins the worker.
  QueuedCopyEngine(const QueuedCopyEngine&) = delete;
  QueuedCopyEngine& operator=(const QueuedCopyEngine&) = delete;

  CopyTicket Submit(std::vector<SlotCopy> copies) override;
  void Wait(CopyTicket ticket) override;
  bool Poll(CopyTicket ticket) override;
  int64_t bytes_copied() const override;
  // Blocks until every submitted ticket completed. A subclass whose copy function uses its own
  // members calls it in its destructor, before those members are gone.
  void WaitAll();

 private:
  void Run();

  CopyFn copy_;
  const bool async_;
  const int64_t delay_us_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<std::pair<CopyTicket, std::vector<SlotCopy>>> queue_;
  CopyTicket next_ = 1;
  CopyTicket completed_ = 0;
  int64_t bytes_ = 0;
  bool stop_ = false;
  std::thread worker_;
};

// Copies HostKvStore bytes on the calling thread inside Submit.
class SyncHostCopyEngine final : public QueuedCopyEngine {
 public:
  explicit SyncHostCopyEngine(HostKvStore& store);
};

// Copies HostKvStore bytes on a worker thread, in submission order.
class AsyncHostCopyEngine final : public QueuedCopyEngine {
 public:
  explicit AsyncHostCopyEngine(HostKvStore& store, int64_t delay_us = 0);
};

}  // namespace vtoken
