// The chain from the GPU kernel to the CPU runtime: lib/cuda's batched paged attention reference
// (which tests/cuda/paged_batch_attention_test.cc holds the kernel to) computes what lib/model's
// CpuPagedAttention computes, outputs and signals, on random fp32 batches with GQA, several key
// ranges per sequence, per-head slots, sliding windows, prefill chunks, decode rows and skips.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#ifdef VTOKEN_MODEL_CUDA_KERNELS
#include "lib/cuda/paged_batch_attention.h"
#include "lib/model/cpu_paged_attention.h"
#include "tests/cuda/paged_batch_test_util.h"
#endif

namespace vtoken::model {
namespace {

#ifdef VTOKEN_MODEL_CUDA_KERNELS
using cuda::testing::BatchProblem;
using cuda::testing::BatchShape;
using cuda::testing::SeqSpec;

// CpuPagedAttention's view of the problem's host arrays, writing to `out`, `attn`, `norm`.
CpuAttentionBatch CpuBatchOf(BatchProblem& p, float* out, float* attn, float* norm) {
  const cuda::PagedBatchArgs& a = p.args;
  return CpuAttentionBatch{.num_seqs = a.num_seqs,
                           .num_heads = a.num_heads,
                           .num_kv_heads = a.num_kv_heads,
                           .head_dim = a.head_dim,
                           .scale = a.scale,
                           .sliding_window = a.sliding_window,
                           .q = static_cast<const float*>(a.q),
                           .k_cache = static_cast<const float*>(a.k_cache),
                           .v_cache = static_cast<const float*>(a.v_cache),
                           .slot_stride = a.slot_stride,
                           .kv_head_stride = a.kv_head_stride,
                           .out = out,
                           .q_offsets = a.q_offsets,
                           .groups_per_seq = a.groups_per_seq,
                           .head_group = a.head_group,
                           .key_offsets = a.key_offsets,
                           .slots = a.slots,
                           .key_positions = a.key_positions,
                           .num_signal = a.num_signal,
                           .want_signals = a.want_signals,
                           .attn_sum = a.attn_sum != nullptr ? attn : nullptr,
                           .norm_sum = a.norm_sum != nullptr ? norm : nullptr,
                           .norm_heads = a.norm_heads,
                           .skip = a.skip};
}

TEST(PagedCudaReferenceTest, CudaReferenceEqualsCpuPagedAttention) {
  struct Heads {
    int32_t heads, kv_heads;
  };
  const Heads heads[] = {{4, 4}, {8, 2}, {8, 1}, {6, 3}};
  const int32_t dims[] = {8, 16, 33, 64};
  const int64_t blocks[] = {1, 3, 7, 17};
  const int64_t windows[] = {0, 0, 4, 20};
  constexpr uint64_t kSeeds = 200;
  std::printf("seeds 1..%llu (a failure names its seed)\n",
              static_cast<unsigned long long>(kSeeds));
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    auto pick = [&](int64_t n) { return static_cast<size_t>(rng() % static_cast<uint64_t>(n)); };
    const Heads h = heads[pick(4)];
    BatchShape shape{.num_heads = h.heads,
                     .num_kv_heads = h.kv_heads,
                     .head_dim = dims[pick(4)],
                     .block_size = blocks[pick(4)],
                     .groups_per_seq = 1 + static_cast<int64_t>(pick(3)),
                     .per_head_slots = pick(2) == 1,
                     .sliding_window = windows[pick(4)],
                     .attn_signals = pick(4) != 0,
                     .norm_signals = pick(4) != 0,
                     .magnitude = pick(2) == 1 ? 1.0f : 2.0f};
    std::vector<SeqSpec> seqs(1 + pick(5));
    for (SeqSpec& s : seqs) {
      s.rows = pick(3) == 0 ? 1 + static_cast<int64_t>(pick(12)) : 1;
      for (int64_t g = 0; g < shape.groups_per_seq; ++g) {
        s.context.push_back(static_cast<int64_t>(pick(81)));
      }
      s.num_signal = 1 + static_cast<int64_t>(pick(s.rows + 2));
      s.want_signals = pick(4) != 0;
      s.skip = pick(6) == 0;
    }
    BatchProblem p(shape, seqs, seed);
    std::vector<float> out(p.out.size(), -7.0f), attn = p.attn_sum, norm = p.norm_sum;
    const CpuAttentionBatch cpu = CpuBatchOf(p, out.data(), attn.data(), norm.data());
    CpuPagedAttention(cpu, 0, cpu.num_seqs);
    const Status status = cuda::PagedBatchAttentionReference(p.args);
    ASSERT_TRUE(status.ok()) << status.ToString();
    for (size_t i = 0; i < out.size(); ++i) {
      const float want = p.out.Get(i);
      ASSERT_NEAR(out[i], want, 2e-5f * (1.0f + std::abs(want))) << "out " << i;
    }
    for (size_t j = 0; j < attn.size(); ++j) {
      ASSERT_NEAR(attn[j], p.attn_sum[j], 2e-5f * (1.0f + p.attn_sum[j])) << "attn " << j;
      ASSERT_NEAR(norm[j], p.norm_sum[j], 2e-5f * (1.0f + p.norm_sum[j])) << "norm " << j;
    }
  }
}
#else
TEST(PagedCudaReferenceTest, CudaReferenceEqualsCpuPagedAttention) {
  GTEST_SKIP() << "built without lib/cuda (VTOKEN_MODEL_CUDA_KERNELS)";
}
#endif

}  // namespace
}  // namespace vtoken::model
