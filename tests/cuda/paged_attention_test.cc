// Paged decode attention: properties of the CPU reference (always) and the kernel against the
// reference over odd head dims, GQA ratios, block sizes 1/3/7/17 and empty sequences (GPU only).
#include "lib/cuda/paged_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "lib/cuda/device.h"
#include "tests/cuda/paged_attention_test_util.h"

namespace vtoken::cuda {
namespace {

using testing::DecodeCase;
using testing::DecodeProblem;

TEST(PagedAttentionReferenceTest, OneTokenReturnsItsValueRowWithFullMass) {
  DecodeProblem p(1, 4, 2, 5, 3, {1}, 1);
  ASSERT_TRUE(PagedDecodeAttentionReference(p.args).ok());
  for (int32_t h = 0; h < 4; ++h) {
    const float* v = p.v.data() + (p.slots[0] * 2 + h / 2) * 5;
    for (int32_t d = 0; d < 5; ++d) EXPECT_FLOAT_EQ(p.out[h * 5 + d], v[d]);
  }
  EXPECT_FLOAT_EQ(p.mass[0], 1.0f);
}

TEST(PagedAttentionReferenceTest, MassSumsToOnePerSequenceAndEmptySequencesAreZero) {
  DecodeProblem p(3, 6, 3, 7, 7, {40, 0, 9}, 2);
  ASSERT_TRUE(PagedDecodeAttentionReference(p.args).ok());
  EXPECT_NEAR(std::accumulate(p.mass.begin(), p.mass.begin() + 40, 0.0), 1.0, 1e-5);
  EXPECT_NEAR(std::accumulate(p.mass.begin() + 40, p.mass.end(), 0.0), 1.0, 1e-5);
  for (int32_t i = 0; i < 6 * 7; ++i) EXPECT_EQ(p.out[6 * 7 + i], 0.0f);  // Sequence 1.
  EXPECT_EQ(p.lse[6], -INFINITY);
}

// The property vToken relies on: relocating rows (new slots, same logical order) changes nothing.
TEST(PagedAttentionReferenceTest, ResultDoesNotDependOnPhysicalPlacement) {
  DecodeProblem p(2, 4, 1, 9, 17, {30, 25}, 3);
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
  DecodeProblem p(1, 2, 2, 16, 3, {50}, 4, /*magnitude=*/30.0f);  // Scores ~ +-900: exp overflows.
  ASSERT_TRUE(PagedDecodeAttentionReference(p.args).ok());
  for (float x : p.out) EXPECT_TRUE(std::isfinite(x));
  for (float x : p.lse) EXPECT_TRUE(std::isfinite(x));
}

TEST(PagedAttentionTest, ValidationNamesTheFieldAtFault) {
  DecodeProblem p(1, 4, 2, 8, 3, {4}, 5);
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

// Runs the kernel on a device copy of the case's problem and compares with the reference.
void ExpectKernelMatchesReference(const DecodeCase& c) {
  SCOPED_TRACE(c.label);
  DecodeProblem p(c);
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
  ASSERT_TRUE(PagedDecodeAttention(d, nullptr).ok());
  ASSERT_TRUE(PagedDecodeAttentionReference(p.args).ok());
  std::vector<float> got_out(p.out.size()), got_lse(p.lse.size()), got_mass(p.mass.size());
  ASSERT_TRUE(out.CopyToHost(got_out.data(), got_out.size() * 4).ok());
  ASSERT_TRUE(lse.CopyToHost(got_lse.data(), got_lse.size() * 4).ok());
  ASSERT_TRUE(mass.CopyToHost(got_mass.data(), got_mass.size() * 4).ok());
  testing::ExpectDecodeOutputsMatch(p, got_out, got_lse, got_mass, c.tolerance);
}

TEST(PagedAttentionDeviceTest, MatchesReferenceOverOddShapes) {
  if (Status s = CudaDeviceStatus(); !s.ok()) GTEST_SKIP() << s.message();
  for (const DecodeCase& c : testing::DecodeOddShapeCases()) ExpectKernelMatchesReference(c);
}

TEST(PagedAttentionDeviceTest, LongContextAndLargeScoresStayAccurate) {
  if (Status s = CudaDeviceStatus(); !s.ok()) GTEST_SKIP() << s.message();
  for (const DecodeCase& c : testing::DecodeLongContextAndLargeScoreCases()) {
    ExpectKernelMatchesReference(c);
  }
}

}  // namespace
}  // namespace vtoken::cuda
