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

struct Case {
  Granularity granularity;
  bool signals;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << GranularityName(c.granularity) << (c.signals ? " with signals" : " without signals");
}

// A store of num_slots slots and the static step's scratch slot past them.
KvTensorsOptions WithScratch(const LlamaModel& model, int64_t num_slots, const Case& c) {
  KvTensorsOptions o = model.KvOptions(num_slots, c.granularity);
  o.scratch_slots = 1;
  return o;
}

// Sequences with contexts of `lengths` tokens, every KV group holding the same live set in its
// own scattered slots, decoded for kSteps steps: three sequences (bucket 4, the longest crossing
// the 256-key bucket after a few steps), then five (bucket 8), then one alone (bucket 1).
class Scenario {
 public:
  static constexpr int64_t kSteps = 10;

  Scenario(const ModelConfig& config, Case param, uint64_t seed)
      : config_(config), param_(param), rng_(seed) {
    groups_ = param.granularity == Granularity::kToken   ? 1
              : param.granularity == Granularity::kLayer ? config.num_hidden_layers
                                                         : config.num_hidden_layers *
                                                               config.num_key_value_heads;
    int64_t per_group = 0;
    for (int64_t len : lengths_) {
      base_.push_back(per_group);
      per_group += len + kSteps;
    }
    per_group_ = per_group;
    order_.resize(static_cast<size_t>(per_group));
    std::iota(order_.begin(), order_.end(), 0);
    std::shuffle(order_.begin(), order_.end(), rng_);
    ctx_ = lengths_;
  }

  int64_t num_slots() const { return groups_ * per_group_; }

  std::vector<PagedSeqInput> Prefill() {
    std::vector<PagedSeqInput> out;
    for (size_t i = 0; i < lengths_.size(); ++i) out.push_back(Input(i, 0, lengths_[i]));
    return out;
  }

  std::vector<PagedSeqInput> Decode(int64_t step) {
    const size_t live = step < 4 ? 3 : step < 8 ? lengths_.size() : 1;
    std::vector<PagedSeqInput> out;
    for (size_t i = 0; i < live; ++i) out.push_back(Input(i, ctx_[i]++, 1));
    return out;
  }

 private:
  // Sequence i's token t sits in group g's slot g * per_group_ + order_[base_[i] + t].
  PagedSeqInput Input(size_t i, int64_t ctx, int64_t n) {
    PagedSeqInput in;
    for (int64_t g = 0; g < groups_; ++g) {
      in.context_offsets.push_back(static_cast<int64_t>(in.context_slots.size()));
      for (int64_t t = 0; t < ctx; ++t) {
        in.context_slots.push_back(g * per_group_ + order_[base_[i] + t]);
        in.context_positions.push_back(t);
      }
    }
    in.context_offsets.push_back(static_cast<int64_t>(in.context_slots.size()));
    for (int64_t g = 0; g < groups_; ++g) {
      for (int64_t t = ctx; t < ctx + n; ++t) {
        in.write_slots.push_back(g * per_group_ + order_[base_[i] + t]);
      }
    }
    for (int64_t t = ctx; t < ctx + n; ++t) {
      in.tokens.push_back(static_cast<int32_t>(2 + rng_() % (config_.vocab_size - 2)));
      in.positions.push_back(t);
    }
    in.obs_window = 4;
    in.want_signals = param_.signals;
    in.signals = i % 2 == 0 ? kAttnSignal | kKeyNormSignal : kAttnSignal;
    return in;
  }

  ModelConfig config_;
  Case param_;
  std::mt19937_64 rng_;
  const std::vector<int64_t> lengths_ = {250, 40, 7, 90, 3};
  int64_t groups_ = 1, per_group_ = 0;
  std::vector<int64_t> base_, order_, ctx_;
};

using StepFn = std::function<StatusOr<std::vector<PagedSeqOutput>>(
    const std::vector<PagedSeqInput>&)>;

// Runs the scenario's decode steps through `want` and `got` (both stores already prefilled) and
// compares every output; returns the largest logit difference seen.
float CompareDecodeSteps(Scenario& scenario, const StepFn& want_step, const StepFn& got_step,
                         float logit_tolerance) {
  float worst = 0;
  for (int64_t s = 0; s < Scenario::kSteps; ++s) {
    const std::vector<PagedSeqInput> decode = scenario.Decode(s);
    StatusOr<std::vector<PagedSeqOutput>> want = want_step(decode);
    StatusOr<std::vector<PagedSeqOutput>> got = got_step(decode);
    EXPECT_TRUE(want.ok()) << want.status().ToString();
    EXPECT_TRUE(got.ok()) << got.status().ToString();
    if (!want.ok() || !got.ok()) return worst;
    EXPECT_EQ(got->size(), decode.size());
    for (size_t i = 0; i < decode.size() && i < got->size(); ++i) {
      const PagedSeqOutput& w = (*want)[i];
      const PagedSeqOutput& g = (*got)[i];
      const float diff = (w.last_logits.cpu() - g.last_logits.cpu()).abs().max().item<float>();
      worst = std::max(worst, diff);
      EXPECT_LE(diff, logit_tolerance) << "step " << s << " seq " << i;
      EXPECT_EQ(g.attn.size(), w.attn.size());
      EXPECT_EQ(g.key_norm.size(), w.key_norm.size());
      for (size_t j = 0; j < w.attn.size() && j < g.attn.size(); ++j) {
        EXPECT_NEAR(g.attn[j], w.attn[j], 1e-5) << "step " << s << " seq " << i << " key " << j;
        EXPECT_NEAR(g.key_norm[j], w.key_norm[j], 1e-4) << "step " << s << " seq " << i;
        if (::testing::Test::HasFailure()) return worst;
      }
    }
  }
  return worst;
}

class StaticDecodeTest : public ::testing::TestWithParam<Case> {};

// ForwardPaged on one store against StaticDecode on a second one with a scratch slot, from the
// same prefill.
TEST_P(StaticDecodeTest, MatchesForwardPagedStepByStep) {
  const Case param = GetParam();
  const uint64_t seed = 20261201;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const ModelConfig config = SmallConfig();
  StatusOr<LlamaModel> model = LlamaModel::RandomInit(config, 5);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  Scenario scenario(config, param, seed);
  const int64_t num_slots = scenario.num_slots();
  StatusOr<KvTensors> eager_kv = KvTensors::Create(model->KvOptions(num_slots, param.granularity));
  StatusOr<KvTensors> static_kv = KvTensors::Create(WithScratch(*model, num_slots, param));
  ASSERT_TRUE(eager_kv.ok() && static_kv.ok());
  StatusOr<std::unique_ptr<StaticDecode>> step = StaticDecode::Create(*model, *static_kv, {});
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  // The prefill is no decode step: ForwardPaged on both stores.
  const std::vector<PagedSeqInput> prefill = scenario.Prefill();
  ASSERT_FALSE((*step)->Eligible(ViewsOf(prefill)));
  ASSERT_TRUE(model->ForwardPaged(prefill, *eager_kv).ok());
  ASSERT_TRUE(model->ForwardPaged(prefill, *static_kv).ok());

  CompareDecodeSteps(
      scenario, [&](const auto& in) { return model->ForwardPaged(in, *eager_kv); },
      [&](const auto& in) {
        EXPECT_TRUE((*step)->Eligible(ViewsOf(in)));
        return (*step)->Step(ViewsOf(in));
      },
      1e-4);
  // The same K/V in every slot the sequences own (the scratch slot aside), up to the rounding
  // of the two paths' projections (the fused CPU path's loops against torch ops).
  for (size_t t = 0; t < eager_kv->k_tensors().size(); ++t) {
    for (bool k : {true, false}) {
      const torch::Tensor& want = k ? eager_kv->k_tensors()[t] : eager_kv->v_tensors()[t];
      const torch::Tensor& got = k ? static_kv->k_tensors()[t] : static_kv->v_tensors()[t];
      EXPECT_LT((got.narrow(0, 0, num_slots) - want).abs().max().item<float>(), 1e-5)
          << (k ? "K" : "V") << " tensor " << t;
    }
  }
  const DecodeStats& stats = (*step)->stats();
  EXPECT_EQ(stats.static_steps, Scenario::kSteps);
  EXPECT_EQ(stats.replays, 0);  // No capture on the CPU.
  // Buckets (4, 256), (4, 512), (8, 512), (1, 512): the buffers grow at least for the first step
  // and for the batch of 8, and a bucket is prepared once per buffer generation.
  EXPECT_GE(stats.reallocations, 2);
  EXPECT_GE(stats.bodies_built, 4);
  EXPECT_LE(stats.bodies_built, 4 + stats.reallocations);
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
