#include "lib/sim/cost_model.h"

#include <gtest/gtest.h>

namespace vtoken::sim {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// A small shape whose figures are easy to compute by hand.
model::ModelConfig SmallConfig() {
  model::ModelConfig c;
  c.vocab_size = 1000;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 4096;
  return c;
}

HardwareSpec RoundHardware() {
  HardwareSpec hw;
  hw.name = "round";
  hw.memory_bytes = 1e9;
  hw.hbm_bandwidth = 1e12;
  hw.peak_flops = 1e14;
  hw.memory_efficiency = 0.5;
  hw.compute_efficiency = 0.25;
  hw.copy_bandwidth = 1e11;
  hw.forward_overhead_s = 1e-4;
  return hw;
}

TEST(CostModelTest, ShapeFiguresByHand) {
  const ModelShape s = ShapeOf(SmallConfig(), 2);
  // Per layer: q 64x64, k and v 64x32 each, o 64x64 = 12288; MLP 3 x 64 x 128 = 24576; norms 128.
  // Embeddings 64000, lm_head 64000 (untied), final norm 64.
  EXPECT_EQ(s.parameters, 64000 + 2 * (12288 + 24576 + 128) + 64 + 64000);
  EXPECT_EQ(s.kv_bytes_per_token, 2 * 2 * 2 * 16 * 2);  // K and V, layers, kv heads, dim, bf16.
  EXPECT_EQ(s.embedding_parameters, 64000);
  EXPECT_EQ(s.lm_head_parameters, 64000);
}

TEST(CostModelTest, DecodeBatchIsMemoryBound) {
  const ModelShape s = ShapeOf(SmallConfig(), 2);
  const HardwareSpec hw = RoundHardware();
  // Two decoding sequences with 100 and 300 context tokens.
  const StepCost c = ForwardCost(s, hw, {{100, 1, true}, {300, 1, true}});
  const double weights = (s.parameters - 64000) * 2.0;
  const double kv = (100 + 2 + 300 + 2) * 256.0;
  EXPECT_DOUBLE_EQ(c.bytes, weights + kv);
  const double linear = s.parameters - 128000.0;
  const double attn = 4.0 * 2 * 4 * 16 * (1 * (100 + 1.0) + 1 * (300 + 1.0));
  EXPECT_DOUBLE_EQ(c.flops, 2 * linear * 2 + 2 * 64000.0 * 2 + attn);
  EXPECT_DOUBLE_EQ(c.memory_s, c.bytes / 5e11);
  EXPECT_DOUBLE_EQ(c.compute_s, c.flops / 2.5e13);
  EXPECT_GT(c.memory_s, c.compute_s);
  EXPECT_DOUBLE_EQ(c.forward_s, c.memory_s + 1e-4);
}

TEST(CostModelTest, PrefillChunkIsComputeBound) {
  const ModelShape s = ShapeOf(SmallConfig(), 2);
  const HardwareSpec hw = RoundHardware();
  // A 2048-token chunk over 1024 earlier tokens, not sampled.
  const StepCost c = ForwardCost(s, hw, {{1024, 2048, false}});
  const double linear = s.parameters - 128000.0;
  const double attn = 4.0 * 2 * 4 * 16 * 2048 * (1024 + 2049 / 2.0);
  EXPECT_DOUBLE_EQ(c.flops, 2 * linear * 2048 + attn);
  EXPECT_DOUBLE_EQ(c.bytes, (s.parameters - 64000) * 2.0 + (1024 + 2 * 2048) * 256.0);
  EXPECT_GT(c.compute_s, c.memory_s);
  EXPECT_DOUBLE_EQ(c.forward_s, c.compute_s + 1e-4);
}

TEST(CostModelTest, MixedBatchAndEmptyBatch) {
  const ModelShape s = ShapeOf(SmallConfig(), 2);
  const HardwareSpec hw = RoundHardware();
  const StepCost mixed = ForwardCost(s, hw, {{0, 512, true}, {700, 1, true}, {50, 1, true}});
  const double attn = 4.0 * 2 * 4 * 16 * (512 * (0 + 513 / 2.0) + (700 + 1.0) + (50 + 1.0));
  const double linear = s.parameters - 128000.0;
  EXPECT_DOUBLE_EQ(mixed.flops, 2 * linear * 514 + 2 * 64000.0 * 3 + attn);
  EXPECT_DOUBLE_EQ(ForwardCost(s, hw, {}).forward_s, 0);
  EXPECT_DOUBLE_EQ(CopySeconds(s, hw, 1000), 1000 * 256.0 / 1e11);
}

TEST(CostModelTest, PoolSizingLlama31On80GbH100ByHand) {
  const ModelShape s = ShapeOf(*model::SyntheticConfig("llama-3.1-8b"), 2);
  const HardwareSpec hw = *HardwarePreset("h100-sxm-80g");
  const StatusOr<PoolSizing> p = SizePool(s, hw, 0.35, 16, 16384);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const double budget = 79.19 * kGiB * 0.35;
  const double weights = 8030261248.0 * 2;
  const double activations = 16384.0 * (4 * 4096 + 3 * 14336) * 2;
  const double kv = budget - weights - activations - 0.35 * kGiB;
  EXPECT_EQ(p->block_bytes, 16 * 131072);
  EXPECT_EQ(p->num_blocks, static_cast<int64_t>(kv / (16 * 131072.0)));
  EXPECT_EQ(p->num_blocks, 5425);  // The paper reports 5,427 for vLLM on its H100.
  EXPECT_NE(p->Explain().find("5425 blocks"), std::string::npos);
}

TEST(CostModelTest, PoolSizingErrors) {
  const ModelShape s = ShapeOf(*model::SyntheticConfig("llama-3.1-8b"), 2);
  const HardwareSpec hw = *HardwarePreset("h100-sxm-80g");
  EXPECT_EQ(SizePool(s, hw, 0, 16, 16384).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SizePool(s, hw, 1.5, 16, 16384).status().code(), StatusCode::kInvalidArgument);
  const StatusOr<PoolSizing> none = SizePool(s, hw, 0.1, 16, 16384);  // Weights do not fit.
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("leaves no KV block"), std::string::npos);
}

TEST(CostModelTest, PresetsAndValidation) {
  for (const std::string& name : HardwarePresetNames()) {
    StatusOr<HardwareSpec> hw = HardwarePreset(name);
    ASSERT_TRUE(hw.ok()) << name;
    EXPECT_TRUE(ValidateHardware(*hw).ok()) << name;
  }
  EXPECT_EQ(HardwarePreset("tpu").status().code(), StatusCode::kNotFound);
  HardwareSpec bad = RoundHardware();
  bad.memory_efficiency = 1.5;
  EXPECT_EQ(ValidateHardware(bad).code(), StatusCode::kInvalidArgument);
  bad = RoundHardware();
  bad.copy_bandwidth = 0;
  EXPECT_NE(ValidateHardware(bad).message().find("copy_bandwidth"), std::string::npos);
}

}  // namespace
}  // namespace vtoken::sim
