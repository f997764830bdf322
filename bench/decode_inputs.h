// Decode-step inputs and KV stores shared by the lib/model benchmarks (torch_model_bench on
// vt-tiny, torch_gpu_bench on a model of any size and device).
#pragma once

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "lib/model/kv_tensors.h"
#include "lib/model/llama.h"

namespace vtoken::model {

// One decode step for `batch` sequences of `context` earlier tokens each. Sequence s owns the
// (context + 1) slots starting at s * (context + 1): its context in logical order, then the slot
// its new token is written to. `scattered` applies one random permutation to all those slots, the
// layout left behind by evictions and relocations; otherwise every context is contiguous, which is
// what a dense cache reads. Positions go up to `context`, past vt-tiny's trained 1024 for the
// larger contexts: RoPE is defined there and the cost does not depend on it. With `groups` > 1
// KV groups (a store of groups * batch * (context + 1) slots) every group holds the same live
// tokens, group g of sequence s in the (context + 1) slots from (g * batch + s) * (context + 1).
inline std::vector<PagedSeqInput> DecodeInputs(int64_t batch, int64_t context, int64_t vocab,
                                               bool scattered, uint64_t seed, int64_t groups = 1) {
  std::vector<int64_t> slots(static_cast<size_t>(groups * batch * (context + 1)));
  std::iota(slots.begin(), slots.end(), 0);
  if (scattered) {
    std::mt19937_64 rng(seed);
    std::shuffle(slots.begin(), slots.end(), rng);
  }
  std::vector<PagedSeqInput> inputs(static_cast<size_t>(batch));
  for (int64_t s = 0; s < batch; ++s) {
    PagedSeqInput& in = inputs[s];
    for (int64_t g = 0; g < groups; ++g) {
      auto first = slots.begin() + (g * batch + s) * (context + 1);
      in.context_slots.insert(in.context_slots.end(), first, first + context);
      in.write_slots.push_back(*(first + context));
      if (groups > 1) in.context_offsets.push_back(g * context);
    }
    if (groups > 1) in.context_offsets.push_back(groups * context);
    in.tokens = {static_cast<int32_t>((s * 7919 + 1) % vocab)};
    in.positions = {context};
  }
  return inputs;
}

// One sequence's prefill of `tokens` new tokens from an empty cache, written to slots 0..tokens-1.
inline PagedSeqInput PrefillInput(int64_t tokens, int64_t vocab, bool want_signals = true) {
  PagedSeqInput in;
  in.want_signals = want_signals;
  for (int64_t i = 0; i < tokens; ++i) {
    in.tokens.push_back(static_cast<int32_t>((i * 31 + 7) % vocab));
    in.positions.push_back(i);
    in.write_slots.push_back(i);
  }
  return in;
}

// A KV store of `model`'s shape (with `scratch_slots` past num_slots) filled with normal noise,
// so softmax and norms see real values; on an error, skips `state` with it and returns nullopt.
inline std::optional<KvTensors> FilledKv(const LlamaModel& model, int64_t num_slots,
                                         benchmark::State& state,
                                         Granularity granularity = Granularity::kToken,
                                         int64_t scratch_slots = 0) {
  KvTensorsOptions options = model.KvOptions(num_slots, granularity);
  options.scratch_slots = scratch_slots;
  StatusOr<KvTensors> kv = KvTensors::Create(options);
  if (!kv.ok()) {
    state.SkipWithError(kv.status().ToString().c_str());
    return std::nullopt;
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < kv->k_tensors().size(); ++i) {
    kv->k_tensors()[i].normal_();
    kv->v_tensors()[i].normal_();
  }
  return std::move(*kv);
}

}  // namespace vtoken::model
