// The static decode step (lib/model/static_decode.h), the body that CUDA graphs capture, run
// eagerly on the CPU: against ForwardPaged step by step (logits, signals, the K/V written) with
// padded buckets, scattered slots, every granularity and a key-bucket crossing that regrows the
// buffers; through the engine (identical greedy tokens to the eager runner, naive and vtoken);
// and the errors (CUDA graphs on the CPU, the scratch slot).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <numeric>
#include <ostream>
#include <random>
#include <tuple>

#include "lib/engine/engine.h"
#include "lib/model/llama_runner.h"
#include "lib/model/static_decode.h"
#include "tests/model/small_model_config.h"
#include "tests/model/static_decode_scenario.h"

namespace vtoken::model {
namespace {

using internal::StaticDecode;
using test_configs::SmallConfig;

TEST(StaticDecodeBucketsTest, EveryBatchFitsTheSmallestBucketAtLeastAsLarge) {
  int64_t previous = 0;
  for (int64_t batch = 1; batch <= StaticDecode::kMaxBatch; ++batch) {
    const int64_t bucket = StaticDecode::BatchBucket(batch);
    EXPECT_GE(bucket, batch);
    EXPECT_GE(bucket, previous);
    EXPECT_LE(bucket, StaticDecode::kMaxBatch);
    EXPECT_TRUE(bucket <= 4 ? (bucket & (bucket - 1)) == 0 : bucket % 8 == 0) << bucket;
    previous = bucket;
  }
  EXPECT_EQ(StaticDecode::BatchBucket(3), 4);
  EXPECT_EQ(StaticDecode::BatchBucket(9), 16);
  EXPECT_EQ(StaticDecode::BatchBucket(0), 0);
  EXPECT_EQ(StaticDecode::BatchBucket(StaticDecode::kMaxBatch + 1), 0);
  EXPECT_EQ(StaticDecode::KeyBucket(1), 256);
  EXPECT_EQ(StaticDecode::KeyBucket(256), 256);
  EXPECT_EQ(StaticDecode::KeyBucket(257), 512);
}

using test_configs::Case;
using test_configs::CompareDecodeSteps;
using test_configs::Scenario;
using test_configs::WithScratch;

class StaticDecodeTest : public ::testing::TestWithParam<Case> {};

TEST_P(StaticDecodeTest, MatchesForwardPagedStepByStep) {
  test_configs::ExpectStaticStepMatchesForwardPaged(GetParam());
}

INSTANTIATE_TEST_SUITE_P(
    Granularities, StaticDecodeTest,
    ::testing::Values(Case{Granularity::kToken, true}, Case{Granularity::kToken, false},
                      Case{Granularity::kLayer, true}, Case{Granularity::kHead, true}));

// On a CUDA device, with a libtorch built with CUDA (else skipped; scripts/device-check.sh runs
// these): the captured graphs' replays against the same static step run eagerly (the same
// kernels on the same inputs: identical logits; signals within atomics' reordering), and in fp32
// the eager static step against ForwardPaged on CUDA.
class StaticDecodeCudaTest : public ::testing::TestWithParam<std::tuple<Case, torch::Dtype>> {};

TEST_P(StaticDecodeCudaTest, GraphReplaysEqualTheEagerStaticStep) {
#ifndef VTOKEN_TORCH_CUDA
  GTEST_SKIP() << "libtorch without CUDA (VTOKEN_TORCH_CUDA): no CUDA graphs";
#else
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto [param, dtype] = GetParam();
  const uint64_t seed = 20261202;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const ModelConfig config = SmallConfig();
  StatusOr<LlamaModel> model = LlamaModel::RandomInit(
      config, 5, {.compute_dtype = dtype, .device = torch::Device(torch::kCUDA)});
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  // Stores: [0] the eager static step, [1] the graphs; [2] a second eager static step and [3]
  // ForwardPaged, for the fp32 comparison. Same seed, same inputs: `second` replays `first`.
  Scenario first(config, param, seed), second(config, param, seed);
  const int64_t num_slots = first.num_slots();
  std::vector<KvTensors> kv;
  for (int i = 0; i < 4; ++i) {
    StatusOr<KvTensors> store = KvTensors::Create(WithScratch(*model, num_slots, param));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    kv.push_back(std::move(*store));
  }
  StatusOr<std::unique_ptr<StaticDecode>> eager = StaticDecode::Create(*model, kv[0], {});
  StatusOr<std::unique_ptr<StaticDecode>> graphs =
      StaticDecode::Create(*model, kv[1], {.capture = true});
  StatusOr<std::unique_ptr<StaticDecode>> eager2 = StaticDecode::Create(*model, kv[2], {});
  ASSERT_TRUE(eager.ok() && graphs.ok() && eager2.ok()) << graphs.status().ToString();
  const std::vector<PagedSeqInput> prefill = first.Prefill();
  ASSERT_EQ(second.Prefill().size(), prefill.size());  // Same seed: the same inputs.
  for (KvTensors& store : kv) ASSERT_TRUE(model->ForwardPaged(prefill, store).ok());

  const float worst = CompareDecodeSteps(
      first, [&](const auto& in) { return (*eager)->Step(ViewsOf(in)); },
      [&](const auto& in) { return (*graphs)->Step(ViewsOf(in)); }, 0.0f);
  std::printf("graph replay vs eager static step: largest logit difference %g\n", worst);
  EXPECT_EQ((*graphs)->stats().capture_failures, 0);
  EXPECT_EQ((*graphs)->stats().replays, Scenario::kSteps);
  EXPECT_EQ((*graphs)->stats().bodies_built, (*eager)->stats().bodies_built);
  for (int64_t slot = 0; slot < num_slots; ++slot) {
    ASSERT_EQ(TokenKvHash(kv[1], slot), TokenKvHash(kv[0], slot)) << "slot " << slot;
  }
  if (dtype == torch::kFloat32) {
    const float vs_forward = CompareDecodeSteps(
        second, [&](const auto& in) { return model->ForwardPaged(in, kv[3]); },
        [&](const auto& in) { return (*eager2)->Step(ViewsOf(in)); }, 1e-3f);
    std::printf("eager static step vs ForwardPaged: largest logit difference %g\n", vs_forward);
  }
#endif
}

INSTANTIATE_TEST_SUITE_P(
    GranularitiesAndDtypes, StaticDecodeCudaTest,
    ::testing::Combine(::testing::Values(Case{Granularity::kToken, true},
                                         Case{Granularity::kHead, true},
                                         Case{Granularity::kToken, false}),
                       ::testing::Values(torch::kFloat32, torch::kBFloat16)));

std::vector<engine::Request> Requests(int n, int64_t prompt, int64_t max_tokens) {
  return test_configs::Requests(n, prompt, 11, max_tokens, 41);
}

struct EngineRun {
  engine::EngineResult result;
  DecodeStats stats;
};

StatusOr<EngineRun> RunEngine(Mode mode, DecodeMode decode,
                              const std::vector<engine::Request>& requests,
                              const LlamaOptions& options = {}) {
  const engine::EngineOptions o = test_configs::H2oEngineOptions(mode, 96, 64);
  VTOKEN_ASSIGN_OR_RETURN(LlamaModel m, LlamaModel::RandomInit(SmallConfig(), 3, options));
  VTOKEN_ASSIGN_OR_RETURN(std::unique_ptr<LlamaRunner> runner,
                          LlamaRunner::Create(std::move(m), {.num_slots = 96 * 16,
                                                             .decode = decode}));
  EXPECT_EQ(runner->num_slots(), 96 * 16);
  VTOKEN_ASSIGN_OR_RETURN(engine::EngineResult result, engine::RunEngine(o, *runner, requests));
  return EngineRun{std::move(result), runner->decode_stats()};
}

TEST(StaticDecodeEngineTest, GivesTheEagerRunnersGreedyTokensInNaiveAndVtoken) {
  const std::vector<engine::Request> requests = Requests(5, 120, 20);
  for (Mode mode : {Mode::kNaive, Mode::kVtoken}) {
    StatusOr<EngineRun> eager = RunEngine(mode, DecodeMode::kEager, requests);
    StatusOr<EngineRun> fixed = RunEngine(mode, DecodeMode::kStatic, requests);
    ASSERT_TRUE(eager.ok()) << eager.status().ToString();
    ASSERT_TRUE(fixed.ok()) << fixed.status().ToString();
    EXPECT_EQ(eager->stats.static_steps, 0);
    EXPECT_GT(fixed->stats.static_steps, 10);
    EXPECT_EQ(fixed->result.violations, 0);
    EXPECT_EQ(fixed->result.evictions, eager->result.evictions);
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(fixed->result.requests[i].output_tokens, eager->result.requests[i].output_tokens)
          << "request " << i << " in " << ModeName(mode);
    }
  }
}

TEST(StaticDecodeCudaTest, EngineWithCudaGraphsGivesTheEagerRunnersGreedyTokens) {
#ifndef VTOKEN_TORCH_CUDA
  GTEST_SKIP() << "libtorch without CUDA (VTOKEN_TORCH_CUDA): no CUDA graphs";
#else
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const std::vector<engine::Request> requests = Requests(5, 120, 20);
  const LlamaOptions cuda{.device = torch::Device(torch::kCUDA)};
  for (Mode mode : {Mode::kNaive, Mode::kVtoken}) {
    StatusOr<EngineRun> eager = RunEngine(mode, DecodeMode::kEager, requests, cuda);
    StatusOr<EngineRun> graphs = RunEngine(mode, DecodeMode::kCudaGraphs, requests, cuda);
    ASSERT_TRUE(eager.ok()) << eager.status().ToString();
    ASSERT_TRUE(graphs.ok()) << graphs.status().ToString();
    EXPECT_EQ(graphs->stats.capture_failures, 0);
    EXPECT_GT(graphs->stats.replays, 10);
    EXPECT_EQ(graphs->result.violations, 0);
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(graphs->result.requests[i].output_tokens, eager->result.requests[i].output_tokens)
          << "request " << i << " in " << ModeName(mode);
    }
  }
#endif
}

TEST(StaticDecodeEngineTest, CudaGraphsOnTheCpuAreRefusedWithTheReason) {
  StatusOr<LlamaModel> m = LlamaModel::RandomInit(SmallConfig(), 3);
  ASSERT_TRUE(m.ok());
  StatusOr<std::unique_ptr<LlamaRunner>> runner =
      LlamaRunner::Create(std::move(*m), {.num_slots = 64, .decode = DecodeMode::kCudaGraphs});
  ASSERT_FALSE(runner.ok());
  EXPECT_EQ(runner.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(runner.status().message().find("CUDA"), std::string::npos)
      << runner.status().message();
}

TEST(StaticDecodeEngineTest, TheScratchSlotIsNotTheCallers) {
  StatusOr<LlamaModel> m = LlamaModel::RandomInit(SmallConfig(), 3);
  ASSERT_TRUE(m.ok());
  StatusOr<std::unique_ptr<LlamaRunner>> runner =
      LlamaRunner::Create(std::move(*m), {.num_slots = 64, .decode = DecodeMode::kStatic});
  ASSERT_TRUE(runner.ok()) << runner.status().ToString();
  EXPECT_EQ((*runner)->num_slots(), 64);
  RunnerInput in;
  in.request = 1;
  in.tokens = {5};
  in.positions = {0};
  in.write_slots = {64};  // The scratch slot: past the pool.
  StatusOr<std::vector<RunnerOutput>> out = (*runner)->Forward({in});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("slot 64"), std::string::npos) << out.status().message();
}

TEST(StaticDecodeEngineTest, AStoreWithoutAScratchSlotIsRefused) {
  StatusOr<LlamaModel> m = LlamaModel::RandomInit(SmallConfig(), 3);
  ASSERT_TRUE(m.ok());
  StatusOr<KvTensors> kv = KvTensors::Create(m->KvOptions(64));
  ASSERT_TRUE(kv.ok());
  StatusOr<std::unique_ptr<StaticDecode>> step = StaticDecode::Create(*m, *kv, {});
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(step.status().message().find("scratch_slots"), std::string::npos)
      << step.status().message();
}

}  // namespace
}  // namespace vtoken::model
