// CpuPool: every index of [0, n) visited exactly once per call, shares respecting min_share,
// calls back to back and after the workers went to sleep, and a pool destroyed right after use.
#include "lib/model/cpu_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

namespace vtoken::model {
namespace {

// Runs one call and checks that its ranges cover [0, n) once, each at least min_share long
// (all of it when n <= min_share), on at most num_threads threads.
void CheckCall(CpuPool& pool, int64_t n, int64_t min_share) {
  std::vector<std::atomic<int>> visits(static_cast<size_t>(n));
  std::mutex mutex;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  std::set<std::thread::id> threads;
  pool.ParallelFor(
      n,
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) visits[i].fetch_add(1);
        std::lock_guard<std::mutex> lock(mutex);
        ranges.emplace_back(begin, end);
        threads.insert(std::this_thread::get_id());
      },
      min_share);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(visits[i].load(), 1) << "index " << i << " of " << n;
  ASSERT_LE(static_cast<int>(ranges.size()), pool.num_threads());
  EXPECT_EQ(ranges.size(), threads.size());
  for (const auto& [begin, end] : ranges) {
    EXPECT_GE(end - begin, std::min(n, min_share)) << n << " split in " << ranges.size();
  }
}

TEST(CpuPoolTest, CoversEveryIndexOnceAcrossSizesAndThreadCounts) {
  for (int threads : {1, 2, 3, 8}) {
    CpuPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 7, 8, 64, 1000}) {
      for (int64_t min_share : {1, 4, 64}) {
        SCOPED_TRACE(testing::Message() << threads << " threads, n " << n << ", min " << min_share);
        CheckCall(pool, n, min_share);
      }
    }
  }
}

TEST(CpuPoolTest, UsesEveryThreadWhenTheWorkSplits) {
  CpuPool pool(4);
  std::set<std::thread::id> threads;
  std::mutex mutex;
  pool.ParallelFor(4, [&](int64_t, int64_t) {
    std::lock_guard<std::mutex> lock(mutex);
    threads.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(threads.size(), 4u);
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 1u);  // The caller takes a share.
}

TEST(CpuPoolTest, ManyCallsBackToBackAndAfterTheWorkersSlept) {
  const uint64_t seed = std::random_device()();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  CpuPool pool(3, /*spin_us=*/50);
  int64_t total = 0, expected = 0;
  for (int call = 0; call < 2000; ++call) {
    const int64_t n = static_cast<int64_t>(rng() % 100);
    std::atomic<int64_t> sum{0};
    pool.ParallelFor(n, [&](int64_t begin, int64_t end) {
      int64_t s = 0;
      for (int64_t i = begin; i < end; ++i) s += i;
      sum.fetch_add(s);
    });
    ASSERT_EQ(sum.load(), n * (n - 1) / 2) << "call " << call << ", n " << n;
    total += sum.load();
    expected += n * (n - 1) / 2;
    // Now and then, long enough for the workers to stop spinning and sleep on the futex.
    if (call % 400 == 399) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(total, expected);
}

TEST(CpuPoolTest, DestroyedRightAfterACallAndWhileAsleep) {
  for (int i = 0; i < 50; ++i) {
    CpuPool pool(4);
    std::atomic<int> calls{0};
    pool.ParallelFor(8, [&](int64_t, int64_t) { calls.fetch_add(1); });
    EXPECT_EQ(calls.load(), 4);
  }
  CpuPool sleeping(2, /*spin_us=*/0);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

}  // namespace
}  // namespace vtoken::model
