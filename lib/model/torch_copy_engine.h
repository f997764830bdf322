// TorchCopyEngine: a vtoken::CopyEngine over a KvTensors store. Each ticket is one batched
// relocation: per layer, one index_select of the source rows and one index_copy_ into the
// destinations for K and for V (never a loop of per-token copies). Synchronous (copies inside
// Submit) or asynchronous (a worker thread copies in submission order while the scheduler thread
// runs the next forward; the reads are fenced by the core's pending-slot tracking).
//
// Submit/Wait/Poll are called from one thread. A failed copy (a slot out of range: a caller bug)
// is kept in status() and the ticket still completes.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "lib/core/copy_engine.h"
#include "lib/core/status.h"
#include "lib/model/kv_tensors.h"

namespace vtoken::model {

class TorchCopyEngine final : public CopyEngine {
 public:
  TorchCopyEngine(KvTensors& kv, bool async);
  ~TorchCopyEngine() override;  // Finishes queued copies, then joins the worker.
  TorchCopyEngine(const TorchCopyEngine&) = delete;
  TorchCopyEngine& operator=(const TorchCopyEngine&) = delete;

  CopyTicket Submit(std::vector<SlotCopy> copies) override;
  void Wait(CopyTicket ticket) override;
  bool Poll(CopyTicket ticket) override;
  int64_t bytes_copied() const override;
  // The first copy error, or OK.
  Status status() const;

 private:
  void Copy(const std::vector<SlotCopy>& copies);
  void Run();

  KvTensors& kv_;
  const bool async_;
  const int64_t bytes_per_token_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<std::pair<CopyTicket, std::vector<SlotCopy>>> queue_;
  CopyTicket next_ = 1;
  CopyTicket completed_ = 0;
  int64_t bytes_ = 0;
  Status status_;
  bool stop_ = false;
  std::thread worker_;
};

// xxhash64 over a token's K row then V row bytes in every layer (as lib/cuda's hash kernel).
uint64_t TokenKvHash(KvTensors& kv, SlotIndex slot);

}  // namespace vtoken::model
