// TaskTeam (lib/engine/task_team.h): every index runs exactly once per call, on several threads
// when there are several, across many back-to-back calls, and nothing runs after a call returns.
#include "lib/engine/task_team.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace vtoken::engine {
namespace {

TEST(TaskTeamTest, EveryIndexRunsOncePerCall) {
  for (int threads : {1, 2, 3, 5}) {
    TaskTeam team(threads);
    EXPECT_EQ(team.num_threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 7, 64, 1000}) {
      for (int call = 0; call < 20; ++call) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        team.ParallelFor(n, [&](int64_t i) { hits[i].fetch_add(1); });
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(hits[i].load(), 1) << threads << " threads, n " << n << ", index " << i;
        }
      }
    }
  }
}

TEST(TaskTeamTest, WorkersTakePartAndFinishBeforeTheCallReturns) {
  TaskTeam team(3);
  std::mutex mutex;
  std::set<std::thread::id> seen;
  std::atomic<int> running{0};
  for (int call = 0; call < 50; ++call) {
    team.ParallelFor(64, [&](int64_t) {
      running.fetch_add(1);
      // Long enough that the workers wake up before the calling thread drains the indices.
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      {
        std::lock_guard<std::mutex> lock(mutex);
        seen.insert(std::this_thread::get_id());
      }
      running.fetch_sub(1);
    });
    ASSERT_EQ(running.load(), 0) << "call " << call;
  }
  EXPECT_EQ(seen.size(), 3u);
}

}  // namespace
}  // namespace vtoken::engine
