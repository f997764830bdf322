// Paged decode attention problems over host memory, the kernel-vs-reference cases and the
// comparison's tolerances: one definition for the GPU test (tests/cuda/paged_attention_test.cc)
// and the CPU emulation (tests/cuda_emu/paged_attention_emu_test.cc), so a case added here runs
// in both. Header-only and free of CUDA headers.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "lib/cuda/paged_attention.h"
#include "tests/cuda/scattered_slots_test_util.h"

namespace vtoken::cuda::testing {

// A kernel-vs-reference comparison: the problem's shape and seed, and its label.
struct DecodeCase {
  std::string label;
  int32_t num_seqs = 1, num_heads = 1, num_kv_heads = 1, head_dim = 1;
  int64_t block_size = 1;
  std::vector<int64_t> lengths;  // Live tokens per sequence.
  uint64_t seed = 0;
  float magnitude = 1.0f;  // Standard deviation of q, K and V.
  // Multiplies the comparison's bounds: fp32 scores carry an error proportional to their
  // magnitude, so problems with huge scores pass a larger one.
  float tolerance = 1.0f;
};

// A batch of sequences whose live tokens are scattered over blocks (ScatteredSlots).
struct DecodeProblem {
  DecodeProblem(int32_t num_seqs, int32_t num_heads, int32_t num_kv_heads, int32_t head_dim,
                int64_t block_size, std::vector<int64_t> lengths, uint64_t seed,
                float magnitude = 1.0f) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, magnitude);
    int64_t total = 0;
    for (int64_t n : lengths) total += n;
    ScatteredSlots scatter(total, num_seqs, block_size, rng);
    offsets.push_back(0);
    for (int32_t s = 0; s < num_seqs; ++s) {
      scatter.StartRange();
      for (int64_t t = 0; t < lengths[s]; ++t) slots.push_back(scatter.Next());
      offsets.push_back(static_cast<int64_t>(slots.size()));
    }
    const int64_t num_slots = scatter.num_slots();
    q.resize(static_cast<size_t>(num_seqs) * num_heads * head_dim);
    k.resize(static_cast<size_t>(num_slots) * num_kv_heads * head_dim);
    v.resize(k.size());
    for (float& x : q) x = normal(rng);
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    out.assign(q.size(), -7.0f);
    lse.assign(static_cast<size_t>(num_seqs) * num_heads, -7.0f);
    mass.assign(slots.size(), -7.0f);
    args.num_seqs = num_seqs;
    args.num_heads = num_heads;
    args.num_kv_heads = num_kv_heads;
    args.head_dim = head_dim;
    args.num_slots = num_slots;
    args.num_tokens = static_cast<int64_t>(slots.size());
    args.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    PointAtHost();
  }
  explicit DecodeProblem(const DecodeCase& c)
      : DecodeProblem(c.num_seqs, c.num_heads, c.num_kv_heads, c.head_dim, c.block_size, c.lengths,
                      c.seed, c.magnitude) {}

  void PointAtHost() {
    args.q = q.data();
    args.k = k.data();
    args.v = v.data();
    args.seq_offsets = offsets.data();
    args.slots = slots.data();
    args.out = out.data();
    args.lse = lse.data();
    args.token_mass = mass.data();
  }

  std::vector<float> q, k, v, out, lse, mass;
  std::vector<int64_t> offsets, slots;
  PagedDecodeArgs args;
};

// Odd head dims, GQA ratios, block sizes 1/3/7/17, an empty sequence.
inline std::vector<DecodeCase> DecodeOddShapeCases() {
  const uint64_t seed = 99;
  struct Heads {
    int32_t heads, kv_heads;
  };
  std::vector<DecodeCase> cases;
  for (int32_t head_dim : {1, 7, 33, 64, 100, 128, 256}) {
    for (Heads h : {Heads{4, 4}, Heads{6, 2}, Heads{8, 2}, Heads{3, 1}}) {
      for (int64_t block_size : {1, 3, 7, 17}) {
        cases.push_back({.label = "seed " + std::to_string(seed) + " head_dim " +
                                  std::to_string(head_dim) + " heads " + std::to_string(h.heads) +
                                  "/" + std::to_string(h.kv_heads) + " block " +
                                  std::to_string(block_size),
                         .num_seqs = 4,
                         .num_heads = h.heads,
                         .num_kv_heads = h.kv_heads,
                         .head_dim = head_dim,
                         .block_size = block_size,
                         .lengths = {1, 0, 37, 300},
                         .seed = seed + head_dim});
      }
    }
  }
  return cases;
}

// A 5000-token context, and scores around +-900 (exp overflows without the running maximum).
inline std::vector<DecodeCase> DecodeLongContextAndLargeScoreCases() {
  return {{.label = "long context",
           .num_seqs = 2,
           .num_heads = 8,
           .num_kv_heads = 2,
           .head_dim = 128,
           .block_size = 16,
           .lengths = {5000, 3},
           .seed = 7},
          {.label = "large scores",
           .num_seqs = 2,
           .num_heads = 4,
           .num_kv_heads = 4,
           .head_dim = 32,
           .block_size = 7,
           .lengths = {200, 64},
           .seed = 8,
           .magnitude = 30.0f,
           .tolerance = 100.0f}};
}

// Expects a kernel's out / lse / token_mass to match the reference's in `want` (after
// PagedDecodeAttentionReference): within 2e-4 (out, lse) and 1e-4 (mass) times `tolerance`,
// relative to 1 + |reference|; an infinite lse (empty sequence) exactly.
inline void ExpectDecodeOutputsMatch(const DecodeProblem& want, const std::vector<float>& out,
                                     const std::vector<float>& lse, const std::vector<float>& mass,
                                     float tolerance) {
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_NEAR(out[i], want.out[i], 2e-4f * tolerance * (1.0f + std::abs(want.out[i])))
        << "out " << i;
  }
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(want.lse[i])) {
      ASSERT_EQ(lse[i], want.lse[i]) << "lse " << i;
    } else {
      ASSERT_NEAR(lse[i], want.lse[i], 2e-4f * tolerance * (1.0f + std::abs(want.lse[i])))
          << "lse " << i;
    }
  }
  for (size_t i = 0; i < mass.size(); ++i) {
    ASSERT_NEAR(mass[i], want.mass[i], 1e-4f * tolerance * (1.0f + want.mass[i])) << "mass " << i;
  }
}

}  // namespace vtoken::cuda::testing
