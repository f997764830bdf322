// CpuPagedAttention, the fused CPU step's attention kernel (torch-free, so also under ASan):
// random batches of long and short key ranges (chunk boundaries included), several query rows,
// GQA, token- and head-granularity slot layouts, sliding windows, skipped sequences and every
// signal bit, against a double-precision reference written out here; and the same bits whether
// one thread computes the batch or a pool of 1, 2 or 3 threads splits it chunk by chunk, on
// every instruction-set level the CPU has (cpu_isa.h), and the same bits on AVX2 as on AVX-512.
#include "lib/model/cpu_paged_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "lib/core/policy.h"
#include "lib/model/cpu_isa.h"
#include "lib/model/cpu_pool.h"

namespace vtoken::model {
namespace {

struct SeqSpec {
  int64_t rows = 1;
  std::vector<int64_t> context;  // Per key range (group) of the sequence.
  int64_t num_signal = 1;
  uint8_t want = 0;
  bool skip = false;
};

// A batch's host arrays and the kernel's view of them.
struct Problem {
  int64_t heads = 0, kv_heads = 0, head_dim = 0, groups = 1, window = 0;
  bool per_head = false;
  std::vector<SeqSpec> seqs;
  std::vector<float> q, k, v;
  std::vector<int64_t> q_offsets{0}, key_offsets{0}, slots, positions, num_signal, head_group;
  std::vector<uint8_t> want, skip;
  int64_t num_keys() const { return key_offsets.back(); }

  CpuAttentionBatch Batch(float* out, float* attn, float* norm) const {
    return {.num_seqs = static_cast<int64_t>(seqs.size()),
            .num_heads = heads,
            .num_kv_heads = kv_heads,
            .head_dim = head_dim,
            .scale = 1.0f / std::sqrt(static_cast<float>(head_dim)),
            .sliding_window = window,
            .q = q.data(),
            .k_cache = k.data(),
            .v_cache = v.data(),
            .slot_stride = per_head ? head_dim : kv_heads * head_dim,
            .kv_head_stride = per_head ? 0 : head_dim,
            .out = out,
            .q_offsets = q_offsets.data(),
            .groups_per_seq = groups,
            .head_group = per_head ? head_group.data() : nullptr,
            .key_offsets = key_offsets.data(),
            .slots = slots.data(),
            .key_positions = positions.data(),
            .num_signal = num_signal.data(),
            .want_signals = want.data(),
            .attn_sum = attn,
            .norm_sum = norm,
            .norm_heads = per_head ? 1 : kv_heads,
            .skip = skip.data()};
  }
};

Problem RandomProblem(std::mt19937_64& rng) {
  auto pick = [&](int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); };
  Problem p;
  const int64_t group = std::vector<int64_t>{1, 3, 4}[pick(3)];
  p.kv_heads = 1 + pick(2);
  p.heads = group * p.kv_heads;
  p.head_dim = std::vector<int64_t>{8, 33, 64}[pick(3)];
  p.per_head = pick(2) == 1;
  p.groups = p.per_head ? p.kv_heads : 1;
  p.window = std::vector<int64_t>{0, 0, 5, 130, 300}[pick(5)];
  for (int64_t g = 0; g < p.kv_heads; ++g) p.head_group.push_back(g);
  const int64_t boundaries[] = {kCpuAttentionChunkKeys - 1, kCpuAttentionChunkKeys,
                                2 * kCpuAttentionChunkKeys};
  p.seqs.resize(static_cast<size_t>(1 + pick(4)));
  for (SeqSpec& s : p.seqs) {
    s.rows = pick(3) == 0 ? 2 + pick(14) : 1;
    for (int64_t g = 0; g < p.groups; ++g) {
      // Context plus rows lands on a chunk boundary now and then.
      s.context.push_back(pick(4) == 0 ? std::max<int64_t>(0, boundaries[pick(3)] - s.rows)
                                       : pick(700));
    }
    s.num_signal = 1 + pick(s.rows + 2);
    s.want = static_cast<uint8_t>(pick(4));  // None, attention, norms, both.
    s.skip = pick(6) == 0;
  }
  int64_t rows = 0;
  for (const SeqSpec& s : p.seqs) {
    rows += s.rows;
    p.q_offsets.push_back(rows);
    p.num_signal.push_back(s.num_signal);
    p.want.push_back(s.want);
    p.skip.push_back(s.skip ? 1 : 0);
    for (int64_t g = 0; g < p.groups; ++g) {
      const int64_t keys = s.context[g] + s.rows;
      p.key_offsets.push_back(p.key_offsets.back() + keys);
      int64_t pos = pick(3);
      for (int64_t j = 0; j < keys; ++j) {
        p.positions.push_back(pos);
        pos += j < s.context[g] ? 1 + pick(3) : 1;  // Evictions leave gaps in the context.
      }
    }
  }
  // Distinct slots from a larger pool, in random order.
  std::vector<int64_t> pool(static_cast<size_t>(p.num_keys() * 2 + 5));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  p.slots.assign(pool.begin(), pool.begin() + p.num_keys());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t slot_floats = p.per_head ? p.head_dim : p.kv_heads * p.head_dim;
  p.k.resize(pool.size() * slot_floats);
  p.v.resize(p.k.size());
  p.q.resize(static_cast<size_t>(rows * p.heads * p.head_dim));
  for (float& x : p.k) x = 2.0f * normal(rng);  // Sharp attention, so errors show.
  for (float& x : p.v) x = normal(rng);
  for (float& x : p.q) x = 2.0f * normal(rng);
  return p;
}

struct Result {
  std::vector<float> out, attn, norm;
};

// The reference: per sequence, KV head, row and query head, the visible keys' softmax in double.
Result Reference(const Problem& p) {
  const int64_t group = p.heads / p.kv_heads, hd = p.head_dim;
  const int64_t slot_floats = p.per_head ? hd : p.kv_heads * hd;
  std::vector<double> out(p.q.size(), 0.0), attn(p.num_keys(), 0.0), norm(p.num_keys(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<float>(hd));
  for (size_t s = 0; s < p.seqs.size(); ++s) {
    const SeqSpec& spec = p.seqs[s];
    if (spec.skip) continue;
    const int64_t n = spec.rows, q0 = p.q_offsets[s];
    for (int64_t g = 0; g < p.kv_heads; ++g) {
      const int64_t u = static_cast<int64_t>(s) * p.groups + (p.per_head ? g : 0);
      const int64_t k0 = p.key_offsets[u], keys = p.key_offsets[u + 1] - k0, ctx = keys - n;
      auto row = [&](const std::vector<float>& cache, int64_t j) {
        return cache.data() + p.slots[k0 + j] * slot_floats + (p.per_head ? 0 : g * hd);
      };
      for (int64_t i = 0; i < n; ++i) {
        const int64_t hi = ctx + i + 1, me = p.positions[k0 + ctx + i];
        for (int64_t h = 0; h < group; ++h) {
          const float* qv = p.q.data() + ((q0 + i) * p.heads + g * group + h) * hd;
          std::vector<double> score(static_cast<size_t>(hi), -INFINITY);
          double top = -INFINITY;
          for (int64_t j = 0; j < hi; ++j) {
            if (p.window > 0 && me - p.positions[k0 + j] >= p.window) continue;
            double dot = 0;
            for (int64_t d = 0; d < hd; ++d) dot += static_cast<double>(qv[d]) * row(p.k, j)[d];
            score[j] = dot * scale;
            top = std::max(top, score[j]);
          }
          double total = 0;
          for (double& x : score) total += (x = std::exp(x - top));
          for (int64_t j = 0; j < hi; ++j) {
            const double prob = score[j] / total;
            for (int64_t d = 0; d < hd; ++d) {
              out[((q0 + i) * p.heads + g * group + h) * hd + d] += prob * row(p.v, j)[d];
            }
            const bool signal_row = i >= n - std::clamp<int64_t>(spec.num_signal, 1, n);
            if ((spec.want & kAttnSignal) && signal_row) attn[k0 + j] += prob;
          }
        }
      }
      if (spec.want & kKeyNormSignal) {
        for (int64_t j = 0; j < keys; ++j) {
          double sq = 0;
          for (int64_t d = 0; d < hd; ++d)
            sq += static_cast<double>(row(p.k, j)[d]) * row(p.k, j)[d];
          norm[k0 + j] += std::sqrt(sq) / (p.per_head ? 1 : p.kv_heads);
        }
      }
    }
  }
  return {std::vector<float>(out.begin(), out.end()), std::vector<float>(attn.begin(), attn.end()),
          std::vector<float>(norm.begin(), norm.end())};
}

Result Attend(const Problem& p, CpuPool* pool) {
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
  const CpuAttentionBatch b = p.Batch(r.out.data(), r.attn.data(), r.norm.data());
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
    int64_t units = 0;  // One per chunk of each (sequence, KV head) range.
    for (size_t s = 0; s < p.seqs.size(); ++s) {
      for (int64_t g = 0; !p.seqs[s].skip && g < p.kv_heads; ++g) {
        const int64_t u = static_cast<int64_t>(s) * p.groups + (p.per_head ? g : 0);
        const int64_t keys = p.key_offsets[u + 1] - p.key_offsets[u];
        units += (keys + kCpuAttentionChunkKeys - 1) / kCpuAttentionChunkKeys;
      }
    }
    std::vector<float> o(p.q.size()), a(p.num_keys()), nrm(p.num_keys());
    ASSERT_EQ(CpuAttentionUnits(p.Batch(o.data(), a.data(), nrm.data())), units);
    const Result want = Reference(p);
    std::optional<Result> fma;  // The first FMA level's result: the others give the same bits.
    for (CpuIsa isa : HostCpuIsas()) {
      SCOPED_TRACE(std::string(CpuIsaName(isa)));
      ASSERT_TRUE(SetCpuIsa(isa).ok());
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

}  // namespace
}  // namespace vtoken::model
