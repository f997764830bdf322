// Relocation: the kernels of lib/cuda/relocate.cu, compiled for the host against the CUDA emulator
// (cuda_emu.h) and called through RelocateRows, against RelocateRowsReference, on the GPU test's
// cases (tests/cuda/kv_layers_test_util.h) and more. Every path of the launcher: rows that are not
// whole 16-byte words (the scalar kernel, 4-byte or byte copies), the vector kernel's
// several-rows-per-pass and segmented long rows, unaligned layer bases (its word and byte
// fallbacks), grids smaller than the rows (grid-stride loops), layers and K / V that share one
// buffer, and random copy lists. Each check compares every byte of every buffer, so a stray write
// anywhere shows.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "lib/cuda/relocate.h"
#include "tests/cuda/kv_layers_test_util.h"
#include "tests/cuda_emu/cuda_emu.h"

namespace vtoken::cuda {
namespace {

using testing::HostKv;
using testing::PlannerShapedCopies;
using testing::RelocateCase;

// Relocates the case's copies with the emulated kernel on one HostKv and with the reference on
// another built alike, and expects every byte of every buffer to agree. Returns the launches.
std::vector<vtoken_emu::LaunchRecord> ExpectKernelMatchesReference(const RelocateCase& c,
                                                                   size_t misalign = 0,
                                                                   int32_t buffers = 0) {
  SCOPED_TRACE(c.label);
  HostKv expected(c.num_layers, c.num_slots, c.bytes_per_row, c.seed(), misalign, buffers);
  HostKv actual(c.num_layers, c.num_slots, c.bytes_per_row, c.seed(), misalign, buffers);
  vtoken_emu::TakeLaunchLog();
  const Status status = RelocateRows(actual.view, c.copies.data(), c.copies.size(), nullptr);
  EXPECT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(vtoken_emu::TakeLastFailure(), "");
  EXPECT_TRUE(RelocateRowsReference(expected.view, c.copies).ok());
  for (size_t b = 0; b < expected.storage.size(); ++b) {
    const auto [want, got] = std::mismatch(expected.storage[b].begin(), expected.storage[b].end(),
                                           actual.storage[b].begin());
    EXPECT_TRUE(want == expected.storage[b].end())
        << "buffer " << b << " differs first at byte " << (want - expected.storage[b].begin());
  }
  return vtoken_emu::TakeLaunchLog();
}

TEST(RelocateEmuTest, KernelMatchesReferenceOverBlockSizesAndRowWidths) {
  for (const RelocateCase& c : testing::RowWidthAndBlockSizeCases())
    ExpectKernelMatchesReference(c);
}

TEST(RelocateEmuTest, UnalignedLayerBasesTakeWordOrByteCopies) {
  for (int64_t row : {48, 2048, 4144}) {
    for (size_t misalign : {4, 1, 8}) {
      ExpectKernelMatchesReference(
          {.label = "row " + std::to_string(row) + " misaligned by " + std::to_string(misalign),
           .num_layers = 2,
           .num_slots = 70,
           .bytes_per_row = row,
           .copies = PlannerShapedCopies(10, 7)},
          misalign);
    }
  }
}

// The same bytes are copied once per alias; distinct rows never overlap.
TEST(RelocateEmuTest, LayersAndKvSharingABufferCopyEachRowAlike) {
  for (int64_t row : {20, 48, 4144}) {
    for (int32_t buffers : {1, 2, 3}) {
      ExpectKernelMatchesReference(
          {.label = "row " + std::to_string(row) + " buffers " + std::to_string(buffers),
           .num_layers = 3,
           .num_slots = 51,
           .bytes_per_row = row,
           .copies = PlannerShapedCopies(3, 17)},
          0, buffers);
    }
  }
}

// The launcher caps the grid at 8192 blocks of 8 warps; more rows (scalar kernel: a warp per
// row; vector kernel: 8 rows of 16 bytes per warp pass) wrap around the grid-stride loop.
TEST(RelocateEmuTest, RowsBeyondTheGridWrapAroundTheGridStrideLoop) {
  std::vector<SlotPair> copies;
  for (int64_t i = 0; i < 33000; ++i) copies.push_back({2 * i + 1, 2 * i});
  std::vector<vtoken_emu::LaunchRecord> launches =
      ExpectKernelMatchesReference({.label = "scalar kernel, 66000 rows",
                                    .num_layers = 1,
                                    .num_slots = 66000,
                                    .bytes_per_row = 20,
                                    .copies = copies});
  ASSERT_EQ(launches.size(), 1u);
  EXPECT_EQ(launches[0].grid.x, 8192u);
  copies.clear();
  for (int64_t i = 0; i < 270000; ++i) copies.push_back({2 * i, 2 * i + 1});
  launches = ExpectKernelMatchesReference({.label = "vector kernel, 540000 rows",
                                           .num_layers = 1,
                                           .num_slots = 540000,
                                           .bytes_per_row = 16,
                                           .copies = copies});
  ASSERT_EQ(launches.size(), 1u);
  EXPECT_EQ(launches[0].grid.x, 8192u);
}

// Random lists (no destination is a source or repeated: RelocateRows's contract), rows of any
// size and alignment, random thread schedules.
TEST(RelocateEmuTest, RandomCopyListsMatchReference) {
  const uint64_t seed = 20240614;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  constexpr size_t kMisalign[] = {0, 0, 0, 4, 1};
  for (int trial = 0; trial < 30; ++trial) {
    vtoken_emu::SetSchedule(static_cast<vtoken_emu::Schedule>(trial % 3), rng());
    const int64_t row = uniform(0, 1) == 0 ? uniform(1, 80) : 16 * uniform(1, 300);
    const int64_t slots = uniform(2, 200);
    std::vector<int64_t> order(static_cast<size_t>(slots));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<SlotPair> copies(static_cast<size_t>(uniform(1, slots / 2)));
    for (size_t i = 0; i < copies.size(); ++i) copies[i] = {order[i], order[copies.size() + i]};
    const size_t misalign = kMisalign[uniform(0, 4)];
    ExpectKernelMatchesReference(
        {.label = "trial " + std::to_string(trial) + " row " + std::to_string(row) + " copies " +
                  std::to_string(copies.size()) + " misalign " + std::to_string(misalign),
         .num_layers = static_cast<int32_t>(uniform(1, 4)),
         .num_slots = slots,
         .bytes_per_row = row,
         .copies = copies},
        misalign);
  }
  vtoken_emu::SetSchedule(vtoken_emu::Schedule::kForward);
}

}  // namespace
}  // namespace vtoken::cuda
