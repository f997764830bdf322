// Random PagedBatchArgs problems over host memory for the batched paged attention tests: key
// ranges scattered over blocks of `block_size` slots (ScatteredSlots: every third slot of a block
// dead, blocks in shuffled order), context positions with gaps (as evictions leave them), new
// tokens last. Also the kernel-vs-reference cases and the comparison's tolerances: one definition
// for the GPU test (tests/cuda/paged_batch_attention_test.cc) and the CPU emulation
// (tests/cuda_emu/paged_batch_emu_test.cc), so a case added here runs in both. Header-only and
// free of CUDA headers.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "lib/cuda/paged_batch_attention.h"
#include "tests/cuda/scattered_slots_test_util.h"

namespace vtoken::cuda::testing {

// One sequence of a batch.
struct SeqSpec {
  int64_t rows = 1;              // New tokens (query rows).
  std::vector<int64_t> context;  // Live context keys per group (size groups_per_seq).
  int64_t num_signal = 1;        // Signal rows asked for (clamped to [1, rows] by the kernel).
  bool want_signals = true;
  bool skip = false;
};

struct BatchShape {
  AttnDtype dtype = AttnDtype::kFloat32;
  int32_t num_heads = 4, num_kv_heads = 2, head_dim = 16;
  int64_t block_size = 3;
  int64_t groups_per_seq = 1;   // KV head h reads range h % groups_per_seq of its sequence.
  bool per_head_slots = false;  // A slot holds one KV head's row (head granularity).
  int64_t sliding_window = 0;
  bool attn_signals = true, norm_signals = true;
  float magnitude = 1.0f;         // Standard deviation of q, K and V.
  bool want_signals_list = true;  // False: args.want_signals is null (no sequence wants signals).
};

// A kernel-vs-reference comparison: the problem, its label and its score scale.
struct BatchCase {
  std::string label;
  BatchShape shape;
  std::vector<SeqSpec> seqs;
  uint64_t seed = 0;
  float scale = 1.0f;  // Multiplies the score-dependent bounds: large scores carry larger errors.
};

// An array of `dtype` elements (fp32 or raw 16-bit patterns).
struct HostArray {
  HostArray() = default;
  HostArray(AttnDtype type, size_t count, float fill = 0.0f)
      : dtype(type), bytes(count * (type == AttnDtype::kFloat32 ? 4 : 2)) {
    for (size_t i = 0; i < count; ++i) Set(i, fill);
  }
  size_t size() const { return bytes.size() / (dtype == AttnDtype::kFloat32 ? 4 : 2); }
  float Get(size_t i) const {
    if (dtype == AttnDtype::kFloat32) {
      float f;
      std::memcpy(&f, bytes.data() + 4 * i, 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    return HalfBitsToFloat(h, dtype);
  }
  void Set(size_t i, float value) {
    if (dtype == AttnDtype::kFloat32) {
      std::memcpy(bytes.data() + 4 * i, &value, 4);
    } else {
      const uint16_t h = FloatToHalfBits(value, dtype);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
  }
  AttnDtype dtype = AttnDtype::kFloat32;
  std::vector<uint8_t> bytes;
};

struct BatchProblem {
  BatchProblem(const BatchShape& s, const std::vector<SeqSpec>& seqs, uint64_t seed) : shape(s) {
    std::mt19937_64 rng(seed);
    const int64_t groups = s.groups_per_seq;
    int64_t total = 0;
    for (const SeqSpec& seq : seqs) {
      for (int64_t c : seq.context) total += c + seq.rows;
    }
    ScatteredSlots scatter(total, static_cast<int64_t>(seqs.size()) * groups, s.block_size, rng);
    q_offsets = {0};
    key_offsets = {0};
    for (const SeqSpec& seq : seqs) {
      int64_t history = 5;
      for (int64_t c : seq.context) history = std::max(history, 2 * c + 5);
      for (int64_t g = 0; g < groups; ++g) {
        // The group's context positions: a sorted random subset of [0, history).
        std::vector<int64_t> all(static_cast<size_t>(history));
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        all.resize(static_cast<size_t>(seq.context[g]));
        std::sort(all.begin(), all.end());
        for (int64_t t = 0; t < seq.rows; ++t) all.push_back(history + t);
        scatter.StartRange();
        for (int64_t p : all) {
          slots.push_back(scatter.Next());
          key_positions.push_back(p);
        }
        key_offsets.push_back(static_cast<int64_t>(slots.size()));
      }
      q_offsets.push_back(q_offsets.back() + seq.rows);
      num_signal.push_back(seq.num_signal);
      // Both signal bits: lib/model's CPU kernel computes only the bits set (the kernel both).
      want_signals.push_back(seq.want_signals ? 3 : 0);
      skip.push_back(seq.skip ? 1 : 0);
      max_query_rows = std::max(max_query_rows, seq.rows);
      if (seq.want_signals) {
        max_signal_rows =
            std::max(max_signal_rows, std::clamp<int64_t>(seq.num_signal, 1, seq.rows));
      }
    }
    for (size_t u = 0; u + 1 < key_offsets.size(); ++u) {
      max_keys = std::max(max_keys, key_offsets[u + 1] - key_offsets[u]);
    }
    for (int32_t h = 0; h < s.num_kv_heads; ++h) head_group.push_back(h % groups);
    const int64_t slot_stride =
        s.per_head_slots ? s.head_dim : static_cast<int64_t>(s.num_kv_heads) * s.head_dim;
    const int64_t num_slots = scatter.num_slots();
    const int64_t num_rows = q_offsets.back();
    std::normal_distribution<float> normal(0.0f, s.magnitude);
    q = HostArray(s.dtype, static_cast<size_t>(num_rows * s.num_heads * s.head_dim));
    k = HostArray(s.dtype, static_cast<size_t>(num_slots * slot_stride));
    v = HostArray(s.dtype, k.size());
    for (size_t i = 0; i < q.size(); ++i) q.Set(i, normal(rng));
    for (size_t i = 0; i < k.size(); ++i) k.Set(i, normal(rng));
    for (size_t i = 0; i < v.size(); ++i) v.Set(i, normal(rng));
    out = HostArray(s.dtype, q.size(), -7.0f);
    attn_sum.assign(slots.size(), 0.5f);  // Sums accumulate: start away from 0.
    norm_sum.assign(slots.size(), 0.25f);

    args.dtype = s.dtype;
    args.num_seqs = static_cast<int32_t>(seqs.size());
    args.num_heads = s.num_heads;
    args.num_kv_heads = s.num_kv_heads;
    args.head_dim = s.head_dim;
    args.num_rows = num_rows;
    args.num_keys = static_cast<int64_t>(slots.size());
    args.num_slots = num_slots;
    args.slot_stride = slot_stride;
    args.kv_head_stride = s.per_head_slots ? 0 : s.head_dim;
    args.groups_per_seq = groups;
    args.norm_heads = s.per_head_slots ? 1 : s.num_kv_heads;
    args.sliding_window = s.sliding_window;
    args.max_query_rows = max_query_rows;
    args.max_keys = max_keys;
    args.max_signal_rows = s.attn_signals ? std::max<int64_t>(max_signal_rows, 1) : 0;
    args.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    PointAtHost();
  }

  explicit BatchProblem(const BatchCase& c) : BatchProblem(c.shape, c.seqs, c.seed) {}

  void PointAtHost() {
    args.q = q.bytes.data();
    args.k_cache = k.bytes.data();
    args.v_cache = v.bytes.data();
    args.out = out.bytes.data();
    args.q_offsets = q_offsets.data();
    args.head_group = head_group.data();
    args.key_offsets = key_offsets.data();
    args.slots = slots.data();
    // As lib/model passes them: positions only where a sliding window makes the kernels read them.
    args.key_positions = shape.sliding_window > 0 ? key_positions.data() : nullptr;
    args.num_signal = num_signal.data();
    args.want_signals = shape.want_signals_list ? want_signals.data() : nullptr;
    args.attn_sum = shape.attn_signals ? attn_sum.data() : nullptr;
    args.norm_sum = shape.norm_signals ? norm_sum.data() : nullptr;
    args.skip = skip.data();
  }

  BatchShape shape;
  HostArray q, k, v, out;
  std::vector<int64_t> q_offsets, head_group, key_offsets, slots, key_positions, num_signal;
  std::vector<uint8_t> want_signals, skip;
  std::vector<float> attn_sum, norm_sum;
  int64_t max_query_rows = 1, max_keys = 1, max_signal_rows = 0;
  PagedBatchArgs args;
};

inline std::string DtypeName(AttnDtype t) {
  return t == AttnDtype::kFloat32 ? "fp32" : t == AttnDtype::kBFloat16 ? "bf16" : "fp16";
}

// Four sequences with `groups` key ranges each (range g has 3g more keys than range 0).
inline std::vector<SeqSpec> MixedSeqs(int64_t groups) {
  auto ctx = [&](int64_t c) {
    std::vector<int64_t> per_group;
    for (int64_t g = 0; g < groups; ++g) per_group.push_back(c + 3 * g);
    return per_group;
  };
  return {{.rows = 1, .context = ctx(0)},  // Empty context.
          {.rows = 1, .context = ctx(37), .want_signals = false},
          {.rows = 5, .context = ctx(20), .num_signal = 3},     // A prefill chunk.
          {.rows = 19, .context = ctx(50), .num_signal = 40}};  // Several row tiles.
}

// The cases every kernel implementation must pass, per dtype where they take one.

// Head dims 64/128/256 and an odd one (scalar loads), GQA ratios 1/4/8, block sizes 1/3/7/17.
inline std::vector<BatchCase> ShapeAndBlockCases(AttnDtype t) {
  const uint64_t seed = 101;
  struct Heads {
    int32_t heads, kv_heads;
  };
  std::vector<BatchCase> cases;
  for (int32_t head_dim : {64, 128, 33, 256}) {
    for (Heads h : {Heads{4, 4}, Heads{8, 2}, Heads{16, 2}}) {
      for (int64_t block_size : {1, 3, 7, 17}) {
        cases.push_back({.label = DtypeName(t) + " head_dim " + std::to_string(head_dim) +
                                  " heads " + std::to_string(h.heads) + "/" +
                                  std::to_string(h.kv_heads) + " block " +
                                  std::to_string(block_size),
                         .shape = {.dtype = t,
                                   .num_heads = h.heads,
                                   .num_kv_heads = h.kv_heads,
                                   .head_dim = head_dim,
                                   .block_size = block_size},
                         .seqs = MixedSeqs(1),
                         .seed = seed + head_dim + block_size});
      }
    }
  }
  return cases;
}

// Keys split across partitions (split-K): 19 of them, over a 5000-key context.
inline BatchCase LongContextCase(AttnDtype t) {
  return {
      .label = DtypeName(t) + " long context",
      .shape = {.dtype = t, .num_heads = 8, .num_kv_heads = 2, .head_dim = 128, .block_size = 16},
      .seqs = {{.rows = 1, .context = {4999}},
               {.rows = 1, .context = {2}},
               {.rows = 4, .context = {3000}, .num_signal = 2}},
      .seed = 11};
}

// Split-K with scores of standard deviation ~9.
inline BatchCase LargeScoresCase() {
  return {.label = "large scores",
          .shape = {.num_heads = 4,
                    .num_kv_heads = 4,
                    .head_dim = 32,
                    .block_size = 7,
                    .magnitude = 3.0f},
          .seqs = {{.rows = 1, .context = {2000}}, {.rows = 3, .context = {64}}},
          .seed = 12,
          .scale = 50.0f};
}

// More query heads per KV head than a CTA holds (16, or 8 past head_dim 128): head tiles.
inline std::vector<BatchCase> LargeGqaCases() {
  return {{.label = "32 query heads per KV head",
           .shape = {.num_heads = 32, .num_kv_heads = 1, .head_dim = 64, .block_size = 7},
           .seqs = MixedSeqs(1),
           .seed = 16},
          {.label = "16 query heads per KV head at head_dim 256",
           .shape = {.dtype = AttnDtype::kBFloat16,
                     .num_heads = 32,
                     .num_kv_heads = 2,
                     .head_dim = 256,
                     .block_size = 17},
           .seqs = MixedSeqs(1),
           .seed = 17}};
}

// Sliding windows 0/5/300, with and without per-head slots (several key ranges), a skipped
// sequence.
inline std::vector<BatchCase> SlidingWindowCases(AttnDtype t) {
  std::vector<BatchCase> cases;
  for (int64_t window : {0, 5, 300}) {
    for (bool per_head : {false, true}) {
      const int64_t groups = per_head ? 3 : 1;  // With 2 KV heads: one range nobody reads.
      std::vector<SeqSpec> seqs = MixedSeqs(groups);
      seqs.push_back({.rows = 2, .context = std::vector<int64_t>(groups, 1500)});
      seqs.push_back({.rows = 7, .context = std::vector<int64_t>(groups, 9), .skip = true});
      cases.push_back({.label = DtypeName(t) + " window " + std::to_string(window) +
                                (per_head ? " per-head slots" : ""),
                       .shape = {.dtype = t,
                                 .num_heads = 8,
                                 .num_kv_heads = 2,
                                 .head_dim = 100,
                                 .block_size = 3,
                                 .groups_per_seq = groups,
                                 .per_head_slots = per_head,
                                 .sliding_window = window},
                       .seqs = seqs,
                       .seed = static_cast<uint64_t>(13 + window)});
    }
  }
  return cases;
}

// Attention signals only, norm signals only, and no want_signals list.
inline std::vector<BatchCase> SignalCases() {
  std::vector<BatchCase> cases;
  for (bool attn : {false, true}) {
    cases.push_back({.label = attn ? "attention signals only" : "norm signals only",
                     .shape = {.num_heads = 6,
                               .num_kv_heads = 3,
                               .head_dim = 17,
                               .attn_signals = attn,
                               .norm_signals = !attn},
                     .seqs = MixedSeqs(1),
                     .seed = 14});
  }
  cases.push_back(
      {.label = "no signals",
       .shape = {.num_heads = 4, .num_kv_heads = 1, .head_dim = 64, .want_signals_list = false},
       .seqs = MixedSeqs(1),
       .seed = 15});
  return cases;
}

// More signal rows than the signal kernel's batch of 64, with scores indexed by batch row (fewer
// rows than sequences x signal rows) and by signal row.
inline std::vector<BatchCase> LongPrefillSignalCases() {
  const BatchShape shape{.num_heads = 4, .num_kv_heads = 2, .head_dim = 16, .sliding_window = 90};
  return {{.label = "150 and 65 signal rows, scores by batch row",
           .shape = shape,
           .seqs = {{.rows = 150, .context = {40}, .num_signal = 150},
                    {.rows = 70, .context = {10}, .num_signal = 65}},
           .seed = 20},
          {.label = "70 and 1 signal rows, scores by signal row",
           .shape = shape,
           .seqs = {{.rows = 150, .context = {40}, .num_signal = 70},
                    {.rows = 100, .context = {10}, .num_signal = 1}},
           .seed = 21}};
}

// Output tolerance per dtype, relative to 1 + |reference|: the kernel and the reference round
// the same inputs; fp32 differs by accumulation order only, bf16 / fp16 outputs by up to about
// one unit in the last place of the stored result (2^-8 / 2^-11 relative) plus that.
inline float OutTolerance(AttnDtype t) {
  switch (t) {
    case AttnDtype::kBFloat16:
      return 1e-2f;
    case AttnDtype::kFloat16:
      return 2e-3f;
    case AttnDtype::kFloat32:
      break;
  }
  return 2e-5f;
}

// What a kernel wrote: the outputs and the signal sums.
struct BatchOutputs {
  HostArray out;
  std::vector<float> attn_sum, norm_sum;
};

struct Mismatch {
  std::string array;
  size_t index;
  float got, want;
};

// The elements where `got` is outside the tolerances of the reference results in `want` (after
// PagedBatchAttentionReference): OutTolerance for the outputs, 1e-4 for attn_sum and 1e-5 for
// norm_sum, relative to 1 + |reference|. `scale` multiplies the bounds of what depends on the
// scores' magnitude (outputs, attn_sum).
inline std::vector<Mismatch> Mismatches(const BatchProblem& want, const BatchOutputs& got,
                                        float scale = 1.0f) {
  std::vector<Mismatch> found;
  auto check = [&](const char* array, size_t i, float g, float w, float bound) {
    if (!(std::abs(g - w) <= bound)) found.push_back({array, i, g, w});  // NaN fails too.
  };
  const float tol = OutTolerance(want.args.dtype) * scale;
  for (size_t i = 0; i < want.out.size(); ++i) {
    const float w = want.out.Get(i);
    check("out", i, got.out.Get(i), w, tol * (1.0f + std::abs(w)));
  }
  for (size_t j = 0; j < want.attn_sum.size(); ++j) {
    check("attn_sum", j, got.attn_sum[j], want.attn_sum[j],
          1e-4f * scale * (1.0f + want.attn_sum[j]));
    check("norm_sum", j, got.norm_sum[j], want.norm_sum[j], 1e-5f * (1.0f + want.norm_sum[j]));
  }
  return found;
}

// Fails the test naming the first few mismatches, if any.
inline void ExpectNoMismatches(const std::vector<Mismatch>& mismatches) {
  for (size_t i = 0; i < mismatches.size() && i < 5; ++i) {
    const Mismatch& m = mismatches[i];
    ADD_FAILURE() << m.array << "[" << m.index << "] = " << m.got << ", reference " << m.want;
  }
  EXPECT_EQ(mismatches.size(), 0u);
}

}  // namespace vtoken::cuda::testing
