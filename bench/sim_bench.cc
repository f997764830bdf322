// The simulated backend's speed: whole engine runs at paper scale (Llama-3.1-8B shape, 16K
// contexts, 5,425 blocks, H2O) in engine steps and simulated tokens per second of this
// machine's time, and the parametric signal model per token.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <iterator>
#include <numeric>
#include <span>

#include "lib/core/check_harness.h"
#include "lib/core/policy_evictor.h"
#include "lib/engine/engine.h"
#include "lib/sim/cost_model.h"
#include "lib/sim/parametric_signals.h"
#include "lib/sim/sim_spec.h"

namespace vtoken::sim {
namespace {

void BM_SimRunPaperScale(benchmark::State& state) {
  const Mode mode = static_cast<Mode>(state.range(0));
  engine::EngineOptions o;
  o.mode = mode;
  o.pool = {.num_blocks = 5425, .block_size = 16, .headroom_blocks = 16};
  o.max_num_seqs = 8;
  o.admission = engine::EngineOptions::Admission::kGreedy;
  o.max_prefill_chunk = 8192;
  o.max_batched_tokens = 8192;
  o.policy = "h2o";
  o.evictor = {.keep_ratio = 0.5, .num_sink = 4, .num_recent = 64};
  engine::WorkloadOptions w;
  w.kind = "longbench_like";
  w.num_requests = 16;
  w.input_min = 15360;
  w.input_max = 16000;
  w.output_min = 128;
  w.output_max = 384;
  const std::vector<engine::Request> requests = *engine::GenerateWorkload(w, nullptr, 128256);
  int64_t steps = 0, tokens = 0;
  for (auto _ : state) {
    auto runner = MakeSimRunner("sim:llama-3.1-8b", DefaultSimConfig(), 5425 * 16, false);
    StatusOr<engine::EngineResult> r = engine::RunEngine(o, **runner, requests);
    if (!r.ok()) {
      state.SkipWithError(r.status().ToString().c_str());
      return;
    }
    steps += static_cast<int64_t>(r->steps.size());
    for (const engine::RequestResult& q : r->requests) {
      tokens += q.prompt_tokens + static_cast<int64_t>(q.output_tokens.size());
    }
  }
  state.SetLabel(ModeName(mode));
  state.counters["steps/s"] =
      benchmark::Counter(static_cast<double>(steps), benchmark::Counter::kIsRate);
  state.counters["sim_tokens/s"] =
      benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_SimRunPaperScale)
    ->Arg(static_cast<int>(Mode::kNative))
    ->Arg(static_cast<int>(Mode::kNaive))
    ->Arg(static_cast<int>(Mode::kVtoken))
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);

void BM_ParametricFill(benchmark::State& state) {
  ParametricSignals signals(VtTinyFit());
  std::vector<int64_t> pos(static_cast<size_t>(state.range(0)));
  std::iota(pos.begin(), pos.end(), 0);
  std::vector<float> attn(pos.size()), kn(pos.size());
  int64_t request = 0;
  for (auto _ : state) {
    signals.Fill({.request = request++ % 8, .positions = pos, .num_new = 1}, attn, kn)
        .status()
        .IgnoreError();
    benchmark::DoNotOptimize(attn.data());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_ParametricFill)->Arg(1024)->Arg(16384);

void BM_ForwardCost(benchmark::State& state) {
  const ModelShape shape = ShapeOf(*model::SyntheticConfig("llama-3.1-8b"), 2);
  const HardwareSpec hw = *HardwarePreset("h100-sxm-80g");
  std::vector<SeqWork> batch(32, SeqWork{.context_tokens = 8000, .new_tokens = 1});
  for (auto _ : state) benchmark::DoNotOptimize(ForwardCost(shape, hw, batch));
}
BENCHMARK(BM_ForwardCost);

// The policy's host work of one decode step of one sequence at head granularity, Llama-3.1-8B's
// 256 KV groups (32 layers x 8 KV heads): Observe every group's live tokens and signals, then
// GroupVictims (an eviction every evict_interval = range(1) steps: 8, or 1 as H2O's default),
// evicted from the evictor's lists.
// Each group keeps a quarter of a 3,072-token prompt (768 tokens, plus the tokens decoded since
// the last eviction). Synthetic signals (fixed random values); policies h2o (Arg 0: no state),
// tova (1) and scissorhands (2: per-token state). items = (group, token) entries observed.
void BM_PolicyStepGroups(benchmark::State& state) {
  static constexpr const char* kPolicies[] = {"h2o", "tova", "scissorhands"};
  const char* policy = kPolicies[state.range(0)];
  state.SetLabel(policy);
  EvictorOptions o{.keep_ratio = 0.25,
                   .num_sink = 4,
                   .num_recent = 32,
                   .evict_interval = state.range(1),
                   .granularity = Granularity::kHead,
                   .num_layers = 32,
                   .num_kv_heads = 8};
  const int32_t groups = NumGroups(o);
  auto evictor = PolicyEvictor::Create(policy, {}, o);
  if (!evictor.ok()) {
    state.SkipWithError(evictor.status().ToString().c_str());
    return;
  }
  const int64_t prompt = 3072;
  std::vector<float> noise(1 << 16);
  uint64_t rng = 11;
  for (float& x : noise) x = static_cast<float>(SplitMix64(rng) % 1000) / 1e5f;
  std::vector<std::vector<TokenId>> live(static_cast<size_t>(groups));
  for (auto& l : live) {
    l.resize(static_cast<size_t>(prompt));
    std::iota(l.begin(), l.end(), 0);
  }
  TokenId next = prompt;
  int64_t offset = 0, observed = 0;
  auto step = [&]() {
    for (int32_t g = 0; g < groups; ++g) {
      const size_t n = live[g].size();
      offset = (offset + 7919) % (static_cast<int64_t>(noise.size()) - static_cast<int64_t>(n));
      const std::span<const float> signal(noise.data() + offset, n);
      (*evictor)->Observe(0, g, live[g], signal, signal).IgnoreError();
      observed += static_cast<int64_t>(n);
    }
    StatusOr<std::vector<std::vector<TokenId>>> victims = (*evictor)->GroupVictims(0);
    for (int32_t g = 0; g < groups; ++g) {
      const std::vector<TokenId>& v = (*victims)[g];
      if (!v.empty()) {
        std::vector<TokenId> kept;
        std::set_difference(live[g].begin(), live[g].end(), v.begin(), v.end(),
                            std::back_inserter(kept));
        live[g] = std::move(kept);
      }
      live[g].push_back(next);
    }
    ++next;
  };
  step();  // The prefill: every group down to its budget.
  observed = 0;
  for (auto _ : state) step();
  state.SetItemsProcessed(observed);
  state.counters["live_per_group"] = static_cast<double>(live[0].size());
}
BENCHMARK(BM_PolicyStepGroups)->ArgsProduct({{0, 1, 2}, {8, 1}})->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace vtoken::sim

BENCHMARK_MAIN();
