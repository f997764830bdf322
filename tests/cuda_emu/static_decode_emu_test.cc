// The static decode step's kernel path (lib/model/static_decode.h: lib/cuda's batched attention on
// the step's static buffers, the body CUDA graphs capture) on the CPU emulation of the kernels
// (docs/CUDA.md): with CudaPagedAttention::OnHost alive when the step is created, the step
// attends over CPU KV tensors through the emulated kernel, padding rows and the scratch slot
// included, and is held to ForwardPaged's fused CPU path step by step, by the same check as the
// CPU step's (tests/model/static_decode_scenario.h).
#include <gtest/gtest.h>

#include "lib/model/paged_cuda_attention.h"
#include "tests/cuda_emu/emu_launches.h"
#include "tests/model/static_decode_scenario.h"

namespace vtoken::model {
namespace {

using test_configs::Case;

class StaticDecodeEmuTest : public ::testing::TestWithParam<Case> {};

TEST_P(StaticDecodeEmuTest, TheKernelPathMatchesForwardPagedStepByStep) {
  vtoken_emu::TakeLaunchCount();
  const internal::CudaPagedAttention::OnHost on_host;
  test_configs::ExpectStaticStepMatchesForwardPaged(GetParam());
  // The fused CPU path launches nothing: these are the step's attention launches, at least one
  // per layer of each of its Scenario::kSteps steps.
  EXPECT_GE(vtoken_emu::TakeLaunchCount(),
            static_cast<size_t>(test_configs::Scenario::kSteps *
                                test_configs::SmallConfig().num_hidden_layers));
}

INSTANTIATE_TEST_SUITE_P(Granularities, StaticDecodeEmuTest,
                         ::testing::Values(Case{Granularity::kToken, true},
                                           Case{Granularity::kToken, false},
                                           Case{Granularity::kLayer, true},
                                           Case{Granularity::kHead, true}));

}  // namespace
}  // namespace vtoken::model
