#include "lib/model/cpu_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>

namespace vtoken::model {
namespace {

using Clock = std::chrono::steady_clock;

// Spins until `flag` differs from `old` or `spin` has passed; returns the value last read.
template <typename T>
T SpinWhileEqual(const std::atomic<T>& flag, T old, std::chrono::microseconds spin) {
  const Clock::time_point deadline = Clock::now() + spin;
  for (uint32_t k = 1;; ++k) {
    const T now = flag.load(std::memory_order_acquire);
    if (now != old) return now;
    _mm_pause();
    if ((k & 255) == 0 && Clock::now() >= deadline) return now;
  }
}

}  // namespace

CpuPool::CpuPool(int num_threads, int spin_us) : spin_us_(spin_us) {
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { Work(i); });
}

CpuPool::~CpuPool() {
  stop_.store(true, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void CpuPool::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                          int64_t min_share) {
  if (n <= 0) return;
  const int64_t most = std::max<int64_t>(1, n / std::max<int64_t>(1, min_share));
  const int shares = static_cast<int>(std::min<int64_t>(num_threads(), most));
  if (shares == 1) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> lock(call_mutex_);
  fn_ = &fn;
  n_ = n;
  shares_ = shares;
  // Every worker acknowledges every call, those without a share too: none can still be reading
  // this call's fields when the next call writes them.
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  fn(0, n / shares);
  int left = pending_.load(std::memory_order_acquire);
  while (left != 0) {
    left = SpinWhileEqual(pending_, left, std::chrono::microseconds(spin_us_));
    if (left != 0 && left == pending_.load(std::memory_order_acquire)) {
      pending_.wait(left, std::memory_order_acquire);
      left = pending_.load(std::memory_order_acquire);
    }
  }
}

void CpuPool::Work(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t now = SpinWhileEqual(generation_, seen, std::chrono::microseconds(spin_us_));
    while (now == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      now = generation_.load(std::memory_order_acquire);
    }
    seen = now;
    if (stop_.load(std::memory_order_relaxed)) return;
    if (index < shares_) {
      (*fn_)(n_ * index / shares_, n_ * (index + 1) / shares_);
    }
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

}  // namespace vtoken::model
