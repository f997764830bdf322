// CpuPool: a fixed team of threads for the fused CPU step (llama_paged_cpu.cc). ParallelFor(n, fn)
// cuts [0, n) into one contiguous share per thread, runs the first share on the calling thread
// and the others on the workers, and returns when every share is done.
//
// A decode step makes about five such calls per layer, each only a few to a few hundred
// microseconds of work. Between calls a worker spins for a bounded time (`spin_us`) before it
// sleeps on a futex, so that the next call of the same step reaches it in the time of a
// cache-line transfer instead of a wake-up: torch's OpenMP pool, under the PASSIVE wait policy
// the runtime sets (OpenMP and OpenBLAS threads spinning against each other on a small machine),
// sleeps at once and pays tens of microseconds per call, more than a small step's work.
//
// Thread safety: one ParallelFor at a time per pool (a mutex serialises callers); fn must not call
// ParallelFor of the same pool. The workers start in the constructor and stop in the destructor.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace vtoken::model {

class CpuPool {
 public:
  // num_threads >= 1 counts the calling thread: num_threads - 1 workers.
  explicit CpuPool(int num_threads, int spin_us = 200);
  ~CpuPool();
  CpuPool(const CpuPool&) = delete;
  CpuPool& operator=(const CpuPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) on disjoint ranges that cover [0, n), each at least `min_share` long
  // (fewer threads take part when n is small); returns when all have returned. n <= min_share
  // runs fn(0, n) on the calling thread alone.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                   int64_t min_share = 1);

 private:
  void Work(int index);

  const int spin_us_;
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;
  // The job of the current call. Published by a release increment of generation_, read by the
  // workers after an acquire load of it.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int shares_ = 1;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};  // Worker shares of the current call not yet done.
  std::atomic<bool> stop_{false};
};

}  // namespace vtoken::model
