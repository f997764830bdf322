// The fused CPU step's prefill path on its own pool (cpu_blas_gemm.h, cpu_prefill_attention.h):
// PoolSgemm within rounding of a double reference and unchanged by the thread count;
// CpuPrefillAttention on random prefill chunks (cpu_attention_problem.h: GQA, token- and
// head-granularity layouts, sliding windows, every signal bit) against a double-precision reference
// and against CpuPagedAttention, with the same bits on a pool of 1, 2 or 3 threads and on every FMA
// instruction-set level the CPU has, and over an fp16 cache the bits of an fp32 cache holding its
// values. Both need OpenBLAS (Debian's libtorch); they skip where
// PoolSgemmAvailable() is false (PyPI's torch, whose BLAS is MKL).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "lib/model/cpu_blas_gemm.h"
#include "lib/model/cpu_isa.h"
#include "lib/model/cpu_paged_attention.h"
#include "lib/model/cpu_pool.h"
#include "lib/model/cpu_prefill_attention.h"
#include "tests/model/cpu_attention_problem.h"

namespace vtoken::model {
namespace {

using testing::F16Cache;
using testing::Problem;
using testing::RandomProblem;
using testing::Reference;
using testing::Result;
using testing::ToF16Cache;

TEST(PoolSgemmTest, SameBitsOnAnyThreadCountWithinRoundingOfADoubleReference) {
  if (!PoolSgemmAvailable()) GTEST_SKIP() << "the BLAS is not OpenBLAS";
  torch::manual_seed(3);
  CpuPool one(1), two(2), three(3);
  // SmolLM2's k and gate shapes over several calls of kPoolSgemmRows rows (the last one short),
  // an odd shape within one call; with and without bias and accumulation.
  for (auto [rows, in, out] :
       {std::tuple<int64_t, int64_t, int64_t>{3 * kPoolSgemmRows + 37, 576, 192},
        {2 * kPoolSgemmRows, 576, 1536},
        {65, 33, 47}}) {
    for (bool with_bias : {false, true}) {
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(in) + "x" + std::to_string(out) +
                     (with_bias ? " bias" : "") + (accumulate ? " accumulate" : ""));
        const torch::Tensor x = torch::randn({rows, in}), w = torch::randn({out, in});
        const torch::Tensor bias = with_bias ? torch::randn({out}) : torch::Tensor();
        const torch::Tensor start = torch::randn({rows, out});
        torch::Tensor want = torch::mm(x.to(torch::kFloat64), w.to(torch::kFloat64).t());
        if (accumulate) want += start.to(torch::kFloat64);
        if (with_bias) want += bias.to(torch::kFloat64);
        std::optional<torch::Tensor> first;
        for (CpuPool* pool : {&one, &two, &three}) {
          SCOPED_TRACE(std::to_string(pool->num_threads()) + " threads");
          torch::Tensor y = accumulate ? start.clone() : torch::full({rows, out}, -7.0f);
          PoolSgemm({.x = x.data_ptr<float>(),
                     .w = w.data_ptr<float>(),
                     .bias = with_bias ? bias.data_ptr<float>() : nullptr,
                     .y = y.data_ptr<float>(),
                     .rows = rows,
                     .in_features = in,
                     .out_features = out,
                     .accumulate = accumulate},
                    *pool);
          // fp32 sums of `in` products of unit normals: a few ulps of sqrt(in) per term.
          const double gap = (y.to(torch::kFloat64) - want).abs().max().item<double>();
          EXPECT_LT(gap, 1e-5 * static_cast<double>(in)) << gap;
          if (!first) {
            first = y;
          } else {
            EXPECT_TRUE(torch::equal(y, *first));
          }
        }
      }
    }
  }
}

// With f16: over that fp16 cache of p's K and V (p is then f16->rounded).
Result PrefillAttend(const Problem& p, CpuPool& pool, const F16Cache* f16 = nullptr) {
  Result r{std::vector<float>(p.q.size(), -7.0f), std::vector<float>(p.num_keys(), 0.0f),
           std::vector<float>(p.num_keys(), 0.0f)};
  const CpuAttentionBatch b = f16 != nullptr
                                  ? f16->Batch(r.out.data(), r.attn.data(), r.norm.data())
                                  : p.Batch(r.out.data(), r.attn.data(), r.norm.data());
  const OneBlasThread one_blas_thread;
  for (int64_t s = 0; s < b.num_seqs; ++s) CpuPrefillAttention(b, s, pool);
  return r;
}

TEST(CpuPrefillAttentionTest, MatchesTheReferenceAndTheDecodeKernelWithTheSameBitsOnAnySplit) {
  if (!PoolSgemmAvailable()) GTEST_SKIP() << "the BLAS is not OpenBLAS";
  const uint64_t base = std::random_device{}();
  constexpr uint64_t kCases = 30;
  std::printf("seeds %llu..%llu (a failure names its seed)\n",
              static_cast<unsigned long long>(base),
              static_cast<unsigned long long>(base + kCases - 1));
  CpuPool one(1), two(2), three(3);
  int64_t odd_blocks = 0, windows = 0;
  for (uint64_t seed = base; seed < base + kCases; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    Problem p = RandomProblem(rng, /*prefill_rows=*/200);
    for (size_t s = 0; s < p.seqs.size(); ++s) {  // The caller picks the sequences: all here.
      p.seqs[s].skip = false;
      p.skip[s] = 0;
      const int64_t blocks = (p.seqs[s].rows + kPrefillQueryRows - 1) / kPrefillQueryRows;
      odd_blocks += blocks % 2 == 1 && blocks > 1 ? 1 : 0;
    }
    windows += p.window > 0 ? 1 : 0;
    const Result want = Reference(p);
    std::vector<float> out(p.q.size()), attn(p.num_keys()), norm(p.num_keys());
    CpuPagedAttention(p.Batch(out.data(), attn.data(), norm.data()), 0,
                      static_cast<int64_t>(p.seqs.size()));
    std::optional<Result> fma;  // The first FMA level's result: the others give the same bits.
    for (CpuIsa isa : HostCpuIsas()) {
      SCOPED_TRACE(std::string(CpuIsaName(isa)));
      ASSERT_TRUE(SetCpuIsa(isa).ok());
      const Result first = PrefillAttend(p, one);
      {  // An fp16 cache: the bits of an fp32 cache holding its values.
        SCOPED_TRACE("fp16 cache");
        const F16Cache f16 = ToF16Cache(p);
        const Result rounded = PrefillAttend(f16.rounded, two);
        const Result half = PrefillAttend(f16.rounded, two, &f16);
        ASSERT_EQ(half.out, rounded.out);
        ASSERT_EQ(half.attn, rounded.attn);
        ASSERT_EQ(half.norm, rounded.norm);
      }
      for (CpuPool* pool : {&two, &three}) {
        SCOPED_TRACE(std::to_string(pool->num_threads()) + " threads");
        const Result split = PrefillAttend(p, *pool);
        ASSERT_EQ(split.out, first.out);
        ASSERT_EQ(split.attn, first.attn);
        ASSERT_EQ(split.norm, first.norm);
      }
      for (size_t i = 0; i < want.out.size(); ++i) {
        ASSERT_NEAR(first.out[i], want.out[i], 2e-5f * (1.0f + std::abs(want.out[i])))
            << "out " << i;
        ASSERT_NEAR(first.out[i], out[i], 2e-5f * (1.0f + std::abs(out[i]))) << "out " << i;
      }
      for (size_t j = 0; j < want.attn.size(); ++j) {
        ASSERT_NEAR(first.attn[j], want.attn[j], 2e-5f * (1.0f + want.attn[j])) << "attn " << j;
        ASSERT_NEAR(first.attn[j], attn[j], 2e-5f * (1.0f + attn[j])) << "attn " << j;
        ASSERT_NEAR(first.norm[j], want.norm[j], 2e-5f * (1.0f + want.norm[j])) << "norm " << j;
      }
      if (isa == CpuIsa::kBaseline) continue;
      if (!fma) {
        fma = first;
        continue;
      }
      ASSERT_EQ(first.out, fma->out);
      ASSERT_EQ(first.attn, fma->attn);
      ASSERT_EQ(first.norm, fma->norm);
    }
    ASSERT_TRUE(SetCpuIsa(HostCpuIsa()).ok());
  }
  // Cases with an odd number of query blocks (a unit with one block) and sliding windows occurred.
  EXPECT_GT(odd_blocks, 3);
  EXPECT_GT(windows, 3);
}

}  // namespace
}  // namespace vtoken::model
