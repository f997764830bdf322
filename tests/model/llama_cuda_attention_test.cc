// ForwardPaged on CUDA KV tensors (lib/cuda's batched attention kernel for decode rows and chunks
// under 16 tokens, torch ops for longer chunks, in one batch) against the CPU torch reference:
// logits, signals and the K/V rows written, at token and head granularity, with and without a
// sliding window, fp32 and bf16. Skips without a CUDA device or without lib/cuda.
//
// Built a second time as llama_cuda_attention_emu_test (VTOKEN_CUDA_EMULATION, tests/
// CMakeLists.txt): lib/model's sources on the CPU emulation of lib/cuda's kernels, where the
// "GPU" model is a CPU model whose KV tensors the emulated kernel attends over
// (CudaPagedAttention::OnHost), so this path (the step's one upload, the kernel's CSR binding,
// the shared signal sums, the torch-path chunk beside the kernel rows) runs in every ctest.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <numeric>
#include <optional>
#include <ostream>
#include <random>

#include "lib/model/llama.h"

#ifdef VTOKEN_CUDA_EMULATION
#include "lib/model/paged_cuda_attention.h"
#include "tests/cuda_emu/emu_launches.h"
#endif

namespace vtoken::model {
namespace {

ModelConfig Config(int64_t sliding_window) {
  ModelConfig c;
  c.vocab_size = 53;
  c.hidden_size = 64;
  c.intermediate_size = 40;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 2048;
  c.sliding_window = sliding_window;
  if (sliding_window > 0) c.model_type = "mistral";  // The only model type with a window.
  return c;
}

// A batch with a prefill without context, a long-context decode, a 17-token chunk (torch ops), a
// 6-token chunk (kernel) and a decode without context. Every KV group holds the same live set in
// its own slots: group g's slots for sequence s are consecutive from a per-group base.
std::vector<PagedSeqInput> Inputs(int32_t groups, const ModelConfig& c, std::mt19937_64& rng,
                                  int64_t* num_slots) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {0, 5}, {700, 1}, {33, 17}, {40, 6}, {0, 1}};
  int64_t per_group = 0;
  for (const auto& [ctx, n] : shapes) per_group += ctx + n;
  std::vector<int64_t> order(static_cast<size_t>(per_group));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);  // Scattered slots, one permutation per batch.
  std::vector<PagedSeqInput> inputs;
  int64_t next = 0;
  for (const auto& [ctx, n] : shapes) {
    PagedSeqInput in;
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t t = 0; t < ctx; ++t) in.context_slots.push_back(g * per_group + order[next + t]);
      for (int64_t t = 0; t < ctx; ++t) in.context_positions.push_back(t);
      in.context_offsets.push_back(g * ctx);
    }
    in.context_offsets.push_back(groups * ctx);
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t t = ctx; t < ctx + n; ++t)
        in.write_slots.push_back(g * per_group + order[next + t]);
    }
    for (int64_t i = 0; i < n; ++i) {
      in.tokens.push_back(static_cast<int32_t>(rng() % c.vocab_size));
      in.positions.push_back(ctx + i);
    }
    in.obs_window = 4;
    next += ctx + n;
    inputs.push_back(in);
  }
  *num_slots = groups * per_group;
  return inputs;
}

struct Case {
  Granularity granularity;
  torch::Dtype dtype;
  int64_t sliding_window;
  // The signals every sequence asks for: both, or the attention alone (as H2O does; on a GPU the
  // step then brings back no key norms).
  uint8_t signals = kAttnSignal | kKeyNormSignal;
};

// Keeps ctest's listing readable (gtest would print the struct's bytes).
void PrintTo(const Case& c, std::ostream* os) {
  *os << GranularityName(c.granularity) << " " << c10::toString(c.dtype) << " window "
      << c.sliding_window << ((c.signals & kKeyNormSignal) != 0 ? "" : " attention only");
}

class CudaAttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(CudaAttentionTest, MatchesTheCpuTorchReference) {
#ifndef VTOKEN_MODEL_CUDA_KERNELS
  GTEST_SKIP() << "built without lib/cuda (VTOKEN_MODEL_CUDA_KERNELS)";
#endif
#ifdef VTOKEN_CUDA_EMULATION
  const torch::Device kernel_device = torch::kCPU;  // The emulated kernel reads host memory.
#else
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device kernel_device = torch::kCUDA;
#endif
  const Case p = GetParam();
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  torch::NoGradGuard no_grad;
  const ModelConfig c = Config(p.sliding_window);
  auto cpu = LlamaModel::RandomInit(c, seed, {.fused_cpu_attention = false});
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  for (auto& [name, t] : cpu->NamedParameters()) {
    if (t.dim() == 2) t.mul_(3.0);  // Sharp attention, so errors in the kernel show.
  }
  auto gpu = LlamaModel::FromNamedTensors(
      c, cpu->NamedParameters(),
      {.compute_dtype = p.dtype, .device = kernel_device, .fused_cpu_attention = false});
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  int64_t num_slots = 0;
  const int32_t groups = NumKvGroups(p.granularity, c.num_hidden_layers, c.num_key_value_heads);
  std::vector<PagedSeqInput> inputs = Inputs(groups, c, rng, &num_slots);
  for (PagedSeqInput& in : inputs) in.signals = p.signals;
  auto kv_cpu = KvTensors::Create(cpu->KvOptions(num_slots, p.granularity));
  auto kv_gpu = KvTensors::Create(gpu->KvOptions(num_slots, p.granularity));
  ASSERT_TRUE(kv_cpu.ok() && kv_gpu.ok());
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    kv_cpu->k(l).normal_();
    kv_cpu->v(l).normal_();
    // Round the CPU copy through the GPU dtype so that both start from the same values.
    kv_gpu->k(l).copy_(kv_cpu->k(l));
    kv_gpu->v(l).copy_(kv_cpu->v(l));
    kv_cpu->k(l).copy_(kv_gpu->k(l).cpu());
    kv_cpu->v(l).copy_(kv_gpu->v(l).cpu());
  }
  auto want = cpu->ForwardPaged(inputs, *kv_cpu);
#ifdef VTOKEN_CUDA_EMULATION
  vtoken_emu::TakeLaunchCount();
  std::optional<internal::CudaPagedAttention::OnHost> on_host(std::in_place);
#endif
  auto got = gpu->ForwardPaged(inputs, *kv_gpu);
#ifdef VTOKEN_CUDA_EMULATION
  on_host.reset();
  // At least one attention launch per layer: the kernel, not the torch ops, attended.
  EXPECT_GE(vtoken_emu::TakeLaunchCount(), static_cast<size_t>(c.num_hidden_layers));
#endif
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  // fp32: GEMM order only. bf16: every activation rounded to 8 bits of mantissa on the GPU side.
  const bool fp32 = p.dtype == torch::kFloat32;
  const double logit_tol = fp32 ? 1e-4 : 5e-2, attn_tol = fp32 ? 1e-4 : 2e-2;
  for (size_t s = 0; s < inputs.size(); ++s) {
    SCOPED_TRACE("sequence " + std::to_string(s));
    const torch::Tensor& a = (*got)[s].last_logits;
    const torch::Tensor& b = (*want)[s].last_logits;
    EXPECT_LT((a - b).abs().max().item<double>() / b.abs().max().item<double>(), logit_tol);
    ASSERT_EQ((*got)[s].attn.size(), (*want)[s].attn.size());
    ASSERT_EQ((*got)[s].key_norm.size(), (*want)[s].attn.size());
    double attn_total = 0;
    for (float v : (*got)[s].attn) attn_total += v;
    EXPECT_GT(attn_total, 0.5) << "the attention signal came back";
    for (size_t j = 0; j < (*got)[s].attn.size(); ++j) {
      if ((p.signals & kKeyNormSignal) == 0) {
        ASSERT_EQ((*got)[s].key_norm[j], 0.0f) << "a key norm not asked for, key " << j;
      }
      EXPECT_NEAR((*got)[s].attn[j], (*want)[s].attn[j], attn_tol) << j;
      EXPECT_NEAR((*got)[s].key_norm[j], (*want)[s].key_norm[j],
                  attn_tol * (1.0 + (*want)[s].key_norm[j]))
          << j;
    }
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const double err =
        (kv_gpu->k(l).cpu().to(torch::kFloat32) - kv_cpu->k(l)).abs().max().item<double>() /
        kv_cpu->k(l).abs().max().item<double>();
    EXPECT_LT(err, fp32 ? 1e-5 : 1e-2) << "layer " << l;
  }
}

INSTANTIATE_TEST_SUITE_P(
    GranularityDtypeWindow, CudaAttentionTest,
    ::testing::Values(Case{Granularity::kToken, torch::kFloat32, 0},
                      Case{Granularity::kHead, torch::kFloat32, 0},
                      Case{Granularity::kToken, torch::kFloat32, 24},
                      Case{Granularity::kLayer, torch::kFloat32, 0},
                      Case{Granularity::kToken, torch::kBFloat16, 0},
                      Case{Granularity::kHead, torch::kBFloat16, 24},
                      Case{Granularity::kHead, torch::kFloat32, 0, kAttnSignal},
                      Case{Granularity::kToken, torch::kBFloat16, 0, kAttnSignal}));

}  // namespace
}  // namespace vtoken::model
