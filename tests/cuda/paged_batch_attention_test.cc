// Batched paged attention: properties of the CPU reference, validation and the split-K policy
// (always), and the kernel against the reference (GPU only) over fp32 / bf16 / fp16, block sizes
// 1/3/7/17, GQA ratios 1/4/8/16/32, head dims 64/128/256 and odd ones, empty and 5000-key
// contexts, prefill chunks, sliding windows, per-head slots with several key ranges, signals,
// more signal rows than one signal-kernel batch, and skip. The kernel cases and tolerances are
// tests/cuda/paged_batch_test_util.h's, which the CPU emulation (tests/cuda_emu) runs too.
#include "lib/cuda/paged_batch_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "lib/cuda/device.h"
#include "tests/cuda/paged_batch_test_util.h"

namespace vtoken::cuda {
namespace {

using testing::BatchCase;
using testing::BatchProblem;
using testing::BatchShape;
using testing::MixedSeqs;
using testing::SeqSpec;

TEST(PagedBatchReferenceTest, SingleKeyReturnsItsValueRowWithFullMass) {
  BatchProblem p({.num_heads = 4, .num_kv_heads = 2, .head_dim = 5}, {{.rows = 1, .context = {0}}},
                 1);
  ASSERT_TRUE(PagedBatchAttentionReference(p.args).ok());
  for (int32_t h = 0; h < 4; ++h) {
    for (int32_t d = 0; d < 5; ++d) {
      EXPECT_FLOAT_EQ(p.out.Get(h * 5 + d), p.v.Get(p.slots[0] * 10 + (h / 2) * 5 + d));
    }
  }
  EXPECT_FLOAT_EQ(p.attn_sum[0], 0.5f + 4.0f);  // Four query heads, one row, probability 1.
}

TEST(PagedBatchReferenceTest, MassPerSignalRowAndHeadSumsToOne) {
  BatchProblem p({.num_heads = 8, .num_kv_heads = 2, .head_dim = 8, .block_size = 7},
                 {{.rows = 6, .context = {30}, .num_signal = 4}}, 2);
  ASSERT_TRUE(PagedBatchAttentionReference(p.args).ok());
  const double total = std::accumulate(p.attn_sum.begin(), p.attn_sum.end(), 0.0);
  EXPECT_NEAR(total - 0.5 * static_cast<double>(p.attn_sum.size()), 8.0 * 4.0, 1e-4);
}

// What batching relies on: a sequence's output and signals do not depend on the others.
TEST(PagedBatchReferenceTest, SequenceAloneEqualsItselfInTheBatch) {
  const BatchShape shape{.num_heads = 6,
                         .num_kv_heads = 3,
                         .head_dim = 7,
                         .block_size = 17,
                         .groups_per_seq = 2,
                         .per_head_slots = true,
                         .sliding_window = 9};
  BatchProblem batch(shape, MixedSeqs(2), 3);
  ASSERT_TRUE(PagedBatchAttentionReference(batch.args).ok());
  for (size_t s = 0; s < batch.skip.size(); ++s) {
    BatchProblem alone(shape, MixedSeqs(2), 3);
    for (size_t t = 0; t < alone.skip.size(); ++t) alone.skip[t] = t == s ? 0 : 1;
    ASSERT_TRUE(PagedBatchAttentionReference(alone.args).ok());
    const int64_t row = 6 * 7;
    for (int64_t i = batch.q_offsets[s] * row; i < batch.q_offsets[s + 1] * row; ++i) {
      ASSERT_EQ(alone.out.Get(i), batch.out.Get(i)) << "seq " << s << " element " << i;
    }
    for (int64_t j = batch.key_offsets[s * 2]; j < batch.key_offsets[(s + 1) * 2]; ++j) {
      ASSERT_EQ(alone.attn_sum[j], batch.attn_sum[j]) << "seq " << s << " key " << j;
      ASSERT_EQ(alone.norm_sum[j], batch.norm_sum[j]) << "seq " << s << " key " << j;
    }
  }
}

// A skipped sequence is left alone, and the max_* bounds need not cover it.
TEST(PagedBatchReferenceTest, SkippedSequencesAreUntouched) {
  BatchProblem p({.num_heads = 4, .num_kv_heads = 4, .head_dim = 4}, MixedSeqs(1), 4);
  p.skip[3] = 1;  // 19 rows, 69 keys, 19 signal rows.
  p.args.max_query_rows = 5;
  p.args.max_keys = 38;
  p.args.max_signal_rows = 3;
  const Status status = PagedBatchAttentionReference(p.args);
  ASSERT_TRUE(status.ok()) << status.ToString();
  for (int64_t i = p.q_offsets[3] * 16; i < p.q_offsets[4] * 16; ++i) {
    ASSERT_EQ(p.out.Get(i), -7.0f);
  }
  for (int64_t j = p.key_offsets[3]; j < p.key_offsets[4]; ++j) {
    ASSERT_EQ(p.attn_sum[j], 0.5f);
    ASSERT_EQ(p.norm_sum[j], 0.25f);
  }
}

TEST(PagedBatchReferenceTest, WindowOfOneSeesOnlyTheNewToken) {
  BatchProblem p({.num_heads = 2, .num_kv_heads = 1, .head_dim = 3, .sliding_window = 1},
                 {{.rows = 3, .context = {10}}}, 5);
  ASSERT_TRUE(PagedBatchAttentionReference(p.args).ok());
  for (int64_t i = 0; i < 3; ++i) {
    for (int32_t h = 0; h < 2; ++h) {
      for (int32_t d = 0; d < 3; ++d) {
        EXPECT_FLOAT_EQ(p.out.Get((i * 2 + h) * 3 + d), p.v.Get(p.slots[10 + i] * 3 + d));
      }
    }
  }
}

TEST(PagedBatchAttentionTest, ValidationNamesTheFieldAtFault) {
  BatchProblem p({.num_heads = 4, .num_kv_heads = 2, .head_dim = 8}, MixedSeqs(1), 6);
  PagedBatchArgs a = p.args;
  a.head_dim = 300;
  EXPECT_EQ(ValidatePagedBatchArgs(a).message(), "PagedBatchArgs: head_dim 300 not in [1, 256]");
  a = p.args;
  a.num_kv_heads = 3;
  EXPECT_EQ(ValidatePagedBatchArgs(a).message(),
            "PagedBatchArgs: num_heads (4) must be in [1, 256] and a multiple of num_kv_heads (3)");
  a = p.args;
  a.slot_stride = 8;
  EXPECT_EQ(ValidatePagedBatchArgs(a).message(),
            "PagedBatchArgs: slot_stride 8 must hold num_kv_heads (2) heads of head_dim (8) at "
            "kv_head_stride 8");
  a = p.args;
  a.max_signal_rows = 0;
  EXPECT_EQ(PagedBatchAttention(a, nullptr, 0, nullptr).message(),
            "PagedBatchArgs: max_signal_rows must be positive when attention signals are wanted");
  a = p.args;
  a.num_signal = nullptr;
  EXPECT_EQ(ValidatePagedBatchArgs(a).message(),
            "PagedBatchArgs: want_signals requires num_signal");
  a = p.args;
  a.max_query_rows = 70000;
  EXPECT_EQ(ValidatePagedBatchArgs(a).message(),
            "PagedBatchArgs: max_query_rows 70000 not in [1, 65535]");
  // Key positions: without a window the kernels never read them, with one they need them.
  a = p.args;
  ASSERT_EQ(a.key_positions, nullptr);
  EXPECT_TRUE(ValidatePagedBatchArgs(a).ok());
  a.sliding_window = 4;
  EXPECT_EQ(ValidatePagedBatchArgs(a).message(),
            "PagedBatchArgs: a sliding window requires key_positions");
}

TEST(PagedBatchAttentionTest, ReferenceChecksTheContents) {
  BatchProblem p({.num_heads = 4, .num_kv_heads = 2, .head_dim = 8}, MixedSeqs(1), 7);
  p.slots[3] = p.args.num_slots;
  EXPECT_EQ(PagedBatchAttentionReference(p.args).message(),
            "PagedBatchArgs: slots[3] = " + std::to_string(p.args.num_slots) + " not in [0, " +
                std::to_string(p.args.num_slots) + ")");
  BatchProblem q({.num_heads = 4, .num_kv_heads = 2, .head_dim = 8}, MixedSeqs(1), 7);
  q.args.max_keys = 10;
  EXPECT_EQ(PagedBatchAttentionReference(q.args).message(),
            "PagedBatchArgs: key range 1 has 38 keys, past max_keys 10");
  q.args.max_keys = q.max_keys;
  q.q_offsets[1] = 0;
  EXPECT_EQ(PagedBatchAttentionReference(q.args).message(),
            "PagedBatchArgs: sequence 0 has no query rows");
  BatchProblem w({.num_heads = 2, .num_kv_heads = 1, .head_dim = 4, .sliding_window = 4},
                 {{.rows = 2, .context = {5}}}, 8);
  std::swap(w.key_positions[1], w.key_positions[2]);
  EXPECT_EQ(PagedBatchAttentionReference(w.args).message(),
            "PagedBatchArgs: key_positions decrease within key range 0");
  w.args.sliding_window = 0;  // Without a window positions only order the keys.
  EXPECT_TRUE(PagedBatchAttentionReference(w.args).ok());
}

TEST(PagedBatchAttentionTest, SplitKForLongContextsInSmallBatchesOnly) {
  BatchProblem decode({.num_heads = 32, .num_kv_heads = 8, .head_dim = 8},
                      std::vector<SeqSpec>(64, SeqSpec{.rows = 1, .context = {100}}), 9);
  decode.args.max_keys = 5000;  // 512 CTAs already: no split.
  EXPECT_EQ(PagedBatchPartitions(decode.args), 1);
  decode.args.attn_sum = nullptr;
  EXPECT_EQ(PagedBatchWorkspaceBytes(decode.args), 0u);
  BatchProblem small({.num_heads = 8, .num_kv_heads = 2, .head_dim = 8},
                     {{.rows = 1, .context = {4999}}, {.rows = 1, .context = {2}}}, 10);
  EXPECT_EQ(PagedBatchPartitions(small.args), 19);  // min(264 / 4 CTAs, 5000 / 256 keys).
  small.args.max_keys = 300;
  EXPECT_EQ(PagedBatchPartitions(small.args), 1);  // Too few keys to split.
}

TEST(PagedBatchAttentionTest, HalfConversionsRoundToNearestEven) {
  for (AttnDtype t : {AttnDtype::kBFloat16, AttnDtype::kFloat16}) {
    for (float x : {0.0f, 1.0f, -2.5f, 0.333333f, 100.0f, -1e-3f}) {
      const float y = HalfBitsToFloat(FloatToHalfBits(x, t), t);
      EXPECT_NEAR(y, x, std::abs(x) * (t == AttnDtype::kBFloat16 ? 4e-3 : 5e-4)) << x;
    }
  }
  EXPECT_EQ(FloatToHalfBits(1.0f, AttnDtype::kFloat16), 0x3c00);
  EXPECT_EQ(FloatToHalfBits(65504.0f, AttnDtype::kFloat16), 0x7bff);
  EXPECT_EQ(FloatToHalfBits(1e6f, AttnDtype::kFloat16), 0x7c00);
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.0f, -24), AttnDtype::kFloat16), 0x0001);
  EXPECT_EQ(FloatToHalfBits(1.0f + std::ldexp(1.0f, -11), AttnDtype::kFloat16), 0x3c00);  // Tie.
  EXPECT_EQ(FloatToHalfBits(1.0f, AttnDtype::kBFloat16), 0x3f80);
  EXPECT_EQ(FloatToHalfBits(1.0f + std::ldexp(1.0f, -8), AttnDtype::kBFloat16), 0x3f80);  // Tie.
  EXPECT_EQ(HalfBitsToFloat(0x0001, AttnDtype::kFloat16), std::ldexp(1.0f, -24));
}

DeviceBuffer Upload(const void* host, size_t bytes) {
  StatusOr<DeviceBuffer> buffer = DeviceBuffer::Allocate(bytes);
  EXPECT_TRUE(buffer.ok()) << buffer.status().ToString();
  EXPECT_TRUE(buffer->CopyFromHost(host, bytes).ok());
  return std::move(*buffer);
}

template <typename T>
DeviceBuffer Upload(const std::vector<T>& host) {
  return Upload(host.data(), host.size() * sizeof(T));
}

// Runs the kernel on a device copy of `p` and compares outputs and signals with the reference.
// Scores carry an error proportional to their magnitude: problems with large ones pass `scale`.
void ExpectKernelMatchesReference(BatchProblem& p, const std::string& label, float scale = 1.0f) {
  SCOPED_TRACE(label);
  DeviceBuffer q = Upload(p.q.bytes), k = Upload(p.k.bytes), v = Upload(p.v.bytes);
  DeviceBuffer out = Upload(p.out.bytes), q_offsets = Upload(p.q_offsets);
  DeviceBuffer head_group = Upload(p.head_group), key_offsets = Upload(p.key_offsets);
  DeviceBuffer slots = Upload(p.slots), positions = Upload(p.key_positions);
  DeviceBuffer num_signal = Upload(p.num_signal), want = Upload(p.want_signals);
  DeviceBuffer skip = Upload(p.skip), attn = Upload(p.attn_sum), norm = Upload(p.norm_sum);
  PagedBatchArgs d = p.args;
  d.q = q.data();
  d.k_cache = k.data();
  d.v_cache = v.data();
  d.out = out.data();
  d.q_offsets = q_offsets.as<int64_t>();
  d.key_offsets = key_offsets.as<int64_t>();
  d.slots = slots.as<int64_t>();
  if (p.args.key_positions != nullptr) d.key_positions = positions.as<int64_t>();
  // Optional arrays stay null where the problem leaves them null.
  if (p.args.head_group != nullptr) d.head_group = head_group.as<int64_t>();
  if (p.args.num_signal != nullptr) d.num_signal = num_signal.as<int64_t>();
  if (p.args.want_signals != nullptr) d.want_signals = want.as<uint8_t>();
  if (p.args.skip != nullptr) d.skip = skip.as<uint8_t>();
  d.attn_sum = p.args.attn_sum != nullptr ? attn.as<float>() : nullptr;
  d.norm_sum = p.args.norm_sum != nullptr ? norm.as<float>() : nullptr;
  const size_t bytes = PagedBatchWorkspaceBytes(d);
  StatusOr<DeviceBuffer> workspace = DeviceBuffer::Allocate(bytes);
  ASSERT_TRUE(workspace.ok()) << workspace.status().ToString();
  ASSERT_TRUE(workspace->Fill(0xff).ok());  // NaN patterns: unread parts must stay unread.
  const Status status = PagedBatchAttention(d, workspace->data(), bytes, nullptr);
  ASSERT_TRUE(status.ok()) << status.ToString();
  ASSERT_TRUE(PagedBatchAttentionReference(p.args).ok());
  testing::BatchOutputs got{testing::HostArray(p.out.dtype, p.out.size()),
                            std::vector<float>(p.attn_sum.size()),
                            std::vector<float>(p.norm_sum.size())};
  ASSERT_TRUE(out.CopyToHost(got.out.bytes.data(), got.out.bytes.size()).ok());
  ASSERT_TRUE(attn.CopyToHost(got.attn_sum.data(), got.attn_sum.size() * 4).ok());
  ASSERT_TRUE(norm.CopyToHost(got.norm_sum.data(), got.norm_sum.size() * 4).ok());
  testing::ExpectNoMismatches(testing::Mismatches(p, got, scale));
}

void ExpectKernelMatchesReference(const BatchCase& c) {
  SCOPED_TRACE("seed " + std::to_string(c.seed));
  BatchProblem p(c);
  ExpectKernelMatchesReference(p, c.label, c.scale);
}

TEST(PagedBatchAttentionDeviceTest, MatchesReferenceOverDtypesShapesAndBlocks) {
  if (Status s = CudaDeviceStatus(); !s.ok()) GTEST_SKIP() << s.message();
  for (AttnDtype t : {AttnDtype::kFloat32, AttnDtype::kBFloat16, AttnDtype::kFloat16}) {
    for (const BatchCase& c : testing::ShapeAndBlockCases(t)) ExpectKernelMatchesReference(c);
  }
}

TEST(PagedBatchAttentionDeviceTest, LongContextsSplitKeysAcrossPartitions) {
  if (Status s = CudaDeviceStatus(); !s.ok()) GTEST_SKIP() << s.message();
  for (AttnDtype t : {AttnDtype::kFloat32, AttnDtype::kBFloat16}) {
    const BatchCase c = testing::LongContextCase(t);
    BatchProblem p(c);
    ASSERT_GT(PagedBatchPartitions(p.args), 1);
    ExpectKernelMatchesReference(p, c.label);
  }
  ExpectKernelMatchesReference(testing::LargeScoresCase());
}

// More query heads per KV head than a CTA holds (16, or 8 past head_dim 128): head tiles.
TEST(PagedBatchAttentionDeviceTest, LargeGqaGroupsSplitHeadsAcrossCtas) {
  if (Status s = CudaDeviceStatus(); !s.ok()) GTEST_SKIP() << s.message();
  for (const BatchCase& c : testing::LargeGqaCases()) ExpectKernelMatchesReference(c);
}

TEST(PagedBatchAttentionDeviceTest, SlidingWindowHeadSlotsAndSignalsOnOrOff) {
  if (Status s = CudaDeviceStatus(); !s.ok()) GTEST_SKIP() << s.message();
  for (AttnDtype t : {AttnDtype::kFloat32, AttnDtype::kFloat16}) {
    for (const BatchCase& c : testing::SlidingWindowCases(t)) ExpectKernelMatchesReference(c);
  }
  for (const BatchCase& c : testing::SignalCases()) ExpectKernelMatchesReference(c);
}

// More signal rows than the signal kernel's batch of 64: several row batches.
TEST(PagedBatchAttentionDeviceTest, LongPrefillSignalsTakeSeveralRowBatches) {
  if (Status s = CudaDeviceStatus(); !s.ok()) GTEST_SKIP() << s.message();
  for (const BatchCase& c : testing::LongPrefillSignalCases()) ExpectKernelMatchesReference(c);
}

}  // namespace
}  // namespace vtoken::cuda
