// Random PagedBatchArgs problems over host memory for the batched paged attention tests: key
// ranges scattered over blocks of `block_size` slots (every third slot of a block dead, blocks in
// shuffled order), context positions with gaps (as evictions leave them), new tokens last.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "lib/cuda/paged_batch_attention.h"

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
  float magnitude = 1.0f;  // Standard deviation of q, K and V.
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
    const int64_t bs = s.block_size;
    const int64_t live_per_block = bs == 1 ? 1 : bs - bs / 3;
    const int64_t num_blocks =
        total / live_per_block + static_cast<int64_t>(seqs.size()) * groups + 1;
    std::vector<int64_t> blocks(static_cast<size_t>(num_blocks));
    std::iota(blocks.begin(), blocks.end(), 0);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    size_t next_block = 0;
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
        int64_t block = -1, offset = bs;
        for (int64_t p : all) {
          do {
            if (offset == bs) {
              block = blocks[next_block++];
              offset = 0;
            }
          } while (bs > 1 && offset % 3 == 2 && ++offset);
          slots.push_back(block * bs + offset++);
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
    const int64_t num_slots = num_blocks * bs;
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

  void PointAtHost() {
    args.q = q.bytes.data();
    args.k_cache = k.bytes.data();
    args.v_cache = v.bytes.data();
    args.out = out.bytes.data();
    args.q_offsets = q_offsets.data();
    args.head_group = head_group.data();
    args.key_offsets = key_offsets.data();
    args.slots = slots.data();
    args.key_positions = key_positions.data();
    args.num_signal = num_signal.data();
    args.want_signals = want_signals.data();
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

}  // namespace vtoken::cuda::testing
