// Paged decode attention: the kernels of lib/cuda/paged_attention.cu, compiled for the host against
// the CUDA emulator (cuda_emu.h) and called through PagedDecodeAttention, against the CPU
// reference on the cases and tolerances of the GPU test (tests/cuda/paged_attention_test_util.h):
// odd head dims, GQA ratios, block sizes 1/3/7/17, empty sequences, a 5000-token context and large
// scores.
#include <gtest/gtest.h>

#include <vector>

#include "lib/cuda/paged_attention.h"
#include "tests/cuda/paged_attention_test_util.h"
#include "tests/cuda_emu/cuda_emu.h"

namespace vtoken::cuda {
namespace {

using testing::DecodeCase;
using testing::DecodeProblem;

// Runs the emulated kernels on copies of the case problem's outputs, then the reference on the
// problem, and compares.
void ExpectKernelMatchesReference(const DecodeCase& c) {
  SCOPED_TRACE(c.label);
  DecodeProblem p(c);
  std::vector<float> got_out = p.out, got_lse = p.lse, got_mass = p.mass;
  PagedDecodeArgs d = p.args;
  d.out = got_out.data();
  d.lse = got_lse.data();
  d.token_mass = got_mass.data();
  const Status status = PagedDecodeAttention(d, nullptr);
  ASSERT_TRUE(status.ok()) << status.ToString();
  ASSERT_EQ(vtoken_emu::TakeLastFailure(), "");
  ASSERT_TRUE(PagedDecodeAttentionReference(p.args).ok());
  testing::ExpectDecodeOutputsMatch(p, got_out, got_lse, got_mass, c.tolerance);
}

TEST(PagedAttentionEmuTest, MatchesReferenceOverOddShapes) {
  for (const DecodeCase& c : testing::DecodeOddShapeCases()) ExpectKernelMatchesReference(c);
}

TEST(PagedAttentionEmuTest, LongContextAndLargeScoresStayAccurate) {
  for (const DecodeCase& c : testing::DecodeLongContextAndLargeScoreCases()) {
    ExpectKernelMatchesReference(c);
  }
}

}  // namespace
}  // namespace vtoken::cuda
