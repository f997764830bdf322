#include "lib/core/copy_engine.h"

#include <chrono>

namespace vtoken {
namespace {

QueuedCopyEngine::CopyFn HostCopy(HostKvStore& store) {
  return [&store](const std::vector<SlotCopy>& copies) {
    store.CopySlots(copies);
    return static_cast<int64_t>(copies.size()) * store.num_layers() * store.bytes_per_token();
  };
}

}  // namespace

QueuedCopyEngine::QueuedCopyEngine(CopyFn copy, bool async, int64_t delay_us)
    : copy_(std::move(copy)), async_(async), delay_us_(delay_us) {
  if (async_) worker_ = std::thread([this] { Run(); });
}

QueuedCopyEngine::~QueuedCopyEngine() {
  if (!async_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_one();
  worker_.join();
}

CopyTicket QueuedCopyEngine::Submit(std::vector<SlotCopy> copies) {
  if (!async_) {
    const int64_t bytes = copy_(copies);
    std::lock_guard<std::mutex> lock(mu_);
    bytes_ += bytes;
    completed_ = next_;
    return next_++;
  }
  CopyTicket ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ticket = next_++;
    queue_.emplace_back(ticket, std::move(copies));
  }
  work_cv_.notify_one();
  return ticket;
}

void QueuedCopyEngine::Wait(CopyTicket ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return completed_ >= ticket; });
}

bool QueuedCopyEngine::Poll(CopyTicket ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_ >= ticket;
}

void QueuedCopyEngine::WaitAll() {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return completed_ + 1 >= next_; });
}

int64_t QueuedCopyEngine::bytes_copied() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

void QueuedCopyEngine::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and drained.
    auto [ticket, copies] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    if (delay_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us_));
    const int64_t bytes = copy_(copies);
    lock.lock();
    completed_ = ticket;
    bytes_ += bytes;
    done_cv_.notify_all();
  }
}

SyncHostCopyEngine::SyncHostCopyEngine(HostKvStore& store)
    : QueuedCopyEngine(HostCopy(store), /*async=*/false) {}

AsyncHostCopyEngine::AsyncHostCopyEngine(HostKvStore& store, int64_t delay_us)
    : QueuedCopyEngine(HostCopy(store), /*async=*/true, delay_us) {}

}  // namespace vtoken
