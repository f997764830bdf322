// CheckRunMemory (apps/vtoken-cli/run/run_checks.h), the preflight `run` makes before anything is
// loaded: on the host the KV store, pool metadata, weights and requests against host memory; on
// a GPU the KV store and weights against the device's free bytes and the rest against the host,
// each refusal naming the key to change and where it did not fit. Memory sizes are injected, so
// the GPU cases run here without a GPU.
#include "apps/vtoken-cli/run/run_checks.h"

#include <gtest/gtest.h>

#include <string>

#include "lib/core/memory_budget.h"

namespace vtoken::cli {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// synthetic:llama-3.1-8b in bf16 with a pool of `blocks` x 16 slots: 128 KiB of K and V per slot
// (32 layers x 8 KV heads x 128 x 2 x 2 bytes), about 15 GiB of weights.
ExperimentConfig EightB(int32_t blocks, const std::string& device) {
  ExperimentConfig c;
  c.file = "exp.toml";
  c.model = "synthetic:llama-3.1-8b";
  c.model_dtype = "bfloat16";
  c.model_device = device;
  c.engine.pool.num_blocks = blocks;
  c.engine.pool.block_size = 16;
  c.workload.num_requests = 16;
  return c;
}

model::ModelConfig Shape(const ExperimentConfig& c) {
  StatusOr<model::ModelConfig> m = PeekModelConfig(c.model);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return *m;
}

// 2^15 blocks x 16 slots x 128 KiB = 64 GiB of KV store, plus about 15 GiB of weights.
constexpr int32_t kBlocks64GiB = 1 << 15;

TEST(CheckRunMemoryTest, OnTheCpuEverythingIsCheckedAgainstTheHost) {
  const ExperimentConfig c = EightB(kBlocks64GiB, "cpu");
  EXPECT_TRUE(CheckRunMemory(c, Shape(c), 100 * kGiB).ok());
  const Status s = CheckRunMemory(c, Shape(c), 70 * kGiB);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("exp.toml: engine.num_blocks = 32768: the KV store (32768 x 16 "
                             "slots x 131072 bytes) and weights needs"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("70.0 GiB of memory available"), std::string::npos) << s.message();
}

TEST(CheckRunMemoryTest, OnAGpuTheStoreAndWeightsAreCheckedAgainstTheDevice) {
  const ExperimentConfig c = EightB(kBlocks64GiB, "cuda:0");
  // 139 GiB free on the device, 20 GiB on the host: fits (the host check alone would refuse).
  EXPECT_TRUE(CheckRunMemory(c, Shape(c), 20 * kGiB, 139 * kGiB).ok());
  EXPECT_FALSE(CheckRunMemory(c, Shape(c), 20 * kGiB).ok());
  // 70 GiB free on the device: refused there, naming the device.
  const Status s = CheckRunMemory(c, Shape(c), 500 * kGiB, 70 * kGiB);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("engine.num_blocks = 32768: the KV store"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("and weights on cuda:0 needs"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("70.0 GiB of memory available"), std::string::npos) << s.message();
}

TEST(CheckRunMemoryTest, OnAGpuTheRequestsAndPoolMetadataAreCheckedAgainstTheHost) {
  ExperimentConfig c = EightB(kBlocks64GiB, "cuda");
  const int64_t host_needs =
      engine::WorkloadBytes(c.workload) + PoolMetadataBytes(kBlocks64GiB, 16);
  EXPECT_TRUE(CheckRunMemory(c, Shape(c), host_needs, 139 * kGiB).ok());
  const Status s = CheckRunMemory(c, Shape(c), host_needs - 1, 139 * kGiB);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("exp.toml: workload.num_requests = 16: the requests ("),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("with the pool's metadata, on the host needs"), std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace vtoken::cli
