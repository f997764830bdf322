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
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <tuple>

#include "lib/engine/engine.h"
#include "lib/model/cpu_ops.h"
#include "lib/model/llama_ops.h"
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

INSTANTIATE_TEST_SUITE_P(Granularities, StaticDecodeTest,
                         ::testing::Values(Case{Granularity::kToken, true},
                                           Case{Granularity::kToken, false},
                                           Case{Granularity::kLayer, true},
                                           Case{Granularity::kHead, true}));

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

INSTANTIATE_TEST_SUITE_P(GranularitiesAndDtypes, StaticDecodeCudaTest,
                         ::testing::Combine(::testing::Values(Case{Granularity::kToken, true},
                                                              Case{Granularity::kHead, true},
                                                              Case{Granularity::kToken, false}),
                                            ::testing::Values(torch::kFloat32, torch::kBFloat16)));

// LogitsOut: every decode step of the scenario runs on two stores from one prefill, once asking
// for every row's logits and once with per-sequence modes (all kArgMax: only the argmax comes
// back; all kSample: only the draws; mixed with kFull: the rows come back and the tokens are
// taken on the host; kNone). A token must be the Sampler's choice over the row the first run
// returned: bit for bit the same computation for the argmax; for a draw, the same rule and
// uniform, in the device's arithmetic (SampleRows). Paths: ForwardPaged (fused CPU kernel or
// torch ops / the CUDA kernel), the static step, and its CUDA graphs; on the CPU, and on CUDA
// where there is one (else skipped; scripts/device-check.sh runs them).
enum class TokenPath { kForwardFused, kForwardTorch, kStatic, kGraphs };

std::string TokenPathName(TokenPath p) {
  switch (p) {
    case TokenPath::kForwardFused:
      return "ForwardFused";
    case TokenPath::kForwardTorch:
      return "ForwardTorch";
    case TokenPath::kStatic:
      return "Static";
    case TokenPath::kGraphs:
      return "Graphs";
  }
  return "?";
}

LogitsOut TokenMode(int64_t step, size_t seq) {
  switch (step % 5) {
    case 0:
      return LogitsOut::kArgMax;
    case 1:
      return seq % 3 == 0 ? LogitsOut::kArgMax : seq % 3 == 1 ? LogitsOut::kNone : LogitsOut::kFull;
    case 2:
      return seq == 0 ? LogitsOut::kNone : LogitsOut::kArgMax;
    case 3:
      return LogitsOut::kSample;
    default:
      return seq % 3 == 0   ? LogitsOut::kSample
             : seq % 3 == 1 ? LogitsOut::kArgMax
                            : LogitsOut::kFull;
  }
}

// A sampling sequence's parameters: a nucleus, every token, a sharp one; the uniform from `rng`.
SampleDraw TokenDraw(int64_t step, size_t seq, std::mt19937_64& rng) {
  static constexpr double kTemperature[] = {0.8, 1.0, 0.3}, kTopP[] = {0.9, 1.0, 0.5};
  const size_t k = (seq + static_cast<size_t>(step)) % 3;
  return {.temperature = kTemperature[k],
          .top_p = kTopP[k],
          .uniform = std::uniform_real_distribution<double>(0.0, 1.0)(rng)};
}

void ExpectTokenIsTheSamplersChoice(TokenPath path, const Case& param, torch::Device device) {
  const uint64_t seed = 20261203;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const ModelConfig config = SmallConfig();
  StatusOr<LlamaModel> model = LlamaModel::RandomInit(
      config, 5, {.device = device, .fused_cpu_attention = path == TokenPath::kForwardFused});
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  Scenario scenario(config, param, seed);
  std::mt19937_64 rng(seed);
  std::vector<KvTensors> kv;
  std::vector<std::unique_ptr<StaticDecode>> step;
  for (int i = 0; i < 2; ++i) {
    StatusOr<KvTensors> store = KvTensors::Create(WithScratch(*model, scenario.num_slots(), param));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    kv.push_back(std::move(*store));
  }
  const std::vector<PagedSeqInput> prefill = scenario.Prefill();
  for (KvTensors& store : kv) {
    if (path == TokenPath::kStatic || path == TokenPath::kGraphs) {
      StatusOr<std::unique_ptr<StaticDecode>> s =
          StaticDecode::Create(*model, store, {.capture = path == TokenPath::kGraphs});
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      step.push_back(std::move(*s));
    }
    ASSERT_TRUE(model->ForwardPaged(prefill, store).ok());
  }
  int64_t argmax_rows = 0, sampled_rows = 0, sampled_off_argmax = 0;
  for (int64_t s = 0; s < Scenario::kSteps; ++s) {
    std::vector<PagedSeqInput> full = scenario.Decode(s);
    std::vector<PagedSeqInput> modes = full;
    for (size_t i = 0; i < modes.size(); ++i) {
      modes[i].logits = TokenMode(s, i);
      if (modes[i].logits == LogitsOut::kSample) modes[i].draw = TokenDraw(s, i, rng);
    }
    auto run = [&](int which, const std::vector<PagedSeqInput>& in) {
      return step.empty() ? model->ForwardPaged(in, kv[which]) : step[which]->Step(ViewsOf(in));
    };
    StatusOr<std::vector<PagedSeqOutput>> want = run(0, full);
    StatusOr<std::vector<PagedSeqOutput>> got = run(1, modes);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(got->size(), modes.size());
    for (size_t i = 0; i < modes.size(); ++i) {
      const PagedSeqOutput& w = (*want)[i];
      const PagedSeqOutput& g = (*got)[i];
      ASSERT_TRUE(w.last_logits.defined());
      EXPECT_EQ(w.token, -1);
      const torch::Tensor row = w.last_logits.to(torch::kCPU).contiguous();
      const int64_t argmax = CpuArgMax(row.data_ptr<float>(), row.numel());
      switch (modes[i].logits) {
        case LogitsOut::kFull:
          ASSERT_TRUE(g.last_logits.defined());
          EXPECT_TRUE(torch::equal(g.last_logits.to(torch::kCPU), row)) << "step " << s;
          EXPECT_EQ(g.token, -1);
          break;
        case LogitsOut::kArgMax:
          EXPECT_FALSE(g.last_logits.defined());
          EXPECT_EQ(g.token, argmax) << "step " << s << " seq " << i;
          ++argmax_rows;
          break;
        case LogitsOut::kSample:
          EXPECT_FALSE(g.last_logits.defined());
          EXPECT_EQ(g.token, SampleRow(row, modes[i].draw))
              << "step " << s << " seq " << i << " top_p " << modes[i].draw.top_p << " u "
              << modes[i].draw.uniform;
          ++sampled_rows;
          sampled_off_argmax += g.token != argmax;
          break;
        case LogitsOut::kNone:
          EXPECT_FALSE(g.last_logits.defined());
          EXPECT_EQ(g.token, -1);
          break;
      }
      ASSERT_EQ(g.attn.size(), w.attn.size());
      ASSERT_EQ(g.key_norm.size(), w.key_norm.size());
      for (size_t j = 0; j < w.attn.size(); ++j) {
        ASSERT_NEAR(g.attn[j], w.attn[j], 1e-6) << "step " << s << " seq " << i << " key " << j;
        ASSERT_NEAR(g.key_norm[j], w.key_norm[j], 1e-6) << "step " << s << " seq " << i;
      }
    }
  }
  EXPECT_GT(argmax_rows, Scenario::kSteps);
  EXPECT_GT(sampled_rows, 3);
  // The draws are not all the argmax: the sampling really ran (a random model's logits are flat).
  EXPECT_GT(sampled_off_argmax, 0);
  std::printf("%lld argmax rows, %lld sampled (%lld not the argmax)\n",
              static_cast<long long>(argmax_rows), static_cast<long long>(sampled_rows),
              static_cast<long long>(sampled_off_argmax));
  if (!step.empty()) {
    EXPECT_EQ(step[1]->stats().static_steps, Scenario::kSteps);
    if (path == TokenPath::kGraphs) EXPECT_EQ(step[1]->stats().replays, Scenario::kSteps);
  }
}

std::string TokenCaseName(const ::testing::TestParamInfo<std::tuple<TokenPath, Case>>& info) {
  const Case& c = std::get<1>(info.param);
  return TokenPathName(std::get<0>(info.param)) + "_" +
         std::string(GranularityName(c.granularity)) + (c.signals ? "_signals" : "");
}

const auto kTokenCases =
    ::testing::Values(Case{Granularity::kToken, true}, Case{Granularity::kHead, true},
                      Case{Granularity::kLayer, false});
// On CUDA two of them: the device check's time is scarce (scripts/device-check.sh).
const auto kTokenCudaCases =
    ::testing::Values(Case{Granularity::kToken, true}, Case{Granularity::kHead, true});

class ForwardTokenTest : public ::testing::TestWithParam<std::tuple<TokenPath, Case>> {};

TEST_P(ForwardTokenTest, IsTheSamplersChoiceOverTheLogitsItStandsFor) {
  ExpectTokenIsTheSamplersChoice(std::get<0>(GetParam()), std::get<1>(GetParam()), torch::kCPU);
}

INSTANTIATE_TEST_SUITE_P(PathsAndGranularities, ForwardTokenTest,
                         ::testing::Combine(::testing::Values(TokenPath::kForwardFused,
                                                              TokenPath::kForwardTorch,
                                                              TokenPath::kStatic),
                                            kTokenCases),
                         TokenCaseName);

class ForwardTokenCudaTest : public ::testing::TestWithParam<std::tuple<TokenPath, Case>> {};

TEST_P(ForwardTokenCudaTest, IsTheSamplersChoiceOverTheLogitsItStandsFor) {
#ifndef VTOKEN_TORCH_CUDA
  GTEST_SKIP() << "libtorch without CUDA (VTOKEN_TORCH_CUDA)";
#else
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  ExpectTokenIsTheSamplersChoice(std::get<0>(GetParam()), std::get<1>(GetParam()),
                                 torch::Device(torch::kCUDA));
#endif
}

INSTANTIATE_TEST_SUITE_P(PathsAndGranularities, ForwardTokenCudaTest,
                         ::testing::Combine(::testing::Values(TokenPath::kForwardTorch,
                                                              TokenPath::kStatic,
                                                              TokenPath::kGraphs),
                                            kTokenCudaCases),
                         TokenCaseName);

TEST(GreedyArgMaxRowsTest, TakesTheLowestIdOnTies) {
  const torch::Tensor logits =
      torch::tensor({1.0f, 3.0f, 3.0f, 0.0f, 5.0f, 5.0f, 5.0f, 5.0f, -2.0f, -1.0f, -1.0f, -3.0f})
          .view({3, 4});
  const torch::Tensor got = internal::ArgMaxRows(logits);
  EXPECT_EQ(got.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(got, torch::tensor({1.0f, 0.0f, 1.0f}))) << got;
  for (int64_t r = 0; r < 3; ++r) {  // Sampler's greedy rule, through CpuArgMax.
    EXPECT_EQ(CpuArgMax(logits[r].contiguous().data_ptr<float>(), 4), got[r].item<float>());
  }
  // Non-finite values: NaN never wins (a row of NaN gives 0), +inf does.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const torch::Tensor odd = torch::tensor({nan, 1.0f, 2.0f, nan, nan, nan, nan, nan, 1.0f, inf, nan,
                                           inf, -inf, -inf, nan, -inf})
                                .view({4, 4});
  const torch::Tensor odd_got = internal::ArgMaxRows(odd);
  EXPECT_TRUE(torch::equal(odd_got, torch::tensor({2.0f, 0.0f, 1.0f, 0.0f}))) << odd_got;
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(CpuArgMax(odd[r].contiguous().data_ptr<float>(), 4), odd_got[r].item<float>());
  }
#ifdef VTOKEN_TORCH_CUDA
  if (torch::cuda::is_available()) {
    EXPECT_TRUE(torch::equal(internal::ArgMaxRows(logits.cuda()).cpu(), got));
    EXPECT_TRUE(torch::equal(internal::ArgMaxRows(odd.cuda()).cpu(), odd_got));
  }
#endif
}

std::vector<engine::Request> Requests(int n, int64_t prompt, int64_t max_tokens) {
  return test_configs::Requests(n, prompt, 11, max_tokens, 41);
}

// Sampling at temperature 0.8 (each request has its own stream, seeded from the run's seed).
SamplingParams Sampled(double top_p) { return {.temperature = 0.8, .top_p = top_p, .seed = 100}; }

struct EngineRun {
  engine::EngineResult result;
  DecodeStats stats;
};

StatusOr<EngineRun> RunEngine(Mode mode, DecodeMode decode,
                              const std::vector<engine::Request>& requests,
                              const LlamaOptions& options = {},
                              const SamplingParams& sampling = {}) {
  engine::EngineOptions o = test_configs::H2oEngineOptions(mode, 96, 64);
  o.sampling = sampling;
  VTOKEN_ASSIGN_OR_RETURN(LlamaModel m, LlamaModel::RandomInit(SmallConfig(), 3, options));
  VTOKEN_ASSIGN_OR_RETURN(
      std::unique_ptr<LlamaRunner> runner,
      LlamaRunner::Create(std::move(m), {.num_slots = 96 * 16, .decode = decode}));
  EXPECT_EQ(runner->num_slots(), 96 * 16);
  VTOKEN_ASSIGN_OR_RETURN(engine::EngineResult result, engine::RunEngine(o, *runner, requests));
  return EngineRun{std::move(result), runner->decode_stats()};
}

// Greedy and sampled: the static step takes the tokens in its buffers (SampleRows for draws),
// the eager fused step on the host (Sampler), with the same uniforms.
TEST(StaticDecodeEngineTest, GivesTheEagerRunnersTokensInNaiveAndVtoken) {
  const std::vector<engine::Request> requests = Requests(5, 120, 20);
  for (const auto& [sampling, mode] :
       {std::pair{SamplingParams{}, Mode::kNaive}, std::pair{SamplingParams{}, Mode::kVtoken},
        std::pair{Sampled(0.9), Mode::kNaive}, std::pair{Sampled(1.0), Mode::kVtoken}}) {
    StatusOr<EngineRun> eager = RunEngine(mode, DecodeMode::kEager, requests, {}, sampling);
    StatusOr<EngineRun> fixed = RunEngine(mode, DecodeMode::kStatic, requests, {}, sampling);
    ASSERT_TRUE(eager.ok()) << eager.status().ToString();
    ASSERT_TRUE(fixed.ok()) << fixed.status().ToString();
    EXPECT_EQ(eager->stats.static_steps, 0);
    EXPECT_GT(fixed->stats.static_steps, 10);
    EXPECT_EQ(fixed->result.violations, 0);
    EXPECT_EQ(fixed->result.evictions, eager->result.evictions);
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(fixed->result.requests[i].output_tokens, eager->result.requests[i].output_tokens)
          << "request " << i << " in " << ModeName(mode) << " temperature " << sampling.temperature
          << " top_p " << sampling.top_p;
    }
  }
}

// Sampling really samples there: the draws are not the greedy tokens.
TEST(StaticDecodeEngineTest, SampledRequestsDrawOtherTokensThanGreedyOnes) {
  const std::vector<engine::Request> requests = Requests(5, 120, 20);
  StatusOr<EngineRun> a = RunEngine(Mode::kVtoken, DecodeMode::kStatic, requests);
  StatusOr<EngineRun> b = RunEngine(Mode::kVtoken, DecodeMode::kStatic, requests, {}, Sampled(0.9));
  ASSERT_TRUE(a.ok() && b.ok());
  int differ = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    differ += a->result.requests[i].output_tokens != b->result.requests[i].output_tokens;
  }
  EXPECT_GE(differ, 4);
}

TEST(StaticDecodeCudaTest, EngineWithCudaGraphsGivesTheEagerRunnersTokens) {
#ifndef VTOKEN_TORCH_CUDA
  GTEST_SKIP() << "libtorch without CUDA (VTOKEN_TORCH_CUDA): no CUDA graphs";
#else
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const std::vector<engine::Request> requests = Requests(5, 120, 20);
  const LlamaOptions cuda{.device = torch::Device(torch::kCUDA)};
  for (const auto& [sampling, mode] :
       {std::pair{SamplingParams{}, Mode::kNaive}, std::pair{SamplingParams{}, Mode::kVtoken},
        std::pair{Sampled(0.9), Mode::kNaive}, std::pair{Sampled(1.0), Mode::kVtoken}}) {
    StatusOr<EngineRun> eager = RunEngine(mode, DecodeMode::kEager, requests, cuda, sampling);
    StatusOr<EngineRun> graphs = RunEngine(mode, DecodeMode::kCudaGraphs, requests, cuda, sampling);
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
  EXPECT_NE(runner.status().message().find("CUDA"), std::string::npos) << runner.status().message();
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
