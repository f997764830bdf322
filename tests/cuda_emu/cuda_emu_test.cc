// The CPU emulator of CUDA (cuda_emu.h) itself: indices, barriers, warp shuffles, shared-memory
// poisoning, launch-configuration limits, the detection of barrier misuse, and the bf16 / fp16
// conversions bit for bit. The kernel tests (*_emu_test.cc) trust these semantics.
#include "tests/cuda_emu/cuda_emu.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "lib/cuda/paged_batch_attention.h"

namespace vtoken_emu {
namespace {

using vtoken::cuda::AttnDtype;

constexpr Schedule kSchedules[] = {Schedule::kForward, Schedule::kReverse, Schedule::kShuffled};

// Restores the default schedule after a test that changes it.
class EmulatorTest : public ::testing::Test {
 protected:
  void TearDown() override {
    SetSchedule(Schedule::kForward);
    TakeLaunchLog();
  }
};

__global__ void WriteIndices(int* out) {
  const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
  out[block * threads + thread] += static_cast<int>(block * threads + thread) + 1;
}

TEST_F(EmulatorTest, EveryThreadOfEveryBlockRunsOnceWithItsIndices) {
  for (Schedule schedule : kSchedules) {
    SetSchedule(schedule, 1);
    std::vector<int> out(2 * 3 * 2 * 4 * 5 * 3, 0);
    Launch(LaunchConfig(dim3(2, 3, 2), dim3(4, 5, 3)), WriteIndices, out.data());
    ASSERT_EQ(cudaGetLastError(), cudaSuccess) << TakeLastFailure();
    for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], static_cast<int>(i) + 1) << i;
  }
  const std::vector<LaunchRecord> log = TakeLaunchLog();
  ASSERT_EQ(log.size(), 3u);
  EXPECT_EQ(log[0].grid.y, 3u);
  EXPECT_EQ(log[0].block.z, 3u);
}

// Static shared memory of the test kernels, registered like a rewritten `__shared__`.
float shared_values[256];
const SharedArrays shared_registration(shared_values);

// out[t] = the value thread t + 1 wrote, with or without a barrier in between.
__global__ void ReadNeighbour(float* out, bool barrier) {
  const int t = static_cast<int>(threadIdx.x), n = static_cast<int>(blockDim.x);
  shared_values[t] = static_cast<float>(t) * 2.0f;
  if (barrier) __syncthreads();
  out[t] = shared_values[(t + 1) % n];
}

TEST_F(EmulatorTest, BarrierOrdersSharedWritesBeforeReadsInEverySchedule) {
  for (Schedule schedule : kSchedules) {
    SetSchedule(schedule, 2);
    std::vector<float> out(96);
    Launch(LaunchConfig(1, 96), ReadNeighbour, out.data(), true);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    for (int t = 0; t < 96; ++t) ASSERT_EQ(out[t], static_cast<float>((t + 1) % 96) * 2.0f);
  }
}

// The negative control of the barrier tests: without the barrier, the forward order makes every
// thread but the last read its neighbour's slot before the neighbour wrote it, and finds the
// poison (NaN) of the block's start; the reverse order happens to hide the bug.
TEST_F(EmulatorTest, MissingBarrierReadsPoisonInForwardOrder) {
  std::vector<float> out(64);
  SetSchedule(Schedule::kForward);
  Launch(LaunchConfig(1, 64), ReadNeighbour, out.data(), false);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (int t = 0; t < 63; ++t) EXPECT_TRUE(std::isnan(out[t])) << t;
  EXPECT_EQ(out[63], 0.0f);  // Thread 0 wrote slot 0 before thread 63 ran.
  SetSchedule(Schedule::kReverse);
  Launch(LaunchConfig(1, 64), ReadNeighbour, out.data(), false);
  for (int t = 0; t < 63; ++t) EXPECT_EQ(out[t], static_cast<float>(t + 1) * 2.0f) << t;
}

// out[lane] for each (lane_mask, width): __shfl_xor_sync of the value 100 * warp + lane.
__global__ void ShuffleXor(int* out, int lane_mask, int width) {
  const int t = static_cast<int>(threadIdx.x);
  out[t] = __shfl_xor_sync(0xffffffffu, 100 * (t / 32) + t % 32, lane_mask, width);
}

TEST_F(EmulatorTest, ShuffleXorReadsThePartnerLaneOrItsOwnPastTheGroup) {
  struct Case {
    int lane_mask, width;
  };
  for (Case c : {Case{1, 32}, Case{16, 32}, Case{5, 32}, Case{3, 4}, Case{4, 4}, Case{12, 8}}) {
    std::vector<int> out(64);
    Launch(LaunchConfig(1, 64), ShuffleXor, out.data(), c.lane_mask, c.width);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess) << TakeLastFailure();
    for (int t = 0; t < 64; ++t) {
      const int lane = t % 32, partner = lane ^ c.lane_mask;
      const int src = partner >= (lane / c.width + 1) * c.width ? lane : partner;
      ASSERT_EQ(out[t], 100 * (t / 32) + src)
          << "thread " << t << " lane_mask " << c.lane_mask << " width " << c.width;
    }
  }
}

// A butterfly sum per warp, three times in a row (the exchanges are double-buffered).
__global__ void WarpSums(double* out) {
  const int t = static_cast<int>(threadIdx.x);
  for (int round = 0; round < 3; ++round) {
    double v = t + 1000.0 * round;
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    out[3 * t + round] = v;
  }
}

TEST_F(EmulatorTest, ButterflySumsGiveEveryLaneTheWarpTotal) {
  for (Schedule schedule : kSchedules) {
    SetSchedule(schedule, 3);
    std::vector<double> out(3 * 128);
    Launch(LaunchConfig(1, 128), WarpSums, out.data());
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    for (int t = 0; t < 128; ++t) {
      const int first = t / 32 * 32;
      for (int round = 0; round < 3; ++round) {
        ASSERT_EQ(out[3 * t + round], 32.0 * first + 496.0 + 32000.0 * round) << t;
      }
    }
  }
}

__global__ void HalfTheBlockSkipsTheBarrier(int* out) {
  if (threadIdx.x >= 64) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void LastLaneSkipsTheShuffle(int* out) {
  if (threadIdx.x % 32 == 31) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
}

__global__ void HalfTheWarpAtABarrierHalfInAShuffle(int* out) {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
  }
}

TEST_F(EmulatorTest, BarrierOrShuffleMissedByAThreadFailsTheLaunch) {
  std::vector<int> out(128, 0);
  Launch(LaunchConfig(2, 128), HalfTheBlockSkipsTheBarrier, out.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(TakeLastFailure(),
            "block (0, 0, 0) of 128 threads: no thread can run: 64 at __syncthreads, 64 returned");
  Launch(LaunchConfig(1, 64), LastLaneSkipsTheShuffle, out.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(TakeLastFailure(),
            "block (0, 0, 0) of 64 threads: no thread can run: 0 at __syncthreads, 2 returned, "
            "warp 0: 31 of 32 lanes in a shuffle, warp 1: 31 of 32 lanes in a shuffle");
  Launch(LaunchConfig(1, 32), HalfTheWarpAtABarrierHalfInAShuffle, out.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(TakeLastFailure(),
            "block (0, 0, 0) of 32 threads: no thread can run: 16 at __syncthreads, 0 returned, "
            "warp 0: 16 of 32 lanes in a shuffle");
  EXPECT_EQ(out[0], 0);  // The failed blocks' threads past the barrier never ran.
  // The error was taken: the next launch runs clean.
  std::vector<float> values(64);
  Launch(LaunchConfig(1, 64), ReadNeighbour, values.data(), true);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(TakeLastFailure(), "");
}

__global__ void ShuffleWithPartialMask(int* out) {
  out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, 1, 1);
}

TEST_F(EmulatorTest, ShuffleByALaneOutsideItsMaskFailsTheLaunch) {
  std::vector<int> out(32, 0);
  Launch(LaunchConfig(1, 32), ShuffleWithPartialMask, out.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(TakeLastFailure(),
            "block (0, 0, 0) of 32 threads, thread 16: lane not in its own shuffle mask");
}

__global__ void Nothing() {}

TEST_F(EmulatorTest, LaunchesOutsideTheHardwareLimitsFail) {
  Launch(LaunchConfig(1, 1025), Nothing);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(TakeLastFailure(), "block (1025, 1, 1) outside the limits (1024 threads, z <= 64)");
  Launch(LaunchConfig(dim3(1, 65536), 32), Nothing);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(TakeLastFailure(),
            "grid (1, 65536, 1) outside the limits (x < 2^31, y and z <= 65535)");
  Launch(LaunchConfig(0, 32), Nothing);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  TakeLastFailure();
  Launch(LaunchConfig(1, 32, 64 << 10), Nothing);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(TakeLastFailure(), "65536 bytes of dynamic shared memory, past 49152");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorInvalidValue),
               "65536 bytes of dynamic shared memory, past 49152");
  Launch(LaunchConfig(1, 1024, 48 << 10), Nothing);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Block b reads its dynamic shared memory before writing b + 1 to it.
__global__ void ReadThenWriteDynamicShared(float* out) {
  float* const scratch = DynamicShared<float>();
  out[blockIdx.x * blockDim.x + threadIdx.x] = scratch[threadIdx.x];
  __syncthreads();
  scratch[threadIdx.x] = static_cast<float>(blockIdx.x + 1);
}

TEST_F(EmulatorTest, SharedMemoryIsPoisonedBeforeEveryBlock) {
  std::vector<float> out(3 * 32, 0.0f);
  Launch(LaunchConfig(3, 32, 32 * sizeof(float)), ReadThenWriteDynamicShared, out.data());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (float x : out) EXPECT_TRUE(std::isnan(x)) << x;  // Not the previous block's b + 1.
}

__global__ void AddOne(float* sum) { atomicAdd(sum, 1.0f); }

TEST_F(EmulatorTest, AtomicAddCountsEveryThread) {
  float sum = 0.5f;
  Launch(LaunchConfig(7, 96), AddOne, &sum);
  EXPECT_EQ(sum, 0.5f + 7 * 96);
}

// The conversions the kernels use against lib/cuda's own host conversions (the references'),
// two independent implementations of round-to-nearest-even.
TEST(EmulatorConversionTest, HalfToFloatIsExactForEveryBitPattern) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float fp16 = __half2float(__half{h});
    const float bf16 = __bfloat162float(__nv_bfloat16{h});
    const float want16 = vtoken::cuda::HalfBitsToFloat(h, AttnDtype::kFloat16);
    const float want_bf = vtoken::cuda::HalfBitsToFloat(h, AttnDtype::kBFloat16);
    if (std::isnan(want16)) {
      ASSERT_TRUE(std::isnan(fp16)) << bits;
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(fp16), std::bit_cast<uint32_t>(want16)) << bits;
    }
    if (std::isnan(want_bf)) {
      ASSERT_TRUE(std::isnan(bf16)) << bits;
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(bf16), std::bit_cast<uint32_t>(want_bf)) << bits;
    }
  }
}

TEST(EmulatorConversionTest, FloatToHalfRoundsToNearestEvenLikeTheReference) {
  const uint64_t seed = 20240612;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::vector<float> values = {0.0f,     -0.0f,    1.0f,         65504.0f, 65519.99f, 65520.0f,
                               1e30f,    INFINITY, -INFINITY,    0x1p-24f, 0x1p-25f,  0x1.8p-25f,
                               0x1p-26f, 0x1p-14f, 0x1.ffcp-15f, 1e-45f};
  // Every half and bf16 value, the midpoints to their neighbours (ties) and one float ulp around
  // the midpoints.
  for (AttnDtype t : {AttnDtype::kFloat16, AttnDtype::kBFloat16}) {
    for (uint32_t bits = 0; bits < 0xffff; ++bits) {
      const float a = vtoken::cuda::HalfBitsToFloat(static_cast<uint16_t>(bits), t);
      const float b = vtoken::cuda::HalfBitsToFloat(static_cast<uint16_t>(bits + 1), t);
      if (!std::isfinite(a) || !std::isfinite(b) || (bits & 0x7fff) == 0x7fff) continue;
      const float mid =
          std::bit_cast<float>((std::bit_cast<uint32_t>(a) + std::bit_cast<uint32_t>(b)) / 2);
      values.insert(values.end(), {a, mid, std::nextafter(mid, a), std::nextafter(mid, b)});
    }
  }
  std::mt19937 rng(seed);
  for (int i = 0; i < 100000; ++i) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    if (!std::isnan(f)) values.push_back(f);
  }
  for (float f : values) {
    ASSERT_EQ(__float2half_rn(f).__x, vtoken::cuda::FloatToHalfBits(f, AttnDtype::kFloat16))
        << std::hexfloat << f;
    ASSERT_EQ(__float2bfloat16(f).__x, vtoken::cuda::FloatToHalfBits(f, AttnDtype::kBFloat16))
        << std::hexfloat << f;
  }
  EXPECT_EQ(__float2half_rn(NAN).__x, 0x7fff);  // CUDA's canonical NaN.
  EXPECT_EQ(__float2bfloat16(NAN).__x, 0x7fff);
}

}  // namespace
}  // namespace vtoken_emu
