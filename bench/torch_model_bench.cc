// Google Benchmark suite for lib/model on the bundled vt-tiny model (CPU libtorch). Figures and
// commands: docs/PERFORMANCE.md.
//
// The model directory is $VTOKEN_SOURCE_DIR/models/vt-tiny, or models/vt-tiny next to this source
// file when the variable is unset. Comparisons that are reported as a ratio (scattered vs
// contiguous slots, copy engine vs one copy_) run both sides inside the same iteration, in
// alternating order, so that load from other processes hits both sides alike.
//
// Every figure is process CPU time (all threads of this process), not wall time: the machines this
// runs on are shared, and time spent waiting for a core is not the code's cost. With one torch
// thread CPU time equals wall time on an idle machine; with more it is their sum.
#include <benchmark/benchmark.h>
#include <malloc.h>
#include <time.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench/decode_inputs.h"
#include "lib/core/policy.h"
#include "lib/core/policy_registry.h"
#include "lib/model/blas_info.h"
#include "lib/model/cpu_bf16.h"
#include "lib/model/cpu_isa.h"
#include "lib/model/cpu_quant_ops.h"
#include "lib/model/cpu_threads.h"
#include "lib/model/io/model_files.h"
#include "lib/model/kv_tensors.h"
#include "lib/model/llama.h"
#include "lib/model/query_moments.h"
#include "lib/model/sampler.h"
#include "lib/model/torch_copy_engine.h"

namespace vtoken::model {
namespace {

// Process CPU time in seconds.
double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::string ModelDir() {
  if (const char* src = std::getenv("VTOKEN_SOURCE_DIR")) {
    return std::string(src) + "/models/vt-tiny";
  }
  return (std::filesystem::path(__FILE__).parent_path().parent_path() / "models" / "vt-tiny")
      .string();
}

// The model is loaded once; a load error is reported by every benchmark that needs it.
const StatusOr<LlamaModel>& VtTiny() {
  static const StatusOr<LlamaModel> model = LlamaModel::FromDirectory(ModelDir());
  return model;
}

// Decode throughput: one ForwardPaged call per iteration with one new token for each of
// range(0) sequences whose range(1) context slots are scattered. items/s is tokens per CPU second.
void BM_DecodeStep(benchmark::State& state) {
  const int64_t batch = state.range(0), context = state.range(1);
  if (!VtTiny().ok()) return state.SkipWithError(VtTiny().status().ToString().c_str());
  const LlamaModel& model = *VtTiny();
  std::optional<KvTensors> kv = FilledKv(model, batch * (context + 1), state);
  if (!kv) return;
  const auto inputs = DecodeInputs(batch, context, model.config().vocab_size, true, 1);
  for (auto _ : state) {
    auto out = model.ForwardPaged(inputs, *kv);
    if (!out.ok()) return state.SkipWithError(out.status().ToString().c_str());
    benchmark::DoNotOptimize(out);
  }
  state.SetItemsProcessed(state.iterations() * batch);
}
BENCHMARK(BM_DecodeStep)
    ->ArgNames({"batch", "context"})
    ->ArgsProduct({{1, 8, 32}, {512, 2048, 8192}})
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime();

// The price of reading live slots where they lie: the same decode step with scattered context
// slots and with contiguous ones, both in every iteration. The reported time is the scattered
// step; counters give both step times and ratio = scattered / contiguous.
void BM_DecodeScatteredVsContiguous(benchmark::State& state) {
  const int64_t batch = state.range(0), context = state.range(1);
  if (!VtTiny().ok()) return state.SkipWithError(VtTiny().status().ToString().c_str());
  const LlamaModel& model = *VtTiny();
  std::optional<KvTensors> kv = FilledKv(model, batch * (context + 1), state);
  if (!kv) return;
  const int64_t vocab = model.config().vocab_size;
  const auto scattered = DecodeInputs(batch, context, vocab, true, 2);
  const auto contiguous = DecodeInputs(batch, context, vocab, false, 0);
  double scattered_s = 0, contiguous_s = 0;
  auto timed = [&](const std::vector<PagedSeqInput>& inputs) -> std::optional<double> {
    const double begin = CpuSeconds();
    auto out = model.ForwardPaged(inputs, *kv);
    const double end = CpuSeconds();
    if (!out.ok()) {
      state.SkipWithError(out.status().ToString().c_str());
      return std::nullopt;
    }
    return end - begin;
  };
  bool scattered_first = true;
  for (auto _ : state) {
    std::optional<double> s, c;
    if (scattered_first) {
      s = timed(scattered);
      c = timed(contiguous);
    } else {
      c = timed(contiguous);
      s = timed(scattered);
    }
    if (!s || !c) return;
    scattered_first = !scattered_first;
    scattered_s += *s;
    contiguous_s += *c;
    state.SetIterationTime(*s);
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["scattered_ms"] = 1e3 * scattered_s / n;
  state.counters["contiguous_ms"] = 1e3 * contiguous_s / n;
  state.counters["ratio"] = scattered_s / contiguous_s;
}
BENCHMARK(BM_DecodeScatteredVsContiguous)
    ->ArgNames({"batch", "context"})
    ->Args({1, 8192})
    ->Args({8, 2048})
    ->Args({32, 2048})
    ->Args({32, 8192})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

// Runs `a` and `b` (each returns the seconds it took) once per iteration, alternating which goes
// first so that neither always runs on a warmer cache; the iteration's time is a's. Returns the
// total seconds of a and of b.
template <typename A, typename B>
std::pair<double, double> TimeAlternating(benchmark::State& state, A a, B b) {
  double a_s = 0, b_s = 0;
  bool a_first = true;
  for (auto _ : state) {
    double ta, tb;
    if (a_first) {
      ta = a();
      tb = b();
    } else {
      tb = b();
      ta = a();
    }
    a_first = !a_first;
    a_s += ta;
    b_s += tb;
    state.SetIterationTime(ta);
  }
  return {a_s, b_s};
}

// The price of the eviction signals in a decode step (scattered slots): every iteration runs the
// step with both signals (what every policy got before Policy::signals()), with attention mass
// only (H2O, TOVA, SnapKV, ...) and with none (StreamingLLM; and native mode), in rotating order.
// The reported time is the attention-only step; counters give the three step times and the
// ratios to the step with both.
void BM_DecodeSignalCost(benchmark::State& state) {
  const int64_t batch = state.range(0), context = state.range(1);
  if (!VtTiny().ok()) return state.SkipWithError(VtTiny().status().ToString().c_str());
  const LlamaModel& model = *VtTiny();
  std::optional<KvTensors> kv = FilledKv(model, batch * (context + 1), state);
  if (!kv) return;
  const uint8_t kinds[3] = {kAttnSignal | kKeyNormSignal, kAttnSignal, 0};
  std::vector<PagedSeqInput> inputs[3];
  for (int k = 0; k < 3; ++k) {
    inputs[k] = DecodeInputs(batch, context, model.config().vocab_size, true, 4);
    for (PagedSeqInput& in : inputs[k]) in.signals = kinds[k];
  }
  double total[3] = {0, 0, 0};
  int first = 0;
  for (auto _ : state) {
    double took[3];
    for (int i = 0; i < 3; ++i) {
      const int k = (first + i) % 3;
      const double begin = CpuSeconds();
      auto out = model.ForwardPaged(inputs[k], *kv);
      took[k] = CpuSeconds() - begin;
      if (!out.ok()) return state.SkipWithError(out.status().ToString().c_str());
      benchmark::DoNotOptimize(out);
    }
    first = (first + 1) % 3;
    for (int k = 0; k < 3; ++k) total[k] += took[k];
    state.SetIterationTime(took[1]);
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["both_ms"] = 1e3 * total[0] / n;
  state.counters["attn_ms"] = 1e3 * total[1] / n;
  state.counters["none_ms"] = 1e3 * total[2] / n;
  state.counters["attn_ratio"] = total[1] / total[0];
  state.counters["none_ratio"] = total[2] / total[0];
}
BENCHMARK(BM_DecodeSignalCost)
    ->ArgNames({"batch", "context"})
    ->Args({1, 2048})
    ->Args({8, 2048})
    ->Args({32, 2048})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

// The price of KV groups: the same decode step (same model, same live tokens, scattered slots) at
// token granularity and at range(2) = 1 layer or 2 head granularity, both in every iteration,
// alternating which goes first; each reads the same KV bytes, the group store through one slot
// list per group. The reported time is the group step; counters give both step times and
// ratio = group / token. vt-tiny has 1 KV head, so its layer and head groups coincide (6 each).
void BM_DecodeTokenVsGroups(benchmark::State& state) {
  const int64_t batch = state.range(0), context = state.range(1);
  const Granularity granularity = state.range(2) == 1 ? Granularity::kLayer : Granularity::kHead;
  if (!VtTiny().ok()) return state.SkipWithError(VtTiny().status().ToString().c_str());
  const LlamaModel& model = *VtTiny();
  const ModelConfig& c = model.config();
  const int64_t groups = NumKvGroups(granularity, c.num_hidden_layers, c.num_key_value_heads);
  std::optional<KvTensors> token_kv = FilledKv(model, batch * (context + 1), state);
  std::optional<KvTensors> group_kv =
      FilledKv(model, groups * batch * (context + 1), state, granularity);
  if (!token_kv || !group_kv) return;
  const auto token_inputs = DecodeInputs(batch, context, c.vocab_size, true, 6);
  const auto group_inputs = DecodeInputs(batch, context, c.vocab_size, true, 6, groups);
  auto timed = [&](const std::vector<PagedSeqInput>& inputs, KvTensors& kv) {
    const double begin = CpuSeconds();
    auto out = model.ForwardPaged(inputs, kv);
    benchmark::DoNotOptimize(out);
    if (!out.ok()) state.SkipWithError(out.status().ToString().c_str());
    return CpuSeconds() - begin;
  };
  const auto [group_s, token_s] = TimeAlternating(
      state, [&] { return timed(group_inputs, *group_kv); },
      [&] { return timed(token_inputs, *token_kv); });
  const double n = static_cast<double>(state.iterations());
  state.counters["token_ms"] = 1e3 * token_s / n;
  state.counters["group_ms"] = 1e3 * group_s / n;
  state.counters["ratio"] = group_s / token_s;
}
BENCHMARK(BM_DecodeTokenVsGroups)
    ->ArgNames({"batch", "context", "granularity"})
    ->ArgsProduct({{8, 32}, {512, 2048}, {1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

// The decode step at Llama-3.1-8B's KV group count (32 layers x 8 KV heads at head granularity:
// 256 groups) on a SYNTHETIC model of those counts and the smallest widths (one query head per KV
// head, head_dim 4, hidden 32; random weights): the weight GEMMs cost next to nothing and
// attention reads 32 bytes a key, so the step's work per key outside attention (checking and
// laying out every group's slot list, the signals: host work a GPU step pays too at head
// granularity) is a visible part of the time. batch x 256 x (context + 1) keys a step,
// contiguous slots (scattered ones would make it a cache-miss benchmark), the attention signal
// on. Wall time; ns_per_key = time / keys.
void BM_DecodeManyGroups(benchmark::State& state) {
  const int64_t batch = state.range(0), context = state.range(1);
  static const StatusOr<LlamaModel> model = [] {
    ModelConfig c;
    c.vocab_size = 64;
    c.hidden_size = 32;
    c.intermediate_size = 32;
    c.num_hidden_layers = 32;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 8;
    c.head_dim = 4;
    c.max_position_embeddings = 1 << 20;
    return LlamaModel::RandomInit(c, 1);
  }();
  if (!model.ok()) return state.SkipWithError(model.status().ToString().c_str());
  const ModelConfig& c = model->config();
  const int64_t groups =
      NumKvGroups(Granularity::kHead, c.num_hidden_layers, c.num_key_value_heads);
  std::optional<KvTensors> kv =
      FilledKv(*model, groups * batch * (context + 1), state, Granularity::kHead);
  if (!kv) return;
  auto inputs = DecodeInputs(batch, context, c.vocab_size, false, 8, groups);
  for (PagedSeqInput& in : inputs) {
    in.signals = kAttnSignal;
    in.logits = LogitsOut::kArgMax;
  }
  const std::vector<PagedSeqView> views = ViewsOf(inputs);
  for (auto _ : state) {
    auto out = model->ForwardPaged(std::span<const PagedSeqView>(views), *kv);
    if (!out.ok()) return state.SkipWithError(out.status().ToString().c_str());
    benchmark::DoNotOptimize(out);
  }
  state.counters["keys"] = static_cast<double>(groups * batch * (context + 1));
  state.counters["ns_per_key"] = benchmark::Counter(
      static_cast<double>(groups * batch * (context + 1)),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_DecodeManyGroups)
    ->ArgNames({"batch", "context"})
    ->Args({16, 512})
    ->Args({1, 4096})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// vt-tiny on the per-sequence torch path (the reference of the fused benchmarks).
const StatusOr<LlamaModel>& VtTinyReference() {
  static const StatusOr<LlamaModel> model =
      LlamaModel::FromDirectory(ModelDir(), {.fused_cpu_attention = false});
  return model;
}

// Times one step of `inputs` through the fused model and the reference in every iteration,
// alternating which goes first; reports the fused time and counters for both, the speedup and
// the fused path's tokens/s for `tokens` new tokens per step.
void TimeFusedVsReference(benchmark::State& state, const std::vector<PagedSeqInput>& inputs,
                          KvTensors& kv, int64_t tokens) {
  auto timed = [&](const LlamaModel& m) {
    const double begin = CpuSeconds();
    auto out = m.ForwardPaged(inputs, kv);
    benchmark::DoNotOptimize(out);
    return CpuSeconds() - begin;
  };
  const auto [fused_s, reference_s] = TimeAlternating(
      state, [&] { return timed(*VtTiny()); }, [&] { return timed(*VtTinyReference()); });
  const double n = static_cast<double>(state.iterations());
  state.counters["fused_ms"] = 1e3 * fused_s / n;
  state.counters["reference_ms"] = 1e3 * reference_s / n;
  state.counters["speedup"] = reference_s / fused_s;
  state.counters["fused_tok_s"] = static_cast<double>(tokens) * n / fused_s;
}

// The fused CPU attention kernel against the per-sequence torch ops it replaced: the same decode
// step (scattered slots) through two copies of vt-tiny that differ only in
// LlamaOptions::fused_cpu_attention, both in every iteration, alternating which goes first. The
// reported time is the fused step; counters give both and speedup = reference / fused. Signals
// are computed by both (a policy reads them every step).
void BM_DecodeFusedVsReference(benchmark::State& state) {
  const int64_t batch = state.range(0), context = state.range(1);
  if (!VtTiny().ok() || !VtTinyReference().ok()) {
    return state.SkipWithError("vt-tiny did not load");
  }
  const LlamaModel& fused = *VtTiny();
  std::optional<KvTensors> kv = FilledKv(fused, batch * (context + 1), state);
  if (!kv) return;
  const auto inputs = DecodeInputs(batch, context, fused.config().vocab_size, true, 4);
  TimeFusedVsReference(state, inputs, *kv, batch);
}
BENCHMARK(BM_DecodeFusedVsReference)
    ->ArgNames({"batch", "context"})
    ->ArgsProduct({{1, 8, 32}, {512, 2048}})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

// The same comparison for a prefill chunk: range(0) new tokens after range(1) context tokens,
// one sequence, scattered slots.
void BM_PrefillFusedVsReference(benchmark::State& state) {
  const int64_t chunk = state.range(0), context = state.range(1);
  if (!VtTiny().ok() || !VtTinyReference().ok()) {
    return state.SkipWithError("vt-tiny did not load");
  }
  const LlamaModel& fused = *VtTiny();
  std::optional<KvTensors> kv = FilledKv(fused, context + chunk, state);
  if (!kv) return;
  std::vector<int64_t> slots(static_cast<size_t>(context + chunk));
  std::iota(slots.begin(), slots.end(), 0);
  std::mt19937_64 rng(5);
  std::shuffle(slots.begin(), slots.end(), rng);
  PagedSeqInput in;
  in.context_slots.assign(slots.begin(), slots.begin() + context);
  in.write_slots.assign(slots.begin() + context, slots.end());
  for (int64_t i = 0; i < chunk; ++i) {
    in.tokens.push_back(static_cast<int32_t>((i * 31 + 7) % fused.config().vocab_size));
    in.positions.push_back(context + i);
  }
  TimeFusedVsReference(state, {in}, *kv, chunk);
}
BENCHMARK(BM_PrefillFusedVsReference)
    ->ArgNames({"chunk", "context"})
    ->Args({512, 0})
    ->Args({256, 512})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

// Wall-clock seconds (the thread benchmark: CPU time would add the threads' time up).
double WallSeconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// CPU threads (SetCpuThreads: torch's pool, the fused step's CpuPool and OpenBLAS's pool): the
// fused step (range(0) sequences of range(1) context tokens each with one new token, or with
// range(1) = 0 one prefill of 512 tokens) on range(2) threads, 0 = every CPU this process may use.
// Wall time, so it needs an otherwise idle machine. The thread count is set once per benchmark,
// not per iteration: torch's set_num_threads rebuilds its thread pools (whose new threads spin).
void BM_DecodeThreads(benchmark::State& state) {
  const int64_t batch = state.range(0), context = state.range(1);
  if (!VtTiny().ok()) return state.SkipWithError(VtTiny().status().ToString().c_str());
  const LlamaModel& model = *VtTiny();
  std::vector<PagedSeqInput> inputs;
  int64_t slots = batch * (context + 1), tokens = batch;
  if (context > 0) {
    inputs = DecodeInputs(batch, context, model.config().vocab_size, true, 7);
  } else {
    tokens = slots = 512;
    inputs.push_back(PrefillInput(tokens, model.config().vocab_size));
  }
  std::optional<KvTensors> kv = FilledKv(model, slots, state);
  if (!kv) return;
  const int before = torch::get_num_threads();
  StatusOr<int> threads = SetCpuThreads(static_cast<int>(state.range(2)));
  if (!threads.ok()) return state.SkipWithError(threads.status().ToString().c_str());
  for (auto _ : state) {
    const double begin = WallSeconds();
    auto out = model.ForwardPaged(inputs, *kv);
    benchmark::DoNotOptimize(out);
    if (!out.ok()) return state.SkipWithError(out.status().ToString().c_str());
    state.SetIterationTime(WallSeconds() - begin);
  }
  (void)SetCpuThreads(before);
  state.counters["threads"] = *threads;
  state.counters["tok_s"] = benchmark::Counter(static_cast<double>(tokens),
                                               benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_DecodeThreads)
    ->ArgNames({"batch", "context", "threads"})
    ->ArgsProduct({{1, 8, 32}, {512, 2048}, {1, 0}})
    ->Args({1, 0, 1})
    ->Args({1, 0, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

// One of llama.cpp's benchmark shapes on `model`: native mode, contiguous slots, no signals, on
// every CPU (SetCpuThreads(0)), wall time, one whole pass per iteration; tok_s counts new tokens.
//   batch = 0: a prefill of `context` tokens from an empty cache;
//   batch > 0: `batch` sequences whose KV already holds `context` tokens each (noise), then
//              `steps` decode steps, the context growing to context + steps - 1.
void TimeLlamaCppShape(benchmark::State& state, const LlamaModel& model, int64_t batch,
                       int64_t context, int64_t steps) {
  const int64_t vocab = model.config().vocab_size;
  const int64_t seqs = std::max<int64_t>(batch, 1), per_seq = context + (batch > 0 ? steps : 0);
  std::optional<KvTensors> kv = FilledKv(model, seqs * per_seq, state);
  if (!kv) return;
  std::vector<std::vector<PagedSeqInput>> passes;
  if (batch == 0) {
    passes.push_back({PrefillInput(context, vocab, /*want_signals=*/false)});
  } else {
    for (int64_t t = 0; t < steps; ++t) {
      std::vector<PagedSeqInput> step(static_cast<size_t>(batch));
      for (int64_t s = 0; s < batch; ++s) {
        PagedSeqInput& in = step[s];
        const int64_t ctx = context + t;
        in.context_slots.resize(static_cast<size_t>(ctx));
        std::iota(in.context_slots.begin(), in.context_slots.end(), s * per_seq);
        in.write_slots = {s * per_seq + ctx};
        in.tokens = {static_cast<int32_t>((s * 7919 + t * 31 + 1) % vocab)};
        in.positions = {ctx};
        in.want_signals = false;
      }
      passes.push_back(std::move(step));
    }
  }
  const int before = torch::get_num_threads();
  StatusOr<int> threads = SetCpuThreads(0);
  if (!threads.ok()) return state.SkipWithError(threads.status().ToString().c_str());
  for (auto _ : state) {
    const double begin = WallSeconds();
    for (const std::vector<PagedSeqInput>& step : passes) {
      auto out = model.ForwardPaged(step, *kv);
      benchmark::DoNotOptimize(out);
      if (!out.ok()) return state.SkipWithError(out.status().ToString().c_str());
    }
    state.SetIterationTime(WallSeconds() - begin);
  }
  (void)SetCpuThreads(before);
  state.counters["threads"] = *threads;
  state.counters["tok_s"] =
      benchmark::Counter(static_cast<double>(batch == 0 ? context : batch * steps),
                         benchmark::Counter::kIsIterationInvariantRate);
}

// The shapes llama.cpp's own benchmarks time on vt-tiny, for the side-by-side comparison in
// docs/PERFORMANCE.md (TimeLlamaCppShape):
//   prompt = 0:  a 512-token prefill from an empty cache (llama-bench pp512);
//   prompt = -1: 128 decode steps of one sequence from an empty cache (llama-bench tg128);
//   prompt > 0:  `batch` sequences whose KV already holds `prompt` tokens each, then 128 decode
//                steps (llama-batched-bench TG).
void BM_LlamaCppShapes(benchmark::State& state) {
  const int64_t batch = state.range(0), prompt = state.range(1);
  if (!VtTiny().ok()) return state.SkipWithError(VtTiny().status().ToString().c_str());
  TimeLlamaCppShape(state, *VtTiny(), prompt == 0 ? 0 : batch,
                    prompt == 0 ? 512 : std::max<int64_t>(prompt, 0),
                    /*steps=*/128);
}
BENCHMARK(BM_LlamaCppShapes)
    ->ArgNames({"batch", "prompt"})
    ->Args({1, 0})
    ->Args({1, -1})
    ->Args({1, 512})
    ->Args({8, 512})
    ->Args({32, 512})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

// SmolLM2-135M-Instruct: the real model when scripts/fetch-model.sh fetched it (its Q4_1 GGUF,
// dequantized to fp32 on load), or synthetic weights of its shape when the file is not there
// (labelled so in the `smollm2_weights` context line): 30 layers, hidden 576, 9 query and 3 KV
// heads of 64, FFN 1536, vocabulary 49,152, tied embeddings. With `stored` the real model with
// weights_as_stored (its Q4_1 blocks read by the decode kernels), or an error when the file is
// not there (synthetic weights have no stored form); stored = 2 also multiplies them by 8-bit
// activations (LlamaOptions::q8_activations); stored = 3 keeps the linear weights in bf16
// (LlamaOptions::bf16_weights, real or synthetic); with `kv16` its KV store in fp16
// (LlamaOptions::kv_dtype). One model per combination, loaded on first use.
const StatusOr<LlamaModel>& SmolLm2(int64_t stored, bool kv16) {
  static std::map<std::pair<int64_t, bool>, StatusOr<LlamaModel>> models;
  auto it = models.find({stored, kv16});
  if (it != models.end()) return it->second;
  auto load = [&]() -> StatusOr<LlamaModel> {
    LlamaOptions options{.weights_as_stored = stored == 1 || stored == 2,
                         .q8_activations = stored == 2,
                         .bf16_weights = stored == 3};
    if (kv16) options.kv_dtype = torch::kHalf;
    StatusOr<std::string> path = ResolveModelPath("smollm2-135m");
    if (path.ok()) return LlamaModel::FromGguf(*path, options);
    if (options.weights_as_stored) return path.status();
    ModelConfig c;
    c.vocab_size = 49152;
    c.hidden_size = 576;
    c.intermediate_size = 1536;
    c.num_hidden_layers = 30;
    c.num_attention_heads = 9;
    c.num_key_value_heads = 3;
    c.head_dim = 64;
    c.max_position_embeddings = 8192;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 100000.0;
    c.tie_word_embeddings = true;
    return LlamaModel::RandomInit(c, /*seed=*/1, options);
  };
  return models.emplace(std::pair{stored, kv16}, load()).first->second;
}

std::string SmolLm2Weights() {
  StatusOr<std::string> path = ResolveModelPath("smollm2-135m");
  return path.ok() ? "real: " + *path + " (Q4_1, dequantized to fp32)"
                   : "synthetic (random weights of SmolLM2-135M's shape)";
}

// llama.cpp's benchmark shapes on SmolLM2 (docs/PERFORMANCE.md; TimeLlamaCppShape):
//   batch = 0: a prefill of `context` tokens from an empty cache (llama-bench -p 512 / 2048);
//   batch > 0: `batch` sequences whose KV already holds `context` tokens (noise), then 16 decode
//              steps (llama-batched-bench's TG at that prompt length, -ntg 16).
// stored = 1: the real model with weights as stored (LlamaOptions::weights_as_stored), against
// llama.cpp on the same Q4_1 file; stored = 2: and the activations quantized to 8 bits as
// llama.cpp does (LlamaOptions::q8_activations), which prefill chunks use too (stored = 1
// prefills on the fp32 weights); stored = 3: the weights rounded to bf16 and multiplied by
// activations rounded to bf16 (LlamaOptions::bf16_weights), decode and prefill, against llama.cpp
// on a BF16 GGUF of the same rounded weights. kv16 = 1: the KV store in fp16 (llama.cpp's
// default cache type, which its side of the comparison uses throughout), else fp32.
void BM_SmolLm2Shapes(benchmark::State& state) {
  const StatusOr<LlamaModel>& loaded = SmolLm2(state.range(2), state.range(3) != 0);
  if (!loaded.ok()) return state.SkipWithError(loaded.status().ToString().c_str());
  TimeLlamaCppShape(state, *loaded, state.range(0), state.range(1), /*steps=*/16);
}
BENCHMARK(BM_SmolLm2Shapes)
    ->ArgNames({"batch", "context", "stored", "kv16"})
    ->ArgsProduct({{0, 1, 8, 32}, {512, 2048}, {0}, {0, 1}})
    ->ArgsProduct({{1, 8}, {512}, {1, 2}, {0, 1}})
    ->ArgsProduct({{0}, {512}, {1, 2}, {0}})
    ->ArgsProduct({{0, 1, 8, 32}, {512, 2048}, {3}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

// The price of a token signal (lib/core/token_signal.h): KvTensors::TokenSignals over `tokens`
// new tokens' slots (scattered) in an fp32 CPU store of SmolLM2-135M's KV shape (30 layers x 3 KV
// heads x 64; random values, token granularity), with range(1) registered signals (value_norm,
// then value_l1_norm). That is what a policy reading them adds to a step: tokens = the step's new
// tokens (1 per sequence in decode, the prompt in a prefill). With relative = 1 the signal is the
// relative key_anchor_cosine (keydiff's) over `tokens` slots: what an eviction step costs a
// policy reading it, tokens = the sequence's live tokens (its budget plus one in decode); with
// relative = 2 it is expected_attention (expected_attention's), with the query statistics of
// 2048 random queries of SmolLM2's 9 query heads; with relative = 3 window_attention, over the
// last 32 of those queries.
void BM_TokenSignals(benchmark::State& state) {
  const int64_t tokens = state.range(0), signals = state.range(1);
  const int64_t relative = state.range(2);
  constexpr int64_t kSlots = 4096;
  StatusOr<KvTensors> kv =
      KvTensors::Create({.num_layers = 30, .num_slots = kSlots, .num_kv_heads = 3, .head_dim = 64});
  if (!kv.ok()) return state.SkipWithError(kv.status().ToString().c_str());
  torch::manual_seed(1);
  for (size_t i = 0; i < kv->k_tensors().size(); ++i) {
    kv->k_tensors()[i].normal_();
    kv->v_tensors()[i].normal_();
  }
  std::vector<const TokenSignalInfo*> fns;
  for (const char* name : {"value_norm", "value_l1_norm"}) {
    if (static_cast<int64_t>(fns.size()) < signals) fns.push_back(*FindTokenSignal(name));
  }
  if (relative != 0) {
    fns = {*FindTokenSignal(relative == 1   ? "key_anchor_cosine"
                            : relative == 2 ? "expected_attention"
                                            : "window_attention")};
  }
  std::vector<SlotIndex> slots(static_cast<size_t>(tokens));
  std::vector<int64_t> positions(static_cast<size_t>(tokens));
  std::mt19937_64 rng(7);
  for (SlotIndex& s : slots) s = static_cast<SlotIndex>(rng() % kSlots);
  std::iota(positions.begin(), positions.end(), int64_t{0});
  std::vector<float> inv_freq(32);
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    inv_freq[i] = static_cast<float>(std::pow(100000.0, -static_cast<double>(i) / 32));
  }
  QueryMomentsTable table(30, 9, 3, 64, inv_freq);
  const torch::Tensor queries = torch::randn({2048, 9, 64});
  std::vector<int64_t> query_positions(2048);
  std::iota(query_positions.begin(), query_positions.end(), int64_t{0});
  for (int64_t l = 0; relative >= 2 && l < 30; ++l) {
    table.Add(l, queries.data_ptr<float>(), 2048, query_positions.data());
  }
  table.Advance(2048);
  const KvTensors::MomentsOf moments = [&](int64_t layer, int64_t kv_head) {
    return table.Of(layer, kv_head);
  };
  const TokenSignalScope scope{.positions = positions};
  std::vector<float> out;
  for (auto _ : state) {
    out.clear();
    const Status st = kv->TokenSignals(slots, fns, scope, moments, out);
    if (!st.ok()) return state.SkipWithError(st.ToString().c_str());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(tokens), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_TokenSignals)
    ->ArgNames({"tokens", "signals", "relative"})
    ->ArgsProduct({{1, 32, 2048}, {1, 2}, {0}})
    ->ArgsProduct({{128, 512, 2048}, {1}, {1, 2, 3}})
    ->Unit(benchmark::kMicrosecond);

// The price of scoring per layer: layer_union's Score over `tokens` live tokens whose signal view
// has `columns` columns (SmolLM2 at token granularity: 30 for NAME@layer, 90 for NAME@head;
// random values). What it adds to an eviction step beside the signal's own computation.
void BM_LayerUnionScore(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0)), columns = static_cast<size_t>(state.range(1));
  StatusOr<std::unique_ptr<Policy>> policy = CreatePolicy("layer_union", {});
  if (!policy.ok()) return state.SkipWithError(policy.status().ToString().c_str());
  std::mt19937_64 rng(11);
  std::vector<float> values(n * columns);
  for (float& v : values) v = static_cast<float>(rng() % 100000) / 100000.0f;
  std::vector<TokenView> tokens(n);
  for (size_t i = 0; i < n; ++i) {
    tokens[i].position = static_cast<TokenId>(i);
    tokens[i].token_signals = std::span<const float>(values).subspan(i * columns, columns);
  }
  const std::vector<int32_t> offsets = {0, static_cast<int32_t>(columns)};
  std::vector<float> scores(n);
  PolicyRng prng(1);
  PolicyContext ctx{.step = 1, .budget = 1, .rng = prng, .token_signal_offsets = offsets};
  for (auto _ : state) {
    (*policy)->Score(tokens, ctx, scores);
    benchmark::DoNotOptimize(scores.data());
  }
}
BENCHMARK(BM_LayerUnionScore)
    ->ArgNames({"tokens", "columns"})
    ->ArgsProduct({{512, 2048}, {30, 90}})
    ->Unit(benchmark::kMicrosecond);

// What keeping query statistics adds to a forward step of one sequence (a policy reading
// expected_attention): QueryMomentsTable::Add of `rows` new tokens' queries for each of
// SmolLM2-135M's 30 layers (9 query heads of 64; random queries), then Advance: rows = 1 is a
// decode step, 512 and 2048 a prefill chunk.
void BM_QueryMoments(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const torch::Tensor queries = torch::randn({rows, 9, 64});
  QueryMomentsTable table(30, 9, 3, 64, std::vector<float>(32, 1.0f));
  std::vector<int64_t> positions(static_cast<size_t>(rows));
  int64_t next = 4;  // Past the sinks, every row counts.
  for (auto _ : state) {
    std::iota(positions.begin(), positions.end(), next);
    for (int64_t l = 0; l < 30; ++l)
      table.Add(l, queries.data_ptr<float>(), rows, positions.data());
    next += rows;
    table.Advance(next);
  }
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(rows), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_QueryMoments)
    ->ArgName("rows")
    ->Arg(1)
    ->Arg(512)
    ->Arg(2048)
    ->Unit(benchmark::kMicrosecond);

// One layer's attention for one decode query of vt-tiny (3 query heads sharing 1 KV head of 64
// channels), as ForwardPaged computes it per sequence: gather K/V rows, scores, softmax, values.
torch::Tensor Attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  // q [KVH, G, hd]; k, v [S, KVH, hd]
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto scores = torch::bmm(q, k.permute({1, 2, 0})) * scale;  // [KVH, G, S]
  auto probs = torch::softmax(scores, -1, torch::kFloat32);
  return torch::bmm(probs, v.permute({1, 0, 2}));  // [KVH, G, hd]
}

// Attention alone over range(0) cached tokens, per iteration all three of: (a) index_select of
// scattered slots, (b) index_select of slots 0..n-1, (c) a narrow() view of slots 0..n-1 with no
// gather at all, which is what attention over a dense cache costs. Each side attends 16 times per
// iteration (16 sequences of one layer). The reported time is (a); counters give all three and
// the ratios to (c).
void BM_AttentionGather(benchmark::State& state) {
  const int64_t context = state.range(0);
  constexpr int kRepeats = 16;
  if (!VtTiny().ok()) return state.SkipWithError(VtTiny().status().ToString().c_str());
  const ModelConfig& c = VtTiny()->config();
  const int64_t kvh = c.num_key_value_heads, hd = c.head_dim;
  const int64_t num_slots = 4 * context;  // Scattered slots come from a pool larger than n.
  torch::NoGradGuard no_grad;
  auto k = torch::randn({num_slots, kvh, hd});
  auto v = torch::randn({num_slots, kvh, hd});
  auto q = torch::randn({kvh, c.num_attention_heads / kvh, hd});
  std::vector<int64_t> perm(static_cast<size_t>(num_slots));
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(3);
  std::shuffle(perm.begin(), perm.end(), rng);
  perm.resize(static_cast<size_t>(context));
  const auto scattered = torch::tensor(perm, torch::kInt64);
  const auto contiguous = torch::arange(context, torch::kInt64);
  auto run = [&](int variant) {
    const double begin = CpuSeconds();
    for (int r = 0; r < kRepeats; ++r) {
      torch::Tensor out;
      if (variant == 2) {
        out = Attend(q, k.narrow(0, 0, context), v.narrow(0, 0, context));
      } else {
        const auto& index = variant == 0 ? scattered : contiguous;
        out = Attend(q, k.index_select(0, index), v.index_select(0, index));
      }
      benchmark::DoNotOptimize(out.data_ptr());
    }
    return CpuSeconds() - begin;
  };
  double seconds[3] = {0, 0, 0};
  int rotation = 0;
  for (auto _ : state) {
    double t[3];
    for (int i = 0; i < 3; ++i) {
      const int variant = (rotation + i) % 3;
      t[variant] = run(variant);
    }
    rotation = (rotation + 1) % 3;
    for (int i = 0; i < 3; ++i) seconds[i] += t[i];
    state.SetIterationTime(t[0]);
  }
  const double per_call = 1e6 / (static_cast<double>(state.iterations()) * kRepeats);
  state.counters["scattered_us"] = seconds[0] * per_call;
  state.counters["contiguous_us"] = seconds[1] * per_call;
  state.counters["view_us"] = seconds[2] * per_call;
  state.counters["scattered/view"] = seconds[0] / seconds[2];
  state.counters["contiguous/view"] = seconds[1] / seconds[2];
}
BENCHMARK(BM_AttentionGather)
    ->ArgName("context")
    ->Arg(512)
    ->Arg(2048)
    ->Arg(8192)
    ->Unit(benchmark::kMicrosecond)
    ->UseManualTime();

// Relocation bandwidth of a synchronous TorchCopyEngine on a KvTensors store of vt-tiny's shape
// (6 layers x K,V x 1 head x 64 fp32 = 3 KiB per token). range(0) moves compact 16-token blocks:
// the first half of each of range(0)/8 source blocks moves into dense blocks after them. The
// reference is one copy_ between two flat tensors of the same number of bytes. The reported time
// is the engine's; counters give both bandwidths and ratio = engine / copy_ bandwidth.
void BM_TorchRelocate(benchmark::State& state) {
  const int64_t moves = state.range(0);
  constexpr int64_t kBlockSize = 16;
  if (!VtTiny().ok()) return state.SkipWithError(VtTiny().status().ToString().c_str());
  const LlamaModel& model = *VtTiny();
  const int64_t src_blocks = moves / (kBlockSize / 2);
  std::optional<KvTensors> kv = FilledKv(model, src_blocks * kBlockSize + moves, state);
  if (!kv) return;
  std::vector<SlotCopy> copies;
  SlotIndex dst = src_blocks * kBlockSize;
  for (int64_t b = 0; b < src_blocks; ++b) {
    for (int64_t o = 0; o < kBlockSize / 2; ++o) copies.push_back({b * kBlockSize + o, dst++});
  }
  TorchCopyEngine engine(*kv, /*async=*/false);
  const int64_t bytes_per_token = 2 * kv->options().num_layers * kv->options().num_kv_heads *
                                  kv->options().head_dim *
                                  static_cast<int64_t>(c10::elementSize(kv->options().dtype));
  const int64_t bytes = moves * bytes_per_token;
  auto flat_src = torch::ones({bytes}, torch::kUInt8);
  auto flat_dst = torch::empty({bytes}, torch::kUInt8);
  double engine_s = 0, copy_s = 0;
  bool engine_first = true;
  for (auto _ : state) {
    auto run_engine = [&] {
      const double begin = CpuSeconds();
      engine.Wait(engine.Submit(copies));
      return CpuSeconds() - begin;
    };
    auto run_copy = [&] {
      const double begin = CpuSeconds();
      flat_dst.copy_(flat_src);
      return CpuSeconds() - begin;
    };
    double e, c;
    if (engine_first) {
      e = run_engine();
      c = run_copy();
    } else {
      c = run_copy();
      e = run_engine();
    }
    engine_first = !engine_first;
    engine_s += e;
    copy_s += c;
    state.SetIterationTime(e);
  }
  if (!engine.status().ok()) return state.SkipWithError(engine.status().ToString().c_str());
  const double total = static_cast<double>(state.iterations() * bytes);
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["engine_GBps"] = total / engine_s / 1e9;
  state.counters["copy_GBps"] = total / copy_s / 1e9;
  state.counters["ratio"] = copy_s / engine_s;
}
BENCHMARK(BM_TorchRelocate)
    ->ArgName("moves")
    ->Arg(256)
    ->Arg(4096)
    ->Arg(32768)
    ->Unit(benchmark::kMicrosecond)
    ->UseManualTime();

// Greedy sampling of one token from fp32 host logits of range(0) entries (vt-tiny's 2,048;
// Llama 3's 128,256): the Sampler, which reads the floats in place, against what it did before
// (a double copy of the vocabulary, then its argmax), both in every iteration. Wall time per
// token; the counters give both and the ratio.
void BM_SampleGreedy(benchmark::State& state) {
  const int64_t vocab = state.range(0);
  torch::manual_seed(1);
  const torch::Tensor logits = torch::randn({vocab});
  Sampler greedy;
  double sampler_s = 0, copy_s = 0;
  for (auto _ : state) {
    double begin = WallSeconds();
    const int32_t a = greedy.Sample(logits);
    const double took = WallSeconds() - begin;
    begin = WallSeconds();
    const torch::Tensor values = logits.to(torch::kCPU, torch::kDouble).contiguous();
    const double* v = values.data_ptr<double>();
    const int32_t b = static_cast<int32_t>(std::max_element(v, v + vocab) - v);
    copy_s += WallSeconds() - begin;
    sampler_s += took;
    if (a != b) return state.SkipWithError("the two argmaxes differ");
    state.SetIterationTime(took);
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["sampler_us"] = 1e6 * sampler_s / n;
  state.counters["double_copy_us"] = 1e6 * copy_s / n;
  state.counters["speedup"] = copy_s / sampler_s;
}
BENCHMARK(BM_SampleGreedy)
    ->ArgName("vocab")
    ->Arg(2048)
    ->Arg(128256)
    ->Unit(benchmark::kMicrosecond)
    ->UseManualTime();

// Temperature 0.8 + nucleus sampling of one token (top_p = range(1) / 100) from fp32 host logits
// of range(0) entries, N(0, 3^2): per token, wall time, the Sampler as the engine calls it.
void BM_SampleNucleus(benchmark::State& state) {
  const int64_t vocab = state.range(0);
  torch::manual_seed(1);
  const torch::Tensor logits = 3 * torch::randn({vocab});
  Sampler sampler(
      {.temperature = 0.8, .top_p = static_cast<double>(state.range(1)) / 100, .seed = 1});
  for (auto _ : state) benchmark::DoNotOptimize(sampler.Sample(logits));
}
BENCHMARK(BM_SampleNucleus)
    ->ArgNames({"vocab", "top_p_pct"})
    ->Args({2048, 90})
    ->Args({128256, 90})
    ->Args({128256, 100})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace vtoken::model

int main(int argc, char** argv) {
  // As in apps/vtoken-cli/main.cc: glibc returning large buffers to the OS after every torch op
  // causes page-fault storms; keep freed memory in the process instead.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // torch's OpenMP pool and OpenBLAS's pool spin against each other on small machines. The OpenMP
  // runtime reads its environment when it is loaded, before main(), so re-exec once.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    setenv("OMP_WAIT_POLICY", "PASSIVE", /*overwrite=*/1);
    execv("/proc/self/exe", argv);  // Only returns on failure; then run with the default policy.
  }
  // VTOKEN_CPU_ISA (baseline, avx2, avx512) runs the CPU kernels on a lower level than the CPU's
  // best (lib/model/cpu_isa.h); the context line names the one in use.
  if (vtoken::Status isa = vtoken::model::ApplyCpuIsaEnvironment(); !isa.ok()) {
    std::fprintf(stderr, "torch_model_bench: error: %s\n", isa.message().c_str());
    return 2;
  }
  benchmark::AddCustomContext(
      "cpu_isa",
      std::string(vtoken::model::CpuIsaName(vtoken::model::ActiveCpuIsa())) +
          " (host: " + std::string(vtoken::model::CpuIsaName(vtoken::model::HostCpuIsa())) + ")");
  benchmark::AddCustomContext(
      "cpu_q8_kernel",
      std::string(vtoken::model::CpuQ8KernelName(vtoken::model::ActiveCpuQ8Kernel())));
  benchmark::AddCustomContext(
      "cpu_bf16_kernel",
      std::string(vtoken::model::CpuBf16KernelName(vtoken::model::ActiveCpuBf16Kernel())));
  benchmark::AddCustomContext("cpu_model", vtoken::model::CpuModelName());
  benchmark::AddCustomContext("smollm2_weights", vtoken::model::SmolLm2Weights());
  benchmark::AddCustomContext("torch_threads", std::to_string(torch::get_num_threads()));
  benchmark::AddCustomContext("blas", vtoken::model::BlasDescription());
  const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
  benchmark::AddCustomContext("OMP_WAIT_POLICY", wait_policy != nullptr ? wait_policy : "unset");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
