#include "lib/core/copy_engine.h"

#include <chrono>

namespace vtoken {
namespace {

int64_t CopyBytes(const HostKvStore& store, size_t num_copies) {
  return static_cast<int64_t>(num_copies) * store.num_layers() * store.bytes_per_token();
}

}  // namespace

CopyTicket SyncHostCopyEngine::Submit(std::vector<SlotCopy> copies) {
  store_.CopySlots(copies);
  bytes_ += CopyBytes(store_, copies.size());
  return next_++;
}

AsyncHostCopyEngine::AsyncHostCopyEngine(HostKvStore& store, int64_t delay_us)
    : store_(store), delay_us_(delay_us), worker_([this] { Run(); }) {}

AsyncHostCopyEngine::~AsyncHostCopyEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_one();
  worker_.join();
}

CopyTicket AsyncHostCopyEngine::Submit(std::vector<SlotCopy> copies) {
  CopyTicket ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ticket = next_++;
    queue_.emplace_back(ticket, std::move(copies));
  }
  work_cv_.notify_one();
  return ticket;
}

void AsyncHostCopyEngine::Wait(CopyTicket ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return completed_ >= ticket; });
}

bool AsyncHostCopyEngine::Poll(CopyTicket ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_ >= ticket;
}

int64_t AsyncHostCopyEngine::bytes_copied() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

void AsyncHostCopyEngine::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and drained.
    auto [ticket, copies] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    if (delay_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us_));
    store_.CopySlots(copies);
    lock.lock();
    completed_ = ticket;
    bytes_ += CopyBytes(store_, copies.size());
    done_cv_.notify_all();
  }
}

}  // namespace vtoken
