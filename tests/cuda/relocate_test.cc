// Relocation: the CPU reference on host buffers (always), the kernel against the reference and
// the CudaCopyEngine's staging protocol (GPU only). Slots are laid out in blocks of block_size
// (1, 3, 7, 17) and copies follow the planner's shape: live tokens of sparse blocks move, in
// order, into fresh blocks. The kernel cases are tests/cuda/kv_layers_test_util.h's, which the CPU
// emulation (tests/cuda_emu) runs too.
#include "lib/cuda/relocate.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "lib/cuda/cuda_copy_engine.h"
#include "lib/cuda/device.h"
#include "lib/cuda/kv_hash.h"
#include "tests/cuda/kv_layers_test_util.h"

namespace vtoken::cuda {
namespace {

using testing::HostKv;
using testing::PlannerShapedCopies;
using testing::RelocateCase;

std::vector<uint64_t> AllHashes(const KvLayersView& view) {
  std::vector<uint64_t> hashes(view.num_slots);
  for (int64_t s = 0; s < view.num_slots; ++s) hashes[s] = HashTokenRowsReference(view, s);
  return hashes;
}

TEST(RelocateReferenceTest, MovesRowsInEveryLayerAndLeavesOthers) {
  for (int64_t block_size : {1, 3, 7, 17}) {
    HostKv kv(3, 8 * block_size, 12, block_size);
    const std::vector<uint64_t> before = AllHashes(kv.view);
    const std::vector<SlotPair> copies = PlannerShapedCopies(8, block_size);
    ASSERT_TRUE(RelocateRowsReference(kv.view, copies).ok());
    std::vector<uint64_t> expected = before;
    for (const SlotPair& c : copies) expected[c.dst] = before[c.src];
    EXPECT_EQ(AllHashes(kv.view), expected) << "block size " << block_size;
  }
}

TEST(RelocateReferenceTest, MovesATokenWithinItsBlock) {
  HostKv kv(2, 7, 5, 1);
  const std::vector<uint64_t> before = AllHashes(kv.view);
  ASSERT_TRUE(RelocateRowsReference(kv.view, std::vector<SlotPair>{{5, 2}}).ok());
  EXPECT_EQ(HashTokenRowsReference(kv.view, 2), before[5]);
  EXPECT_EQ(HashTokenRowsReference(kv.view, 5), before[5]);  // The source keeps its bytes.
}

TEST(RelocateReferenceTest, RejectsSlotsOutOfRangeNamingTheCopy) {
  HostKv kv(1, 4, 8, 1);
  const Status status = RelocateRowsReference(kv.view, std::vector<SlotPair>{{0, 1}, {2, 4}});
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "RelocateRowsReference: copy 1 (2 -> 4) is out of range [0, 4)");
}

TEST(RelocateTest, RejectsMalformedArgumentsBeforeLaunching) {
  HostKv kv(1, 4, 8, 1);
  KvLayersView no_rows = kv.view;
  no_rows.bytes_per_row = 0;
  EXPECT_EQ(RelocateRows(no_rows, nullptr, 1, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RelocateRows(kv.view, nullptr, -2, nullptr).message(),
            "RelocateRows: num_copies -2 is negative");
  EXPECT_EQ(RelocateRows(kv.view, nullptr, 1, nullptr).message(), "RelocateRows: copies is null");
  EXPECT_TRUE(RelocateRows(kv.view, nullptr, 0, nullptr).ok());  // Empty list: nothing launched.
}

#define SKIP_WITHOUT_GPU()                                                   \
  do {                                                                       \
    if (Status s = CudaDeviceStatus(); !s.ok()) GTEST_SKIP() << s.message(); \
  } while (0)

// Device copy of a HostKv's rows (layer pointer i, K of layer l is 2l and V 2l + 1, in its own
// buffer), with its own pointer arrays.
struct DeviceKv {
  explicit DeviceKv(const HostKv& host) : view(host.view) {
    const int32_t layers = host.view.num_layers;
    const size_t bytes = host.view.num_slots * host.view.bytes_per_row;
    for (int32_t i = 0; i < 2 * layers; ++i) {
      StatusOr<DeviceBuffer> buffer = DeviceBuffer::Allocate(bytes);
      EXPECT_TRUE(buffer.ok()) << buffer.status().ToString();
      EXPECT_TRUE(buffer->CopyFromHost(host.Row(i % 2 == 1, i / 2, 0), bytes).ok());
      (i % 2 == 0 ? k : v).push_back(buffer->data());
      layers_.push_back(std::move(*buffer));
    }
    std::vector<void*> pointers = k;
    pointers.insert(pointers.end(), v.begin(), v.end());
    StatusOr<DeviceBuffer> array = DeviceBuffer::Allocate(pointers.size() * sizeof(void*));
    EXPECT_TRUE(array.ok());
    pointers_ = std::move(*array);
    EXPECT_TRUE(pointers_.CopyFromHost(pointers.data(), pointers.size() * sizeof(void*)).ok());
    view.k_layers = pointers_.as<void*>();
    view.v_layers = pointers_.as<void*>() + layers;
  }
  // Copies the device layers' rows back into `host`'s.
  void Download(HostKv& host) const {
    const size_t bytes = host.view.num_slots * host.view.bytes_per_row;
    for (size_t i = 0; i < layers_.size(); ++i) {
      void* rows = (i % 2 == 0 ? host.k : host.v)[i / 2];
      EXPECT_TRUE(layers_[i].CopyToHost(rows, bytes).ok());
    }
  }
  std::vector<void*> k, v;  // Device layer pointers, host arrays.
  KvLayersView view;        // Device view.

 private:
  std::vector<DeviceBuffer> layers_;
  DeviceBuffer pointers_;
};

// Each check compares every byte of every buffer (rows and slack), so a stray write shows: the
// result is downloaded into a HostKv built like the expected one.
TEST(RelocateDeviceTest, KernelMatchesReferenceOverBlockSizesAndRowWidths) {
  SKIP_WITHOUT_GPU();
  for (const RelocateCase& c : testing::RowWidthAndBlockSizeCases()) {
    SCOPED_TRACE(c.label);
    HostKv expected(c.num_layers, c.num_slots, c.bytes_per_row, c.seed());
    DeviceKv device(expected);
    StatusOr<DeviceBuffer> list = DeviceBuffer::Allocate(c.copies.size() * sizeof(SlotPair));
    ASSERT_TRUE(list.ok());
    ASSERT_TRUE(list->CopyFromHost(c.copies.data(), c.copies.size() * sizeof(SlotPair)).ok());
    ASSERT_TRUE(RelocateRows(device.view, list->as<SlotPair>(), c.copies.size(), nullptr).ok());
    ASSERT_TRUE(RelocateRowsReference(expected.view, c.copies).ok());
    HostKv actual(c.num_layers, c.num_slots, c.bytes_per_row, c.seed());
    device.Download(actual);
    EXPECT_EQ(actual.storage, expected.storage);
  }
}

TEST(CudaCopyEngineTest, RejectsBadLayerLists) {
  SKIP_WITHOUT_GPU();
  std::vector<void*> one = {reinterpret_cast<void*>(0x1000)};
  std::vector<void*> none;
  EXPECT_EQ(CudaCopyEngine::Create(one, none, 4, 8).status().code(), StatusCode::kInvalidArgument);
  std::vector<void*> null_layer = {nullptr};
  EXPECT_EQ(CudaCopyEngine::Create(one, null_layer, 4, 8).status().message(),
            "CudaCopyEngine: layer 0 has a null K or V pointer");
}

TEST(CudaCopyEngineTest, SubmitWaitPollAndFenceMoveTheRightRows) {
  SKIP_WITHOUT_GPU();
  const int64_t block_size = 7;
  HostKv expected(4, 12 * block_size, 40, 11);
  DeviceKv device(expected);
  StatusOr<CudaStream> compute = CudaStream::Create();
  ASSERT_TRUE(compute.ok());
  CudaCopyEngineOptions options;
  options.compute_stream = compute->get();
  options.initial_staging_copies = 2;  // Forces the staging buffers to grow.
  StatusOr<std::unique_ptr<CudaCopyEngine>> engine =
      CudaCopyEngine::Create(device.k, device.v, 12 * block_size, 40, options);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  CudaCopyEngine& e = **engine;

  const std::vector<SlotPair> first = PlannerShapedCopies(12, block_size);
  std::vector<SlotCopy> first_copies;
  for (const SlotPair& c : first) first_copies.push_back({c.src, c.dst});
  const CopyTicket t1 = e.Submit(first_copies);
  const CopyTicket t2 = e.Submit({});        // Empty lists get tickets too.
  const CopyTicket t3 = e.Submit({{3, 2}});  // Within one block (block 0).
  EXPECT_EQ(t1, 1u);
  EXPECT_EQ(t2, 2u);
  EXPECT_EQ(t3, 3u);
  ASSERT_TRUE(e.MakeStreamWait(t3, compute->get()).ok());
  ASSERT_TRUE(compute->Synchronize().ok());  // The fence ordered the compute stream after t3...
  e.Wait(t3);                                // ...so this returns at once.
  EXPECT_TRUE(e.Poll(t1));
  EXPECT_EQ(e.num_in_flight(), 0);
  EXPECT_EQ(e.bytes_copied(), static_cast<int64_t>(first.size() + 1) * 4 * 2 * 40);

  ASSERT_TRUE(RelocateRowsReference(expected.view, first).ok());
  ASSERT_TRUE(RelocateRowsReference(expected.view, std::vector<SlotPair>{{3, 2}}).ok());
  HostKv actual(4, 12 * block_size, 40, 11);
  device.Download(actual);
  EXPECT_EQ(actual.storage, expected.storage);
}

// The device-side read fence with a delayed copy: the copy stream is held busy, the engine fences
// the compute stream (FenceConsumer, what the reclaimer calls) and returns at once, and a kernel
// on the compute stream hashes the destination row. Without the fence (the control) the kernel
// runs before the copy and sees the row's old bytes.
TEST(CudaCopyEngineTest, FenceConsumerOrdersAComputeKernelAfterADelayedCopy) {
  SKIP_WITHOUT_GPU();
  for (bool fence : {true, false}) {
    SCOPED_TRACE(fence ? "fenced" : "control without the fence");
    HostKv host(2, 64, 48, 21);
    DeviceKv device(host);
    StatusOr<CudaStream> compute = CudaStream::Create();
    ASSERT_TRUE(compute.ok());
    CudaCopyEngineOptions options;
    options.compute_stream = compute->get();
    StatusOr<std::unique_ptr<CudaCopyEngine>> engine =
        CudaCopyEngine::Create(device.k, device.v, 64, 48, options);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    CudaCopyEngine& e = **engine;
    const uint64_t source_hash = HashTokenRowsReference(host.view, 5);
    ASSERT_NE(source_hash, HashTokenRowsReference(host.view, 40));

    // Allocations and synchronous copies before the spin: they may synchronise the device. So
    // may the first launch of each kernel (CUDA loads modules lazily) and the engine's first
    // staging buffers: one copy (of rows the test does not read) and one hash warm them up.
    StatusOr<DeviceBuffer> slot = DeviceBuffer::Allocate(sizeof(int64_t));
    StatusOr<DeviceBuffer> hash = DeviceBuffer::Allocate(sizeof(uint64_t));
    ASSERT_TRUE(slot.ok() && hash.ok());
    const int64_t dst = 40;
    ASSERT_TRUE(slot->CopyFromHost(&dst, sizeof(dst)).ok());
    e.Wait(e.Submit({{6, 41}}));
    ASSERT_TRUE(
        HashTokenRows(device.view, slot->as<int64_t>(), 1, hash->as<uint64_t>(), compute->get())
            .ok());
    ASSERT_TRUE(compute->Synchronize().ok());
    ASSERT_TRUE(SpinStream(e.copy_stream(), 200000).ok());  // The copy starts 200 ms from now.
    const CopyTicket ticket = e.Submit({{5, 40}});
    if (fence) {
      EXPECT_TRUE(e.FenceConsumer(ticket));
      EXPECT_FALSE(e.Poll(ticket));  // The host did not wait for the copy.
    }
    ASSERT_TRUE(
        HashTokenRows(device.view, slot->as<int64_t>(), 1, hash->as<uint64_t>(), compute->get())
            .ok());
    ASSERT_TRUE(compute->Synchronize().ok());
    uint64_t seen = 0;
    ASSERT_TRUE(hash->CopyToHost(&seen, sizeof(seen)).ok());
    if (fence) {
      EXPECT_EQ(seen, source_hash);
    } else {
      EXPECT_NE(seen, source_hash);
    }
    e.Wait(ticket);
  }
}

TEST(CudaCopyEngineTest, TrySubmitRejectsInvalidListsWithoutFailingTheEngine) {
  SKIP_WITHOUT_GPU();
  HostKv host(1, 8, 16, 12);
  DeviceKv device(host);
  StatusOr<std::unique_ptr<CudaCopyEngine>> engine =
      CudaCopyEngine::Create(device.k, device.v, 8, 16);
  ASSERT_TRUE(engine.ok());
  CudaCopyEngine& e = **engine;
  EXPECT_EQ(e.TrySubmit(std::vector<SlotCopy>{{0, 8}}).status().message(),
            "CudaCopyEngine: copy 0 (0 -> 8) is out of range [0, 8)");
  EXPECT_EQ(e.TrySubmit(std::vector<SlotCopy>{{0, 5}, {1, 5}}).status().message(),
            "CudaCopyEngine: slot 5 is the destination of two copies");
  EXPECT_EQ(e.TrySubmit(std::vector<SlotCopy>{{0, 5}, {5, 6}}).status().message(),
            "CudaCopyEngine: slot 5 is both a source and a destination");
  EXPECT_EQ(e.TryPoll(1).status().message(),
            "CudaCopyEngine: ticket 1 was never issued (last issued: 0)");
  StatusOr<CopyTicket> ticket = e.TrySubmit(std::vector<SlotCopy>{{0, 5}});
  ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
  EXPECT_EQ(*ticket, 1u);
  EXPECT_TRUE(e.TryWait(*ticket).ok());
}

TEST(CudaCopyEngineTest, ManyInFlightTicketsCompleteInOrder) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = 77;
  SCOPED_TRACE("seed " + std::to_string(seed));
  HostKv expected(2, 512, 64, seed);
  DeviceKv device(expected);
  StatusOr<std::unique_ptr<CudaCopyEngine>> engine =
      CudaCopyEngine::Create(device.k, device.v, 512, 64);
  ASSERT_TRUE(engine.ok());
  std::mt19937_64 rng(seed);
  // Each round copies fresh rows into a disjoint destination range; later rounds read earlier
  // rounds' destinations, so the stream order matters.
  std::vector<CopyTicket> tickets;
  for (int64_t round = 0; round < 8; ++round) {
    std::vector<SlotPair> pairs;
    for (int64_t i = 0; i < 32; ++i) {
      const int64_t src =
          round == 0 ? static_cast<int64_t>(rng() % 256) : 256 + (round - 1) * 32 + i;
      pairs.push_back({src, 256 + round * 32 + i});
    }
    std::vector<SlotCopy> copies;
    for (const SlotPair& p : pairs) copies.push_back({p.src, p.dst});
    tickets.push_back((*engine)->Submit(copies));
    ASSERT_TRUE(RelocateRowsReference(expected.view, pairs).ok());
  }
  (*engine)->Wait(tickets.back());
  for (CopyTicket t : tickets) EXPECT_TRUE((*engine)->Poll(t));
  HostKv actual(2, 512, 64, seed);
  device.Download(actual);
  EXPECT_EQ(actual.storage, expected.storage);
}

}  // namespace
}  // namespace vtoken::cuda
