// Per-token KV hash: the kernel of lib/cuda/kv_hash.cu, compiled for the host against the CUDA
// emulator (cuda_emu.h) and called through HashTokenRows, against libxxhash's streaming XXH64
// (HashTokenRowsReference), on the GPU test's cases (tests/cuda/kv_layers_test_util.h): row
// sizes that take every branch of xxh64_rows.h (shorter than a stripe, stripes straddling rows,
// the aligned 64-bit path) and more tokens than one block of threads; here also unaligned layers.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lib/cuda/kv_hash.h"
#include "tests/cuda/kv_layers_test_util.h"
#include "tests/cuda_emu/cuda_emu.h"

namespace vtoken::cuda {
namespace {

using testing::HostKv;
using testing::KvHashCase;

// The GPU test's cases (tests/cuda/kv_layers_test_util.h), with the layers also unaligned.
TEST(KvHashEmuTest, KernelMatchesReference) {
  for (const KvHashCase& c : testing::KvHashKernelCases()) {
    for (size_t misalign : {0, 1, 8}) {
      SCOPED_TRACE(c.label + " misalign " + std::to_string(misalign));
      HostKv host(c.num_layers, c.num_slots, c.bytes_per_row, c.seed, misalign);
      const int64_t tokens = static_cast<int64_t>(c.slots.size());
      std::vector<uint64_t> hashes(tokens + 1, 0);  // One past the end: must stay untouched.
      vtoken_emu::TakeLaunchLog();
      const Status status =
          HashTokenRows(host.view, c.slots.data(), tokens, hashes.data(), nullptr);
      ASSERT_TRUE(status.ok()) << status.ToString();
      ASSERT_EQ(vtoken_emu::TakeLastFailure(), "");
      const std::vector<vtoken_emu::LaunchRecord> launches = vtoken_emu::TakeLaunchLog();
      ASSERT_EQ(launches.size(), 1u);
      EXPECT_EQ(launches[0].grid.x, static_cast<unsigned>((tokens + 127) / 128));  // 128 threads.
      for (int64_t i = 0; i < tokens; ++i) {
        ASSERT_EQ(hashes[i], HashTokenRowsReference(host.view, c.slots[i])) << "token " << i;
      }
      EXPECT_EQ(hashes[tokens], 0u);
    }
  }
}

}  // namespace
}  // namespace vtoken::cuda
