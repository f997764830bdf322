// Paged decode attention: properties of the CPU reference (always) and the kernel against the
// reference over odd head dims, GQA ratios, block sizes 1/3/7/17 and empty sequences (GPU only).
#include "lib/cuda/paged_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "lib/cuda/device.h"

namespace vtoken::cuda {
namespace {

// A batch of sequences whose live tokens are scattered over blocks of `block_size` slots: every
// third slot of each block is dead, and blocks are handed out in shuffled order.
struct Problem {
  Problem(int32_t num_seqs, int32_t num_heads, int32_t num_kv_heads, int32_t head_dim,
          int64_t block_size, std::vector<int64_t> lengths, uint64_t seed, float magnitude = 1.0f) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, magnitude);
    int64_t total = 0;
    for (int64_t n : lengths) total += n;
    const int64_t live_per_block = block_size == 1 ? 1 : block_size - block_size / 3;
    const int64_t num_blocks = total / live_per_block + num_seqs + 1;
    std::vector<int64_t> blocks(num_blocks);
    std::iota(blocks.begin(), blocks.end(), 0);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    size_t next_block = 0;
    offsets.push_back(0);
    for (int32_t s = 0; s < num_seqs; ++s) {
      int64_t block = -1;
      int64_t offset = block_size;
      for (int64_t t = 0; t < lengths[s]; ++t) {
        do {
          if (offset == block_size) {
            block = blocks[next_block++];
            offset = 0;
          }
        } while (block_size > 1 && offset % 3 == 2 && ++offset);
        slots.push_back(block * block_size + offset++);
      }
      offsets.push_back(static_cast<int64_t>(slots.size()));
    }
    const int64_t num_slots = num_blocks * block_size;
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

TEST(PagedAttentionReferenceTest, OneTokenReturnsItsValueRowWithFullMass) {
  Problem p(1, 4, 2, 5, 3, {1}, 1);
  ASSERT_TRUE(PagedDecodeAttentionReference(p.args).ok());
  for (int32_t h = 0; h < 4; ++h) {
    const float* v = p.v.data() + (p.slots[0] * 2 + h / 2) * 5;
    for (int32_t d = 0; d < 5; ++d) EXPECT_FLOAT_EQ(p.out[h * 5 + d], v[d]);
  }
  EXPECT_FLOAT_EQ(p.mass[0], 1.0f);
}

TEST(PagedAttentionReferenceTest, MassSumsToOnePerSequenceAndEmptySequencesAreZero) {
  Problem p(3, 6, 3, 7, 7, {40, 0, 9}, 2);
  ASSERT_TRUE(PagedDecodeAttentionReference(p.args).ok());
  EXPECT_NEAR(std::accumulate(p.mass.begin(), p.mass.begin() + 40, 0.0), 1.0, 1e-5);
  EXPECT_NEAR(std::accumulate(p.mass.begin() + 40, p.mass.end(), 0.0), 1.0, 1e-5);
  for (int32_t i = 0; i < 6 * 7; ++i) EXPECT_EQ(p.out[6 * 7 + i], 0.0f);  // Sequence 1.
  EXPECT_EQ(p.lse[6], -INFINITY);
}

// The property vToken relies on: relocating rows (new slots, same logical order) changes nothing.
TEST(PagedAttentionReferenceTest, ResultDoesNotDependOnPhysicalPlacement) {
  Problem p(2, 4, 1, 9, 17, {30, 25}, 3);
  ASSERT_TRUE(PagedDecodeAttentionReference(p.args).ok());
  const std::vector<float> out = p.out;
  const std::vector<float> mass = p.mass;
  // Move every live row to a fresh slot past the old ones, preserving the order.
  const int64_t row = 9;
  std::vector<float> k2(p.k.size() * 2), v2(p.v.size() * 2);
  std::copy(p.k.begin(), p.k.end(), k2.begin());
  std::copy(p.v.begin(), p.v.end(), v2.begin());
  for (size_t t = 0; t < p.slots.size(); ++t) {
    const int64_t dst = p.args.num_slots + static_cast<int64_t>(t);
    std::copy_n(p.k.begin() + p.slots[t] * row, row, k2.begin() + dst * row);
    std::copy_n(p.v.begin() + p.slots[t] * row, row, v2.begin() + dst * row);
    p.slots[t] = dst;
  }
  p.k = std::move(k2);
  p.v = std::move(v2);
  p.args.num_slots *= 2;
  p.PointAtHost();
  ASSERT_TRUE(PagedDecodeAttentionReference(p.args).ok());
  EXPECT_EQ(p.out, out);
  EXPECT_EQ(p.mass, mass);
}

TEST(PagedAttentionReferenceTest, StableForLargeScores) {
  Problem p(1, 2, 2, 16, 3, {50}, 4, /*magnitude=*/30.0f);  // Scores ~ +-900: exp overflows.
  ASSERT_TRUE(PagedDecodeAttentionReference(p.args).ok());
  for (float x : p.out) EXPECT_TRUE(std::isfinite(x));
  for (float x : p.lse) EXPECT_TRUE(std::isfinite(x));
}

TEST(PagedAttentionTest, ValidationNamesTheFieldAtFault) {
  Problem p(1, 4, 2, 8, 3, {4}, 5);
  PagedDecodeArgs a = p.args;
  a.head_dim = 300;
  EXPECT_EQ(ValidatePagedDecodeArgs(a).message(), "PagedDecodeArgs: head_dim 300 not in [1, 256]");
  a = p.args;
  a.num_kv_heads = 3;
  EXPECT_EQ(ValidatePagedDecodeArgs(a).message(),
            "PagedDecodeArgs: num_heads (4) must be a positive multiple of num_kv_heads (3)");
  a = p.args;
  a.lse = nullptr;
  EXPECT_EQ(PagedDecodeAttention(a, nullptr).message(),
            "PagedDecodeArgs: token_mass requires lse (the mass is normalized by it)");
  p.slots[2] = p.args.num_slots;
  EXPECT_EQ(PagedDecodeAttentionReference(p.args).code(), StatusCode::kInvalidArgument);
  p.offsets[1] = 3;
  EXPECT_EQ(PagedDecodeAttentionReference(p.args).message(),
            "PagedDecodeArgs: seq_offsets must start at 0 and end at num_tokens (4)");
}

// Runs the kernel on a device copy of `p` and compares with the reference. fp32 scores carry an
// error proportional to their magnitude, so problems with huge scores pass a larger `tolerance`.
void ExpectKernelMatchesReference(Problem& p, const std::string& label, float tolerance = 1.0f) {
  auto upload = [](const auto& host) {
    StatusOr<DeviceBuffer> buffer = DeviceBuffer::Allocate(host.size() * sizeof(host[0]));
    EXPECT_TRUE(buffer.ok()) << buffer.status().ToString();
    EXPECT_TRUE(buffer->CopyFromHost(host.data(), host.size() * sizeof(host[0])).ok());
    return std::move(*buffer);
  };
  DeviceBuffer q = upload(p.q), k = upload(p.k), v = upload(p.v), offsets = upload(p.offsets);
  DeviceBuffer slots = upload(p.slots), out = upload(p.out), lse = upload(p.lse),
               mass = upload(p.mass);
  PagedDecodeArgs d = p.args;
  d.q = q.as<float>();
  d.k = k.as<float>();
  d.v = v.as<float>();
  d.seq_offsets = offsets.as<int64_t>();
  d.slots = slots.as<int64_t>();
  d.out = out.as<float>();
  d.lse = lse.as<float>();
  d.token_mass = mass.as<float>();
  ASSERT_TRUE(PagedDecodeAttention(d, nullptr).ok()) << label;
  ASSERT_TRUE(PagedDecodeAttentionReference(p.args).ok()) << label;
  std::vector<float> got_out(p.out.size()), got_lse(p.lse.size()), got_mass(p.mass.size());
  ASSERT_TRUE(out.CopyToHost(got_out.data(), got_out.size() * 4).ok()) << label;
  ASSERT_TRUE(lse.CopyToHost(got_lse.data(), got_lse.size() * 4).ok()) << label;
  ASSERT_TRUE(mass.CopyToHost(got_mass.data(), got_mass.size() * 4).ok()) << label;
  for (size_t i = 0; i < got_out.size(); ++i) {
    ASSERT_NEAR(got_out[i], p.out[i], 2e-4f * tolerance * (1.0f + std::abs(p.out[i])))
        << label << " out " << i;
  }
  for (size_t i = 0; i < got_lse.size(); ++i) {
    if (std::isinf(p.lse[i])) {
      ASSERT_EQ(got_lse[i], p.lse[i]) << label << " lse " << i;
    } else {
      ASSERT_NEAR(got_lse[i], p.lse[i], 2e-4f * tolerance * (1.0f + std::abs(p.lse[i])))
          << label << " lse " << i;
    }
  }
  for (size_t i = 0; i < got_mass.size(); ++i) {
    ASSERT_NEAR(got_mass[i], p.mass[i], 1e-4f * tolerance * (1.0f + p.mass[i]))
        << label << " mass " << i;
  }
}

TEST(PagedAttentionDeviceTest, MatchesReferenceOverOddShapes) {
  if (Status s = CudaDeviceStatus(); !s.ok()) GTEST_SKIP() << s.message();
  const uint64_t seed = 99;
  SCOPED_TRACE("seed " + std::to_string(seed));
  struct Heads {
    int32_t heads, kv_heads;
  };
  for (int32_t head_dim : {1, 7, 33, 64, 100, 128, 256}) {
    for (Heads h : {Heads{4, 4}, Heads{6, 2}, Heads{8, 2}, Heads{3, 1}}) {
      for (int64_t block_size : {1, 3, 7, 17}) {
        Problem p(4, h.heads, h.kv_heads, head_dim, block_size, {1, 0, 37, 300}, seed + head_dim);
        ExpectKernelMatchesReference(
            p, "head_dim " + std::to_string(head_dim) + " heads " + std::to_string(h.heads) + "/" +
                   std::to_string(h.kv_heads) + " block " + std::to_string(block_size));
      }
    }
  }
}

TEST(PagedAttentionDeviceTest, LongContextAndLargeScoresStayAccurate) {
  if (Status s = CudaDeviceStatus(); !s.ok()) GTEST_SKIP() << s.message();
  Problem long_context(2, 8, 2, 128, 16, {5000, 3}, 7);
  ExpectKernelMatchesReference(long_context, "long context");
  Problem large(2, 4, 4, 32, 7, {200, 64}, 8, /*magnitude=*/30.0f);
  ExpectKernelMatchesReference(large, "large scores", /*tolerance=*/100.0f);
}

}  // namespace
}  // namespace vtoken::cuda
