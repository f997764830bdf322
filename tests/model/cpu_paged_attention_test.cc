// CpuPagedAttention, the fused CPU step's attention kernel (torch-free, so also under ASan):
// random batches of long and short key ranges (chunk boundaries included), several query rows,
// GQA, token- and head-granularity slot layouts, sliding windows, skipped sequences and every
// signal bit, against a double-precision reference (cpu_attention_problem.h); and the same bits
// whether one thread computes the batch or a pool of 1, 2 or 3 threads splits it chunk by chunk, on
// every instruction-set level the CPU has (cpu_isa.h), and the same bits on AVX2 as on AVX-512;
// over an fp16 cache, the bits of an fp32 cache holding the same values; CpuStoreKvRow's rounding.
#include "lib/model/cpu_paged_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "lib/core/policy.h"
#include "lib/model/cpu_isa.h"
#include "lib/model/cpu_pool.h"
#include "lib/model/io/safetensors.h"
#include "tests/model/cpu_attention_problem.h"

namespace vtoken::model {
namespace {

using testing::Problem;
using testing::RandomProblem;
using testing::Reference;
using testing::Result;
using testing::SeqSpec;

using testing::F16Cache;
using testing::ToF16Cache;

// With f16: over that fp16 cache of p's K and V (p is then f16->rounded).
Result Attend(const Problem& p, CpuPool* pool, const F16Cache* f16 = nullptr) {
  Result r{std::vector<float>(p.q.size(), -7.0f), std::vector<float>(p.num_keys(), 0.0f),
           std::vector<float>(p.num_keys(), 0.0f)};
  // Skipped sequences keep what the caller put there.
  for (size_t s = 0; s < p.seqs.size(); ++s) {
    if (!p.seqs[s].skip) continue;
    for (int64_t i = p.q_offsets[s] * p.heads * p.head_dim;
         i < p.q_offsets[s + 1] * p.heads * p.head_dim; ++i) {
      r.out[i] = 0.0f;
    }
  }
  const CpuAttentionBatch b = f16 != nullptr
                                  ? f16->Batch(r.out.data(), r.attn.data(), r.norm.data())
                                  : p.Batch(r.out.data(), r.attn.data(), r.norm.data());
  if (pool == nullptr) {
    CpuPagedAttention(b, 0, b.num_seqs);
  } else {
    CpuPagedAttention(b, *pool);
  }
  return r;
}

TEST(CpuPagedAttentionTest, MatchesADoubleReferenceAndAnySplitGivesTheSameBits) {
  const uint64_t base = std::random_device{}();
  constexpr uint64_t kCases = 60;
  std::printf("seeds %llu..%llu (a failure names its seed)\n",
              static_cast<unsigned long long>(base),
              static_cast<unsigned long long>(base + kCases - 1));
  CpuPool one(1), two(2), three(3);
  int64_t multi_chunk = 0;
  for (uint64_t seed = base; seed < base + kCases; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const Problem p = RandomProblem(rng);
    for (size_t s = 0; s < p.seqs.size(); ++s) {
      for (int64_t c : p.seqs[s].context) {
        multi_chunk += c + p.seqs[s].rows > kCpuAttentionChunkKeys ? 1 : 0;
      }
    }
    // One per chunk of each (sequence, key range), all the KV heads reading the range together:
    // at token granularity one range per sequence whatever the KV heads.
    int64_t units = 0;
    for (size_t s = 0; s < p.seqs.size(); ++s) {
      for (int64_t g = 0; !p.seqs[s].skip && g < (p.per_head ? p.kv_heads : 1); ++g) {
        const int64_t u = static_cast<int64_t>(s) * p.groups + g;
        const int64_t keys = p.key_offsets[u + 1] - p.key_offsets[u];
        units += (keys + kCpuAttentionChunkKeys - 1) / kCpuAttentionChunkKeys;
      }
    }
    std::vector<float> o(p.q.size()), a(p.num_keys()), nrm(p.num_keys());
    ASSERT_EQ(CpuAttentionUnits(p.Batch(o.data(), a.data(), nrm.data())), units);
    const Result want = Reference(p);
    const F16Cache f16 = ToF16Cache(p);
    std::optional<Result> fma;  // The first FMA level's result: the others give the same bits.
    for (CpuIsa isa : HostCpuIsas()) {
      SCOPED_TRACE(std::string(CpuIsaName(isa)));
      ASSERT_TRUE(SetCpuIsa(isa).ok());
      // An fp16 cache: the bits of an fp32 cache holding its values, serial or split.
      const Result rounded = Attend(f16.rounded, nullptr);
      for (CpuPool* pool : {static_cast<CpuPool*>(nullptr), &two}) {
        SCOPED_TRACE(pool == nullptr ? "fp16 cache, serial" : "fp16 cache, 2 threads");
        const Result half = Attend(f16.rounded, pool, &f16);
        ASSERT_EQ(half.out, rounded.out);
        ASSERT_EQ(half.attn, rounded.attn);
        ASSERT_EQ(half.norm, rounded.norm);
      }
      const Result serial = Attend(p, nullptr);
      for (CpuPool* pool : {&one, &two, &three}) {
        SCOPED_TRACE(std::to_string(pool->num_threads()) + " threads");
        const Result split = Attend(p, pool);
        ASSERT_EQ(split.out, serial.out);
        ASSERT_EQ(split.attn, serial.attn);
        ASSERT_EQ(split.norm, serial.norm);
      }
      for (size_t i = 0; i < want.out.size(); ++i) {
        ASSERT_NEAR(serial.out[i], want.out[i], 2e-5f * (1.0f + std::abs(want.out[i])))
            << "out " << i;
      }
      for (size_t j = 0; j < want.attn.size(); ++j) {
        ASSERT_NEAR(serial.attn[j], want.attn[j], 2e-5f * (1.0f + want.attn[j])) << "attn " << j;
        ASSERT_NEAR(serial.norm[j], want.norm[j], 2e-5f * (1.0f + want.norm[j])) << "norm " << j;
      }
      if (isa == CpuIsa::kBaseline) continue;
      if (!fma) {
        fma = serial;
        continue;
      }
      ASSERT_EQ(serial.out, fma->out);
      ASSERT_EQ(serial.attn, fma->attn);
      ASSERT_EQ(serial.norm, fma->norm);
    }
    ASSERT_TRUE(SetCpuIsa(HostCpuIsa()).ok());
  }
  // The cases did cut ranges into several chunks (else this test would not test the split).
  EXPECT_GT(multi_chunk, 20);
}

// One sequence of one decode row over 1,001 keys: 8 chunks, units of work for any thread (what
// lets batch-1 decode use every core).
TEST(CpuPagedAttentionTest, OneLongDecodeRowOnTwoThreads) {
  Problem p;
  p.heads = 3;
  p.kv_heads = 1;
  p.head_dim = 64;
  p.seqs = {SeqSpec{.rows = 1, .context = {1000}, .num_signal = 1, .want = kAttnSignal}};
  p.q_offsets = {0, 1};
  p.key_offsets = {0, 1001};
  p.num_signal = {1};
  p.want = {kAttnSignal};
  p.skip = {0};
  for (int64_t j = 0; j < 1001; ++j) {
    p.slots.push_back(1000 - j);
    p.positions.push_back(j);
  }
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  p.k.resize(1001 * 64);
  p.v.resize(1001 * 64);
  p.q.resize(3 * 64);
  for (auto* data : {&p.k, &p.v, &p.q}) {
    for (float& x : *data) x = normal(rng);
  }
  CpuPool pool(2);
  const Result split = Attend(p, &pool), serial = Attend(p, nullptr), want = Reference(p);
  std::vector<float> out(p.q.size()), attn(p.num_keys()), norm(p.num_keys());
  EXPECT_EQ(CpuAttentionUnits(p.Batch(out.data(), attn.data(), norm.data())),
            (1001 + kCpuAttentionChunkKeys - 1) / kCpuAttentionChunkKeys);
  EXPECT_EQ(split.out, serial.out);
  EXPECT_EQ(split.attn, serial.attn);
  for (size_t i = 0; i < want.out.size(); ++i) EXPECT_NEAR(split.out[i], want.out[i], 1e-5) << i;
  EXPECT_NEAR(std::accumulate(split.attn.begin(), split.attn.end(), 0.0), 3.0, 1e-4);
}

// CpuStoreKvRow's fp16 rounding against io/safetensors.h's FloatToF16 (the checkpoint reader's,
// written out bit by bit): ties to even, subnormals, overflow to infinity, on edge values and on
// random ones, at every instruction-set level; and an fp32 store is a copy.
TEST(CpuStoreKvRowTest, Fp16RoundsAsTheCheckpointReaderAndFp32Copies) {
  std::vector<float> x = {0.0f,
                          -0.0f,
                          1.0f,
                          1.0f + 0x1p-11f,
                          1.0f + 3 * 0x1p-11f,
                          65504.0f,
                          65519.0f,
                          65520.0f,
                          -1e9f,
                          0x1p-24f,
                          0x1p-25f,
                          3 * 0x1p-26f,
                          0x1p-14f - 0x1p-25f,
                          6.1e-5f,
                          std::numeric_limits<float>::infinity()};
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> expo(-30.0f, 17.0f);
  for (int i = 0; i < 4000; ++i) {
    x.push_back((rng() % 2 == 0 ? 1.0f : -1.0f) * std::exp2(expo(rng)));
  }
  std::vector<uint16_t> bits(x.size());
  for (CpuIsa isa : HostCpuIsas()) {  // F16C's vcvtps2ph on AVX2 and AVX-512, software below.
    SCOPED_TRACE(std::string(CpuIsaName(isa)));
    ASSERT_TRUE(SetCpuIsa(isa).ok());
    std::fill(bits.begin(), bits.end(), uint16_t{0x7e00});
    CpuStoreKvRow(CpuKvElement::kFloat16, x.data(), static_cast<int64_t>(x.size()), bits.data(), 0);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(bits[i], FloatToF16(x[i])) << "x = " << x[i];
    }
  }
  ASSERT_TRUE(SetCpuIsa(HostCpuIsa()).ok());
  // The ties: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10 and goes to the even one (1).
  EXPECT_EQ(bits[3], 0x3c00);
  EXPECT_EQ(bits[4], 0x3c02);
  EXPECT_EQ(bits[7], 0x7c00);   // 65520 rounds past the largest half: infinity.
  EXPECT_EQ(bits[10], 0x0000);  // 2^-25, half the smallest subnormal: ties to even zero.
  EXPECT_EQ(bits[11], 0x0001);
  std::vector<float> copy(x.size() + 3, -1.0f);
  CpuStoreKvRow(CpuKvElement::kFloat32, x.data(), static_cast<int64_t>(x.size()), copy.data(), 3);
  EXPECT_TRUE(std::equal(x.begin(), x.end(), copy.begin() + 3));
  EXPECT_EQ(copy[0], -1.0f);
}

}  // namespace
}  // namespace vtoken::model
