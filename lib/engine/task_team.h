// TaskTeam: a fixed team of threads for the engine's per-sequence host work between two model
// steps (the policy's observation and victim selection, independent across sequences).
// ParallelFor(n, fn) calls fn(i) for every i in [0, n) on the team and the calling thread, each
// index once, in no particular order and with dynamic scheduling (sequences differ in length),
// and returns when all have returned.
//
// The workers sleep on a condition variable between calls: a call costs a wake-up (tens of
// microseconds), which the work it is for (O(live tokens x KV groups) per step) repays; callers
// run small work inline.
//
// Thread safety: one ParallelFor at a time (a mutex serialises callers); fn must not call
// ParallelFor of the same team. The workers start in the constructor and stop in the destructor.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace vtoken::engine {

class TaskTeam {
 public:
  // num_threads >= 1 counts the calling thread: num_threads - 1 workers.
  explicit TaskTeam(int num_threads);
  ~TaskTeam();
  TaskTeam(const TaskTeam&) = delete;
  TaskTeam& operator=(const TaskTeam&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  void Work();
  // Takes indices of the current call until none is left.
  void Drain();

  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // One call at a time.
  std::mutex mutex_;       // Guards everything below but next_.
  std::condition_variable wake_, done_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  uint64_t generation_ = 0;
  int busy_ = 0;  // Workers inside the current call.
  bool stop_ = false;
  std::atomic<int64_t> next_{0};
};

}  // namespace vtoken::engine
