// The reclaimer's read fence through CopyEngine::FenceConsumer, with a copy engine that behaves
// like a GPU's: copies run on a "copy stream" (a worker thread held at a gate, so a copy is
// pending for as long as the test wants), and the reads run on a "consumer stream" (a second
// worker thread, the forward pass's kernels). A device fence is a wait queued on the consumer
// stream; the host goes on. The consumer's reads fail (wrong bytes) when the fence is skipped,
// which a control case shows.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "lib/core/check_harness.h"
#include "lib/core/copy_engine.h"
#include "lib/core/host_kv_store.h"
#include "lib/core/reclaimer.h"
#include "lib/core/virtual_kv_cache.h"

namespace vtoken {
namespace {

// One in-order queue of tasks on its own thread.
class TaskQueue {
 public:
  TaskQueue() : worker_([this] { Run(); }) {}
  ~TaskQueue() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  void Push(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_all();
  }
  bool Idle() {
    std::lock_guard<std::mutex> lock(mu_);
    return tasks_.empty() && !busy_;
  }
  // Blocks until every task pushed so far ran.
  void Sync() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [&] { return tasks_.empty() && !busy_; });
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      busy_ = true;
      lock.unlock();
      task();
      lock.lock();
      busy_ = false;
      idle_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void()>> tasks_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread worker_;  // Last: starts after the members it uses.
};

// Copies on the copy queue once the gate is open; FenceConsumer queues a wait on the consumer.
class StreamCopyEngine final : public CopyEngine {
 public:
  explicit StreamCopyEngine(HostKvStore& store) : store_(store) {}
  ~StreamCopyEngine() override {
    OpenGate();
    copy_queue_.Sync();
    consumer_.Sync();
  }

  CopyTicket Submit(std::vector<SlotCopy> copies) override {
    const CopyTicket ticket = next_++;
    copy_queue_.Push([this, ticket, copies = std::move(copies)] {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return gate_open_; });
      store_.CopySlots(copies);
      bytes_ +=
          static_cast<int64_t>(copies.size()) * store_.num_layers() * store_.bytes_per_token();
      completed_ = ticket;
      cv_.notify_all();
    });
    return ticket;
  }
  void Wait(CopyTicket ticket) override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return completed_ >= ticket; });
  }
  bool Poll(CopyTicket ticket) override {
    std::lock_guard<std::mutex> lock(mu_);
    return completed_ >= ticket;
  }
  int64_t bytes_copied() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return bytes_;
  }
  bool FenceConsumer(CopyTicket ticket) override {
    ++fences_;
    consumer_.Push([this, ticket] {
      stalled_ = true;
      Wait(ticket);
      stalled_ = false;
    });
    return true;
  }
  // Blocks until the consumer either ran everything queued or stalls in a fence: then a read
  // queued after the fence cannot have run before the copy.
  void WaitConsumerIdleOrStalled() {
    while (!consumer_.Idle() && !stalled_)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  void OpenGate() {
    std::lock_guard<std::mutex> lock(mu_);
    gate_open_ = true;
    cv_.notify_all();
  }
  TaskQueue& consumer() { return consumer_; }
  int fences() const { return fences_; }

 private:
  HostKvStore& store_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool gate_open_ = false;
  CopyTicket next_ = 1;
  CopyTicket completed_ = 0;
  int64_t bytes_ = 0;
  int fences_ = 0;
  std::atomic<bool> stalled_{false};
  TaskQueue consumer_;
  TaskQueue copy_queue_;  // Declared last, destroyed first: its tasks use the members above.
};

constexpr int64_t kBlockSize = 16;
constexpr int64_t kTokens = 64;

// Two sequences of 64 tokens in a pool of 16-slot blocks, every slot's bytes distinct; sequence
// 0 keeps every 4th token (its blocks are worth repacking), sequence 1 keeps all of its tokens.
struct Fixture {
  Fixture()
      : store(2, 64 * kBlockSize, 16),
        cache(CacheOptions{
            .mode = Mode::kVtoken,
            .pool = {.num_blocks = 64, .block_size = kBlockSize, .headroom_blocks = 4}}) {
    for (int32_t layer = 0; layer < store.num_layers(); ++layer) {
      for (SlotIndex s = 0; s < store.num_slots(); ++s) {
        FillContent(1000 + s, layer, store.Token(layer, s));
      }
    }
    for (int i = 0; i < 2; ++i) {
      seqs.push_back(cache.AddSequence());
      EXPECT_TRUE(cache.SyncNewTokens(seqs.back(), kTokens).ok());
    }
    for (TokenId t = 0; t < kTokens; ++t) {
      if (t % 4 != 0) EXPECT_TRUE(cache.EvictToken(seqs[0], t).ok());
    }
  }
  // The hashes of `seq`'s live tokens, in logical order, read at the slots the table names now.
  std::vector<uint64_t> Read(SeqId seq) const {
    std::vector<uint64_t> hashes;
    for (SlotIndex slot : cache.LiveSlots(seq)) hashes.push_back(TokenKvHash(store, slot));
    return hashes;
  }

  HostKvStore store;
  VirtualKvCache cache;
  std::vector<SeqId> seqs;
};

ReclaimOptions Always() {
  ReclaimOptions o;
  o.trigger = ReclaimOptions::Trigger::kAlways;
  return o;
}

TEST(DeviceFenceTest, OrdersTheConsumersReadsWithoutBlockingTheHost) {
  Fixture f;
  const std::vector<uint64_t> expected = f.Read(f.seqs[0]);
  StreamCopyEngine engine(f.store);
  Reclaimer reclaimer(f.cache, engine, Always(), f.store.num_layers() * f.store.bytes_per_token());
  StatusOr<int64_t> moved = reclaimer.Step();
  ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  ASSERT_GT(*moved, 0);
  const int32_t free_before = f.cache.pool().num_free_blocks();

  StatusOr<bool> fenced = reclaimer.FenceForRead(f.seqs[0]);
  ASSERT_TRUE(fenced.ok()) << fenced.status().ToString();
  EXPECT_TRUE(*fenced);
  // The copy is still held at the gate: the host did not wait for it, and the sources stay
  // pinned until it completes.
  EXPECT_FALSE(engine.Poll(1));
  EXPECT_EQ(reclaimer.num_in_flight(), 1);
  EXPECT_EQ(f.cache.pool().num_free_blocks(), free_before);
  // The untouched sequence needs no fence.
  StatusOr<bool> other = reclaimer.FenceForRead(f.seqs[1]);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(*other);

  std::vector<uint64_t> read;
  engine.consumer().Push([&] { read = f.Read(f.seqs[0]); });  // The next forward's reads.
  engine.WaitConsumerIdleOrStalled();
  engine.OpenGate();
  engine.consumer().Sync();
  EXPECT_EQ(read, expected);

  ASSERT_TRUE(reclaimer.Poll().ok());
  EXPECT_EQ(reclaimer.num_in_flight(), 0);
  EXPECT_GT(f.cache.pool().num_free_blocks(), free_before);  // Sources freed once it completed.
  EXPECT_TRUE(f.cache.CheckInvariants().ok());
  EXPECT_EQ(reclaimer.stats().fence_waits, 1);
  EXPECT_EQ(reclaimer.stats().device_fences, 1);
  EXPECT_EQ(reclaimer.stats().host_fence_waits, 0);
}

// The control: the same reads without the fence see the destinations before the copy.
TEST(DeviceFenceTest, ReadsWithoutTheFenceSeeStaleDestinations) {
  Fixture f;
  const std::vector<uint64_t> expected = f.Read(f.seqs[0]);
  StreamCopyEngine engine(f.store);
  Reclaimer reclaimer(f.cache, engine, Always(), f.store.num_layers() * f.store.bytes_per_token());
  ASSERT_TRUE(reclaimer.Step().ok());
  std::vector<uint64_t> read;
  engine.consumer().Push([&] { read = f.Read(f.seqs[0]); });
  engine.consumer().Sync();
  EXPECT_NE(read, expected);
  engine.OpenGate();
  ASSERT_TRUE(reclaimer.Drain().ok());
  EXPECT_EQ(f.Read(f.seqs[0]), expected);
}

TEST(DeviceFenceTest, OneDeviceFencePerTicket) {
  Fixture f;
  StreamCopyEngine engine(f.store);
  Reclaimer reclaimer(f.cache, engine, Always(), f.store.num_layers() * f.store.bytes_per_token());
  ASSERT_TRUE(reclaimer.Step().ok());
  for (int step = 0; step < 3; ++step) {  // Three steps read the sequence before the copy ends.
    StatusOr<bool> fenced = reclaimer.FenceForRead(f.seqs[0]);
    ASSERT_TRUE(fenced.ok());
    EXPECT_TRUE(*fenced);
  }
  EXPECT_EQ(engine.fences(), 1);  // The consumer's stream already waits for the ticket.
  EXPECT_EQ(reclaimer.stats().fence_waits, 3);
  EXPECT_EQ(reclaimer.stats().device_fences, 3);
  engine.OpenGate();
  ASSERT_TRUE(reclaimer.Drain().ok());
}

// A fork made while the copy is in flight shares the parent's new (pending) block: the child's
// reads are fenced on the parent's relocation although that relocation never names the child.
TEST(DeviceFenceTest, AForkSharingAPendingBlockIsFencedOnItsParentsCopy) {
  Fixture f;
  // Sequence 0 grows a full, live fifth block, so the repacked block is not its open tail and a
  // fork shares it by reference.
  ASSERT_TRUE(f.cache.SyncNewTokens(f.seqs[0], kBlockSize).ok());
  const std::vector<uint64_t> expected = f.Read(f.seqs[0]);
  StreamCopyEngine engine(f.store);
  Reclaimer reclaimer(f.cache, engine, Always(), f.store.num_layers() * f.store.bytes_per_token());
  StatusOr<int64_t> moved = reclaimer.Step();
  ASSERT_TRUE(moved.ok() && *moved > 0);
  StatusOr<ForkResult> fork = f.cache.ForkSequence(f.seqs[0], kTokens + kBlockSize);
  ASSERT_TRUE(fork.ok()) << fork.status().ToString();
  f.store.CopySlots(fork->copies);  // The unshared tail (not pending: it was not relocated).
  ASSERT_TRUE(f.cache.HasPendingReads(fork->child));

  StatusOr<bool> fenced = reclaimer.FenceForRead(fork->child);
  ASSERT_TRUE(fenced.ok()) << fenced.status().ToString();
  EXPECT_TRUE(*fenced);
  EXPECT_EQ(engine.fences(), 1);
  EXPECT_FALSE(engine.Poll(1));
  std::vector<uint64_t> read;
  engine.consumer().Push([&] { read = f.Read(fork->child); });
  engine.WaitConsumerIdleOrStalled();
  engine.OpenGate();
  engine.consumer().Sync();
  EXPECT_EQ(read, expected);
  ASSERT_TRUE(reclaimer.Drain().ok());
  EXPECT_TRUE(f.cache.CheckInvariants().ok());
}

// An engine without a device queue (the default FenceConsumer) fences on the host: the copy is
// done and the relocation completed when FenceForRead returns.
TEST(DeviceFenceTest, HostEnginesWaitAndComplete) {
  Fixture f;
  const std::vector<uint64_t> expected = f.Read(f.seqs[0]);
  AsyncHostCopyEngine engine(f.store, /*delay_us=*/20000);
  Reclaimer reclaimer(f.cache, engine, Always(), f.store.num_layers() * f.store.bytes_per_token());
  ASSERT_TRUE(reclaimer.Step().ok());
  ASSERT_EQ(reclaimer.num_in_flight(), 1);
  StatusOr<bool> fenced = reclaimer.FenceForRead(f.seqs[0]);
  ASSERT_TRUE(fenced.ok());
  EXPECT_TRUE(*fenced);
  EXPECT_EQ(reclaimer.num_in_flight(), 0);
  EXPECT_EQ(f.Read(f.seqs[0]), expected);
  EXPECT_EQ(reclaimer.stats().host_fence_waits, 1);
  EXPECT_EQ(reclaimer.stats().device_fences, 0);
  EXPECT_TRUE(f.cache.CheckInvariants().ok());
}

}  // namespace
}  // namespace vtoken
