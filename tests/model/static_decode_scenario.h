// The static decode step's test scenario, shared by tests/model/llama_static_decode_test.cc (the
// step on the CPU, and on CUDA) and tests/cuda_emu/static_decode_emu_test.cc (the step's kernel
// path on the CPU emulation of lib/cuda): scattered per-group slots, batches that pad to buckets
// 4, 8 and 1, a sequence crossing the 256-key bucket, and a step-by-step comparison of two
// decode paths (logits, signals), and the whole check of the step against ForwardPaged.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <vector>

#include "lib/model/llama.h"
#include "lib/model/static_decode.h"
#include "tests/model/small_model_config.h"

namespace vtoken::model::test_configs {

struct Case {
  Granularity granularity;
  bool signals;
};

inline void PrintTo(const Case& c, std::ostream* os) {
  *os << GranularityName(c.granularity) << (c.signals ? " with signals" : " without signals");
}

// A store of num_slots slots and the static step's scratch slot past them.
inline KvTensorsOptions WithScratch(const LlamaModel& model, int64_t num_slots, const Case& c) {
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
    groups_ = param.granularity == Granularity::kToken ? 1
              : param.granularity == Granularity::kLayer
                  ? config.num_hidden_layers
                  : config.num_hidden_layers * config.num_key_value_heads;
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

using StepFn =
    std::function<StatusOr<std::vector<PagedSeqOutput>>(const std::vector<PagedSeqInput>&)>;

// Runs the scenario's decode steps through `want` and `got` (both stores already prefilled) and
// compares every output; returns the largest logit difference seen.
inline float CompareDecodeSteps(Scenario& scenario, const StepFn& want_step, const StepFn& got_step,
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

// ForwardPaged on one store against StaticDecode on a second one with a scratch slot, from the
// same prefill: logits, signals, the K/V written, the step's statistics.
inline void ExpectStaticStepMatchesForwardPaged(const Case& param) {
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
  StatusOr<std::unique_ptr<internal::StaticDecode>> step =
      internal::StaticDecode::Create(*model, *static_kv, {});
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

}  // namespace vtoken::model::test_configs
