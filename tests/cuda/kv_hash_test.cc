// Per-token KV hash: the CPU reference against libxxhash and the core's TokenKvHash, the device
// algorithm compiled for the host against the reference (always), and the kernel against the
// reference (GPU only) on tests/cuda/kv_layers_test_util.h's cases, which the CPU emulation
// (tests/cuda_emu) runs too.
#include "lib/cuda/kv_hash.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <string>
#include <vector>

#include "lib/core/host_kv_store.h"
#include "lib/cuda/device.h"
#include "tests/cuda/kv_layers_test_util.h"

namespace vtoken::cuda {
namespace {

using testing::HostKv;
using testing::KvHashCase;

TEST(KvHashReferenceTest, EqualsOneShotXxh64OfTheConcatenatedRows) {
  HostKv kv(3, 5, 7, 1);
  for (int64_t slot = 0; slot < 5; ++slot) {
    std::vector<uint8_t> bytes;
    for (int32_t l = 0; l < 3; ++l) {
      bytes.insert(bytes.end(), kv.Row(false, l, slot), kv.Row(false, l, slot) + 7);
      bytes.insert(bytes.end(), kv.Row(true, l, slot), kv.Row(true, l, slot) + 7);
    }
    EXPECT_EQ(HashTokenRowsReference(kv.view, slot), XXH64(bytes.data(), bytes.size(), 0));
  }
}

TEST(KvHashReferenceTest, KnownVectorAllZeroRows) {
  // 1 layer, 16-byte rows of zeros: the hash of 32 zero bytes with seed 0.
  std::vector<uint8_t> zeros(16, 0);
  void* k = zeros.data();
  void* v = zeros.data();
  KvLayersView view{&k, &v, 1, 1, 16};
  const uint64_t expected = XXH64(std::vector<uint8_t>(32, 0).data(), 32, 0);
  EXPECT_EQ(HashTokenRowsReference(view, 0), expected);
  EXPECT_EQ(HashTokenRowsPortable(view, 0), expected);
}

TEST(KvHashReferenceTest, EqualsCoreTokenKvHashWhenTokenBytesAreKThenV) {
  const int32_t layers = 4;
  const int64_t slots = 17;
  const int64_t row = 24;
  HostKv kv(layers, slots, row, 2);
  HostKvStore store(layers, slots, 2 * row);
  for (int32_t l = 0; l < layers; ++l) {
    for (int64_t s = 0; s < slots; ++s) {
      std::memcpy(store.Token(l, s).data(), kv.Row(false, l, s), row);
      std::memcpy(store.Token(l, s).data() + row, kv.Row(true, l, s), row);
    }
  }
  for (int64_t s = 0; s < slots; ++s) {
    EXPECT_EQ(HashTokenRowsReference(kv.view, s), TokenKvHash(store, s)) << "slot " << s;
  }
}

// The device kernel's code, run on the host, over row sizes that hit every branch: rows shorter
// than a stripe, stripes straddling rows, the aligned fast path, and unaligned addresses.
TEST(KvHashPortableTest, MatchesReferenceOverOddSizesAndAlignments) {
  const uint64_t seed = 20240601;
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (int32_t layers : {1, 2, 5}) {
    for (int64_t row : {1, 3, 4, 7, 8, 17, 24, 32, 36, 64, 100, 2048}) {
      for (size_t misalign : {0, 1, 8}) {
        HostKv kv(layers, 7, row, seed + layers * 1000 + row, misalign);
        for (int64_t slot = 0; slot < 7; ++slot) {
          ASSERT_EQ(HashTokenRowsPortable(kv.view, slot), HashTokenRowsReference(kv.view, slot))
              << "layers " << layers << " row " << row << " misalign " << misalign << " slot "
              << slot;
        }
      }
    }
  }
}

TEST(KvHashPortableTest, DependsOnEveryLayerAndOnKAndV) {
  HostKv kv(3, 2, 32, 3);
  const uint64_t before = HashTokenRowsPortable(kv.view, 1);
  static_cast<uint8_t*>(kv.v[2])[32 + 31] ^= 1;  // Last byte of layer 2's V row of slot 1.
  EXPECT_NE(HashTokenRowsPortable(kv.view, 1), before);
  static_cast<uint8_t*>(kv.v[2])[32 + 31] ^= 1;
  static_cast<uint8_t*>(kv.k[0])[32] ^= 1;  // First byte of layer 0's K row of slot 1.
  EXPECT_NE(HashTokenRowsPortable(kv.view, 1), before);
}

TEST(KvHashTest, RejectsMalformedViewsAndCounts) {
  KvLayersView empty;
  Status status = HashTokenRows(empty, nullptr, 1, nullptr, nullptr);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("num_layers (0)"), std::string::npos) << status.message();
  HostKv kv(1, 1, 8, 4);
  status = HashTokenRows(kv.view, nullptr, -1, nullptr, nullptr);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("num_tokens -1 is negative"), std::string::npos);
  EXPECT_TRUE(HashTokenRows(kv.view, nullptr, 0, nullptr, nullptr).ok());  // Nothing to launch.
}

// Uploads a HostKv's layers and pointer arrays to the device.
struct DeviceKv {
  static StatusOr<DeviceKv> Upload(const HostKv& host) {
    DeviceKv kv;
    const int32_t layers = host.view.num_layers;
    const size_t bytes = host.view.num_slots * host.view.bytes_per_row;
    std::vector<void*> pointers(2 * layers);
    for (int32_t l = 0; l < layers; ++l) {
      for (int which = 0; which < 2; ++which) {
        VTOKEN_ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::Allocate(bytes));
        VTOKEN_RETURN_IF_ERROR(buffer.CopyFromHost(host.Row(which == 1, l, 0), bytes));
        pointers[which * layers + l] = buffer.data();
        kv.layers.push_back(std::move(buffer));
      }
    }
    VTOKEN_ASSIGN_OR_RETURN(kv.pointers, DeviceBuffer::Allocate(pointers.size() * sizeof(void*)));
    VTOKEN_RETURN_IF_ERROR(
        kv.pointers.CopyFromHost(pointers.data(), pointers.size() * sizeof(void*)));
    kv.view = host.view;
    kv.view.k_layers = kv.pointers.as<void*>();
    kv.view.v_layers = kv.pointers.as<void*>() + layers;
    return kv;
  }
  std::vector<DeviceBuffer> layers;
  DeviceBuffer pointers;
  KvLayersView view;
};

TEST(KvHashDeviceTest, KernelMatchesReference) {
  if (Status s = CudaDeviceStatus(); !s.ok()) GTEST_SKIP() << s.message();
  for (const KvHashCase& c : testing::KvHashKernelCases()) {
    SCOPED_TRACE(c.label);
    HostKv host(c.num_layers, c.num_slots, c.bytes_per_row, c.seed);
    StatusOr<DeviceKv> device = DeviceKv::Upload(host);
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    const int64_t tokens = static_cast<int64_t>(c.slots.size());
    StatusOr<DeviceBuffer> slots_d = DeviceBuffer::Allocate(tokens * sizeof(int64_t));
    StatusOr<DeviceBuffer> hashes_d = DeviceBuffer::Allocate(tokens * sizeof(uint64_t));
    ASSERT_TRUE(slots_d.ok() && hashes_d.ok());
    ASSERT_TRUE(slots_d->CopyFromHost(c.slots.data(), tokens * sizeof(int64_t)).ok());
    ASSERT_TRUE(HashTokenRows(device->view, slots_d->as<int64_t>(), tokens,
                              hashes_d->as<uint64_t>(), nullptr)
                    .ok());
    std::vector<uint64_t> hashes(tokens);
    ASSERT_TRUE(hashes_d->CopyToHost(hashes.data(), tokens * sizeof(uint64_t)).ok());
    for (int64_t i = 0; i < tokens; ++i) {
      ASSERT_EQ(hashes[i], HashTokenRowsReference(host.view, c.slots[i])) << "token " << i;
    }
  }
}

}  // namespace
}  // namespace vtoken::cuda
