// The model decode step on a GPU (or any device): Google Benchmark cells of batch x context for a
// model of any size, by default synthetic:llama-3.1-8b in bf16 on CUDA (synthetic weights: seeded
// random, not a trained model; the step's cost does not depend on the weights' values). Run by
// scripts/device-check.sh; on this CPU-only machine a test runs it on vt-tiny (tests/CMakeLists).
//
// Each cell times one ForwardPaged decode step (one new token for each of `batch` sequences of
// `context` earlier tokens; greedy sampling's outputs, the argmax of each row, as the engine asks
// for them) twice per iteration, in alternating order: with every context's slots
// scattered over the store by one random permutation (what evictions and relocations leave), and
// with contiguous slots (what a dense cache reads). ratio = scattered / contiguous is the
// indirection overhead: `ratio` is the ratio of the summed times, `ratio_median` / `ratio_min` /
// `ratio_max` those of the per-iteration ratios (each pair measured side by side). A third step
// per iteration runs the scattered inputs through the static decode step
// (lib/model/static_decode.h) as LlamaRunner's engine.cuda_graphs runs it: replaying a CUDA graph
// when libtorch has CUDA and the device is CUDA, else the same body eagerly; static_speedup =
// ForwardPaged's scattered time / static time. Where graphs are captured, a fourth step runs the
// same static body with capture off: graph_speedup = that eager static time / replay time (> 1:
// the graph is faster), reported only when graphs were really replayed (counter graphs = 1,
// `replays` the replay count; 0 when the capture failed or the device has none). At batch 32 a
// fifth step runs the static step (replayed where graphs are) with every sequence sampling at
// temperature 0.8 and top_p 0.9 where the logits are (LogitsOut::kSample, SampleRows after the
// body): sampled_ms, and sample_cost = its time / the greedy static step's. `warmup`
// untimed steps of each come first (the first static one also captures), then `iterations` timed
// ones (defaults 3 and 10). Times are wall time: every path returns host outputs, so each step
// ends with the device idle. A failing static step leaves the eager figures and says so in the
// cell's label; a cell that throws reports the exception as its error.
//
// BM_DecodeGroups (one cell: batch 8 x context 4096, 1024 with --quick) is the price of per-head
// KV groups: GroupsCell below.
//
// BM_Attention cells time one layer's decode attention alone in the model's shape (heads, KV
// heads, head_dim, dtype), batch x context keys per sequence on contiguous slots: the batched
// paged kernel (lib/cuda's PagedBatchAttention on CUDA, CpuPagedAttention on the CPU in fp32)
// against torch's scaled_dot_product_attention on dense [batch, kv_heads, context, head_dim] K/V
// (GQA through enable_gqa, torch >= 2.5; an older libtorch, such as Debian's 1.13, has no public
// SDPA: matmul / softmax / matmul over K/V expanded to every query head, context reference =
// "math"). ratio = paged / reference time; kv_gb_per_s = the K/V bytes the paged kernel reads
// per second, kv_mib those bytes (a store under about twice the GPU's L2 stays in cache across
// calls: such cells do not measure HBM). Each timed sample is 10 back-to-back calls between
// device synchronisations.
//
// Flags (before Google Benchmark's own):
//   --model=SPEC     a model directory or synthetic:NAME (default synthetic:llama-3.1-8b)
//   --device=NAME    cpu, cuda or cuda:N (default cuda)
//   --dtype=NAME     float32, bfloat16 or float16 (default bfloat16)
//   --kv-gib=X       skip cells whose KV store would exceed X GiB (default 72: with the 8B
//                    model's 16 GB of weights, 32 x 16K fits an H200; the skipped cells are listed
//                    in the context, skipped_cells)
//   --quick          batch {1, 32} x context {1024, 4096} instead of {1, 8, 32, 64} x {1K, 4K, 16K}
//   --warmup=N --iterations=N
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bench/decode_inputs.h"
#include "lib/model/blas_info.h"
#include "lib/model/cpu_paged_attention.h"
#include "lib/model/kv_tensors.h"
#include "lib/model/llama.h"
#include "lib/model/llama_runner.h"
#include "lib/model/static_decode.h"

#ifdef VTOKEN_MODEL_CUDA_KERNELS
#include "lib/cuda/paged_batch_attention.h"
#include "lib/model/paged_cuda_attention.h"
#endif
#ifdef VTOKEN_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif
#include <torch/cuda.h>
#include <torch/version.h>

#include "lib/model/torch_device.h"

namespace vtoken::model {
namespace {

constexpr int64_t kSampledBatch = 32;  // The cells that also time the sampled static step.

struct Flags {
  std::string model = "synthetic:llama-3.1-8b";
  std::string device = "cuda";
  std::string dtype = "bfloat16";
  double kv_gib = 72;
  bool quick = false;
  int64_t warmup = 3;
  int64_t iterations = 10;
};

// Consumes this benchmark's flags from argv; exits with a one-line error on a malformed one.
Flags ParseFlags(int& argc, char** argv) {
  Flags f;
  int kept = 1;
  auto number = [](std::string_view flag, std::string_view text) {
    char* end = nullptr;
    const std::string s(text);
    const double value = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0' || value <= 0) {
      std::fprintf(stderr, "torch_gpu_bench: error: %.*s needs a positive number, got \"%s\"\n",
                   static_cast<int>(flag.size()), flag.data(), s.c_str());
      std::exit(2);
    }
    return value;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&](std::string_view name) -> std::optional<std::string_view> {
      if (arg.substr(0, name.size()) == name && arg.size() > name.size() &&
          arg[name.size()] == '=') {
        return arg.substr(name.size() + 1);
      }
      return std::nullopt;
    };
    if (auto v = value("--model")) {
      f.model = *v;
    } else if (auto v = value("--device")) {
      f.device = *v;
    } else if (auto v = value("--dtype")) {
      f.dtype = *v;
    } else if (auto v = value("--kv-gib")) {
      f.kv_gib = number("--kv-gib", *v);
    } else if (auto v = value("--warmup")) {
      f.warmup = static_cast<int64_t>(number("--warmup", *v));
    } else if (auto v = value("--iterations")) {
      f.iterations = static_cast<int64_t>(number("--iterations", *v));
    } else if (arg == "--quick") {
      f.quick = true;
    } else {
      argv[kept++] = argv[i];  // Google Benchmark's, or an error it reports.
    }
  }
  argc = kept;
  return f;
}

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Whether the static decode step captures CUDA graphs for `model` (libtorch with CUDA, a CUDA
// device).
bool CapturesGraphs(const LlamaModel& model) {
#ifdef VTOKEN_TORCH_CUDA
  return model.options().device.is_cuda();
#else
  (void)model;
  return false;
#endif
}

// Wall seconds of run() (a step returning StatusOr<outputs>); its first error goes to `failure`.
template <class Run>
double TimedStep(std::string& failure, Run&& run) {
  const double begin = Seconds();
  StatusOr<std::vector<PagedSeqOutput>> out = run();
  const double took = Seconds() - begin;
  if (!out.ok() && failure.empty()) failure = out.status().ToString();
  benchmark::DoNotOptimize(out);
  return took;
}

void DecodeCell(benchmark::State& state, const LlamaModel& model, int64_t batch, int64_t context,
                int64_t warmup) {
  const int64_t slots = batch * (context + 1);
  std::optional<KvTensors> kv =
      FilledKv(model, slots, state, Granularity::kToken, /*scratch_slots=*/1);  // Static step's.
  if (!kv) return;
  const bool capture = CapturesGraphs(model);
  StatusOr<std::unique_ptr<internal::StaticDecode>> graphs =
      internal::StaticDecode::Create(model, *kv, {.capture = capture});
  if (!graphs.ok()) return state.SkipWithError(graphs.status().ToString().c_str());
  // Where graphs are captured, the same static body run eagerly isolates what the graph saves.
  std::unique_ptr<internal::StaticDecode> static_eager;
  if (capture) {
    StatusOr<std::unique_ptr<internal::StaticDecode>> e =
        internal::StaticDecode::Create(model, *kv, {.capture = false});
    if (!e.ok()) return state.SkipWithError(e.status().ToString().c_str());
    static_eager = std::move(*e);
  }
  const int64_t vocab = model.config().vocab_size;
  auto scattered = DecodeInputs(batch, context, vocab, /*scattered=*/true, 3);
  auto contiguous = DecodeInputs(batch, context, vocab, /*scattered=*/false, 0);
  for (auto* inputs : {&scattered, &contiguous}) {
    for (PagedSeqInput& in : *inputs) in.logits = LogitsOut::kArgMax;  // Greedy, as the engine.
  }
  std::string error, static_error;  // The static steps' failures keep the eager figures.
  const std::vector<PagedSeqView> scattered_views = ViewsOf(scattered);
  const bool fits = (*graphs)->Eligible(scattered_views);
  // At batch 32 also the static step with every sequence sampling (temperature 0.8, top_p 0.9)
  // where the logits are: its cost over the greedy step. Fixed uniforms: the work is the same.
  std::vector<PagedSeqView> sampled_views;
  if (batch == kSampledBatch) {
    sampled_views = scattered_views;
    for (size_t i = 0; i < sampled_views.size(); ++i) {
      sampled_views[i].logits = LogitsOut::kSample;
      sampled_views[i].draw = {.temperature = 0.8,
                               .top_p = 0.9,
                               .uniform = static_cast<double>(i) / sampled_views.size()};
    }
  }
  auto step = [&](const std::vector<PagedSeqInput>& inputs) {
    return TimedStep(error, [&] { return model.ForwardPaged(inputs, *kv); });
  };
  auto static_step = [&](internal::StaticDecode* decode, const std::vector<PagedSeqView>& views) {
    return fits && decode != nullptr && static_error.empty() && !views.empty()
               ? TimedStep(static_error, [&] { return decode->Step(views); })
               : 0.0;
  };
  for (int64_t i = 0; i < warmup; ++i) {
    step(scattered);
    step(contiguous);
    static_step(graphs->get(), scattered_views);
    static_step(static_eager.get(), scattered_views);
    static_step(graphs->get(), sampled_views);
  }
  if (!error.empty()) return state.SkipWithError(error.c_str());
  double scattered_s = 0, contiguous_s = 0, static_s = 0, static_eager_s = 0, sampled_s = 0;
  std::vector<double> paired;  // Per iteration: scattered / contiguous, measured side by side.
  int64_t turn = 0;
  for (auto _ : state) {
    double s = 0, c = 0, g = 0, e = 0, d = 0;
    for (int64_t k = 0; k < 5; ++k) {  // The five steps in rotating order.
      switch ((turn + k) % 5) {
        case 0:
          s = step(scattered);
          break;
        case 1:
          c = step(contiguous);
          break;
        case 2:
          g = static_step(graphs->get(), scattered_views);
          break;
        case 3:
          e = static_step(static_eager.get(), scattered_views);
          break;
        default:
          d = static_step(graphs->get(), sampled_views);
          break;
      }
    }
    ++turn;
    scattered_s += s;
    contiguous_s += c;
    static_s += g;
    static_eager_s += e;
    sampled_s += d;
    paired.push_back(s / c);
    state.SetIterationTime(s);
  }
  if (!error.empty()) return state.SkipWithError(error.c_str());
  const double n = static_cast<double>(state.iterations());
  state.counters["scattered_ms"] = 1e3 * scattered_s / n;
  state.counters["contiguous_ms"] = 1e3 * contiguous_s / n;
  state.counters["ratio"] = scattered_s / contiguous_s;
  state.counters["ratio_median"] = Median(paired);
  state.counters["ratio_min"] = *std::min_element(paired.begin(), paired.end());
  state.counters["ratio_max"] = *std::max_element(paired.begin(), paired.end());
  state.counters["tok_per_s"] = static_cast<double>(batch) * n / scattered_s;
  if (!static_error.empty()) {
    state.SetLabel("static step failed: " + static_error);
    return;
  }
  if (fits) {  // Batches over StaticDecode::kMaxBatch have no static step.
    const DecodeStats& stats = (*graphs)->stats();
    const bool replayed = stats.replays > 0 && stats.capture_failures == 0;
    state.counters["graphs"] = replayed ? 1 : 0;
    state.counters["replays"] = static_cast<double>(stats.replays);
    state.counters["static_ms"] = 1e3 * static_s / n;
    state.counters["static_speedup"] = scattered_s / static_s;
    if (!sampled_views.empty()) {
      state.counters["sampled_ms"] = 1e3 * sampled_s / n;
      state.counters["sample_cost"] = sampled_s / static_s;
    }
    if (replayed && static_eager != nullptr) {
      state.counters["static_eager_ms"] = 1e3 * static_eager_s / n;
      state.counters["graph_speedup"] = static_eager_s / static_s;
    }
  }
}

// Per-head KV groups on the device: one decode step of `batch` sequences of `context` live tokens
// at token granularity and at head granularity (layers x KV heads groups, each holding the same
// live tokens: what a per-head policy at equal budget leaves, slots scattered), as eager
// ForwardPaged and as the static step (graph replays where graphs are captured), the four in
// rotating order, returning what greedy H2O needs (the argmax, the attention signal). The head
// step reads the same K/V bytes through groups times as many slot entries: head_ms / token_ms
// (ratio, static_ratio) is what per-head liveness costs a step; keys is the head step's key
// count and index_mib the slot list it uploads (8 bytes a key), signal_mib the attention signal
// it brings back (4 bytes a key).
void GroupsCell(benchmark::State& state, const LlamaModel& model, int64_t batch, int64_t context,
                int64_t warmup) {
  const ModelConfig& c = model.config();
  const int64_t groups =
      NumKvGroups(Granularity::kHead, c.num_hidden_layers, c.num_key_value_heads);
  std::optional<KvTensors> token_kv =
      FilledKv(model, batch * (context + 1), state, Granularity::kToken, /*scratch_slots=*/1);
  if (!token_kv) return;
  std::optional<KvTensors> head_kv = FilledKv(model, groups * batch * (context + 1), state,
                                              Granularity::kHead, /*scratch_slots=*/1);
  if (!head_kv) return;
  const bool capture = CapturesGraphs(model);
  StatusOr<std::unique_ptr<internal::StaticDecode>> token_static =
      internal::StaticDecode::Create(model, *token_kv, {.capture = capture});
  StatusOr<std::unique_ptr<internal::StaticDecode>> head_static =
      internal::StaticDecode::Create(model, *head_kv, {.capture = capture});
  if (!token_static.ok()) return state.SkipWithError(token_static.status().ToString().c_str());
  if (!head_static.ok()) return state.SkipWithError(head_static.status().ToString().c_str());
  const int64_t vocab = c.vocab_size;
  auto token_inputs = DecodeInputs(batch, context, vocab, /*scattered=*/true, 5);
  auto head_inputs = DecodeInputs(batch, context, vocab, /*scattered=*/true, 5, groups);
  for (auto* inputs : {&token_inputs, &head_inputs}) {
    for (PagedSeqInput& in : *inputs) {
      in.logits = LogitsOut::kArgMax;
      in.signals = kAttnSignal;
    }
  }
  const std::vector<PagedSeqView> token_views = ViewsOf(token_inputs);
  const std::vector<PagedSeqView> head_views = ViewsOf(head_inputs);
  std::string error;
  auto timed = [&](auto&& run) { return TimedStep(error, run); };
  const bool fits = (*token_static)->Eligible(token_views) && (*head_static)->Eligible(head_views);
  auto steps = [&](int64_t which) {
    switch (which) {
      case 0:
        return timed([&] { return model.ForwardPaged(token_inputs, *token_kv); });
      case 1:
        return timed([&] { return model.ForwardPaged(head_inputs, *head_kv); });
      case 2:
        return fits ? timed([&] { return (*token_static)->Step(token_views); }) : 0.0;
      default:
        return fits ? timed([&] { return (*head_static)->Step(head_views); }) : 0.0;
    }
  };
  for (int64_t i = 0; i < warmup; ++i) {
    for (int64_t k = 0; k < 4; ++k) steps(k);
  }
  if (!error.empty()) return state.SkipWithError(error.c_str());
  double sums[4] = {0, 0, 0, 0};
  int64_t turn = 0;
  for (auto _ : state) {
    double head = 0;
    for (int64_t k = 0; k < 4; ++k) {  // Rotating order.
      const int64_t which = (turn + k) % 4;
      const double took = steps(which);
      sums[which] += took;
      if (which == 1) head = took;
    }
    ++turn;
    state.SetIterationTime(head);
  }
  if (!error.empty()) return state.SkipWithError(error.c_str());
  const double n = static_cast<double>(state.iterations());
  const double keys = static_cast<double>(groups * batch * (context + 1));
  state.counters["groups"] = static_cast<double>(groups);
  state.counters["token_ms"] = 1e3 * sums[0] / n;
  state.counters["head_ms"] = 1e3 * sums[1] / n;
  state.counters["ratio"] = sums[1] / sums[0];
  if (fits) {
    state.counters["static_token_ms"] = 1e3 * sums[2] / n;
    state.counters["static_head_ms"] = 1e3 * sums[3] / n;
    state.counters["static_ratio"] = sums[3] / sums[2];
    state.counters["replays"] = static_cast<double>((*head_static)->stats().replays);
  }
  state.counters["keys"] = keys;
  state.counters["index_mib"] = 8 * keys / (1 << 20);
  state.counters["signal_mib"] = 4 * keys / (1 << 20);
}

// SDPA with GQA needs torch >= 2.5; older ones get the math reference.
#define VTOKEN_TORCH_HAS_GQA_SDPA \
  (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5))
constexpr bool kTorchHasGqaSdpa = VTOKEN_TORCH_HAS_GQA_SDPA;

void AttentionCell(benchmark::State& state, const LlamaModel& model, int64_t batch, int64_t context,
                   int64_t warmup) {
  const ModelConfig& c = model.config();
  const LlamaOptions& o = model.options();
  const int64_t heads = c.num_attention_heads, kv_heads = c.num_key_value_heads;
  const int64_t dim = c.head_dim, keys = batch * context;
  torch::NoGradGuard no_grad;
  const auto like = torch::TensorOptions().dtype(o.compute_dtype).device(o.device);
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(o.device);
  // Sequence s owns slots [s * context, (s + 1) * context): the dense layout, read by slot list.
  const torch::Tensor q = torch::randn({batch, heads, dim}, like);
  const torch::Tensor k_cache = torch::randn({keys, kv_heads, dim}, like);
  const torch::Tensor v_cache = torch::randn({keys, kv_heads, dim}, like);
  torch::Tensor out = torch::empty({batch, heads, dim}, like);
  const torch::Tensor q_offsets = torch::arange(batch + 1, i64);
  const torch::Tensor key_offsets = torch::arange(batch + 1, i64) * context;
  const torch::Tensor slots = torch::arange(keys, i64);
  const torch::Tensor positions = slots.remainder(context);
  const torch::Tensor num_signal = torch::ones({batch}, i64);
  const torch::Tensor k_dense =
      k_cache.view({batch, context, kv_heads, dim}).transpose(1, 2).contiguous();
  const torch::Tensor v_dense =
      v_cache.view({batch, context, kv_heads, dim}).transpose(1, 2).contiguous();
  const torch::Tensor q4 = q.view({batch, heads, 1, dim});
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  torch::Tensor k_wide, v_wide;  // The math reference's K/V, one copy per query head.
  if (!kTorchHasGqaSdpa) {
    k_wide = k_dense.repeat_interleave(heads / kv_heads, 1);
    v_wide = v_dense.repeat_interleave(heads / kv_heads, 1);
  }
  auto reference = [&] {
#if VTOKEN_TORCH_HAS_GQA_SDPA
    return at::scaled_dot_product_attention(q4, k_dense, v_dense, {}, 0.0, false, scale,
                                            /*enable_gqa=*/true);
#else
    return torch::matmul(torch::softmax(torch::matmul(q4, k_wide.transpose(2, 3)) * scale, -1),
                         v_wide);
#endif
  };
  std::function<void()> paged;
  std::string error;
  torch::Tensor workspace;
  if (o.device.is_cpu()) {
    if (o.compute_dtype != torch::kFloat32) {
      return state.SkipWithError("CpuPagedAttention runs fp32 only");
    }
    const CpuAttentionBatch a{.num_seqs = batch,
                              .num_heads = heads,
                              .num_kv_heads = kv_heads,
                              .head_dim = dim,
                              .scale = static_cast<float>(scale),
                              .q = q.data_ptr<float>(),
                              .k_cache = k_cache.data_ptr<float>(),
                              .v_cache = v_cache.data_ptr<float>(),
                              .slot_stride = kv_heads * dim,
                              .kv_head_stride = dim,
                              .out = out.data_ptr<float>(),
                              .q_offsets = q_offsets.data_ptr<int64_t>(),
                              .key_offsets = key_offsets.data_ptr<int64_t>(),
                              .slots = slots.data_ptr<int64_t>(),
                              .key_positions = positions.data_ptr<int64_t>(),
                              .num_signal = num_signal.data_ptr<int64_t>()};
    paged = [a, batch] {
      at::parallel_for(0, batch, 1, [&](int64_t b, int64_t e) { CpuPagedAttention(a, b, e); });
    };
  } else {
#ifdef VTOKEN_MODEL_CUDA_KERNELS
    // The model's own kernel arguments for a token-granularity store of `keys` slots.
    cuda::PagedBatchArgs a = internal::CudaPagedAttention::BaseArgs(
        model.KvOptions(keys), heads, /*groups_per_seq=*/1, /*sliding_window=*/0);
    a.q = q.data_ptr();
    a.k_cache = k_cache.data_ptr();
    a.v_cache = v_cache.data_ptr();
    a.out = out.data_ptr();
    a.q_offsets = q_offsets.data_ptr<int64_t>();
    a.key_offsets = key_offsets.data_ptr<int64_t>();
    a.slots = slots.data_ptr<int64_t>();
    a.key_positions = positions.data_ptr<int64_t>();
    a.num_seqs = static_cast<int32_t>(batch);
    a.num_rows = batch;
    a.num_keys = keys;
    a.max_query_rows = 1;
    a.max_keys = context;
    workspace =
        torch::empty({static_cast<int64_t>(std::max<size_t>(cuda::PagedBatchWorkspaceBytes(a), 1))},
                     torch::TensorOptions().dtype(torch::kUInt8).device(o.device));
#ifdef VTOKEN_TORCH_CUDA
    cuda::Stream stream = c10::cuda::getCurrentCUDAStream().stream();
#else
    cuda::Stream stream = nullptr;  // Torch's default stream.
#endif
    paged = [a, &workspace, &error, stream] {
      const Status status = cuda::PagedBatchAttention(
          a, workspace.data_ptr(), static_cast<size_t>(workspace.numel()), stream);
      if (!status.ok() && error.empty()) error = status.ToString();
    };
#else
    return state.SkipWithError("built without lib/cuda: no paged attention kernel on CUDA");
#endif
  }
  constexpr int kCalls = 10;
  auto sync = [&] {
    if (o.device.is_cuda()) torch::cuda::synchronize();
  };
  auto timed = [&](auto&& call) {
    sync();
    const double begin = Seconds();
    for (int i = 0; i < kCalls; ++i) call();
    sync();
    return (Seconds() - begin) / kCalls;
  };
  auto run_reference = [&] { benchmark::DoNotOptimize(reference()); };
  for (int64_t i = 0; i < warmup; ++i) {
    timed(paged);
    timed(run_reference);
  }
  if (!error.empty()) return state.SkipWithError(error.c_str());
  double paged_s = 0, reference_s = 0;
  bool paged_first = true;
  for (auto _ : state) {
    double p, r;
    if (paged_first) {
      p = timed(paged);
      r = timed(run_reference);
    } else {
      r = timed(run_reference);
      p = timed(paged);
    }
    paged_first = !paged_first;
    paged_s += p;
    reference_s += r;
    state.SetIterationTime(p);
  }
  if (!error.empty()) return state.SkipWithError(error.c_str());
  const double n = static_cast<double>(state.iterations());
  const double kv_bytes = 2.0 * static_cast<double>(keys * kv_heads * dim) *
                          static_cast<double>(c10::elementSize(o.compute_dtype));
  state.counters["paged_ms"] = 1e3 * paged_s / n;
  state.counters["reference_ms"] = 1e3 * reference_s / n;
  state.counters["ratio"] = paged_s / reference_s;
  state.counters["kv_gb_per_s"] = kv_bytes * n / paged_s / 1e9;
  state.counters["kv_mib"] = kv_bytes / (1 << 20);  // Under ~2x the GPU's L2: cache-resident.
}

}  // namespace
}  // namespace vtoken::model

int main(int argc, char** argv) {
  using namespace vtoken::model;
  const Flags flags = ParseFlags(argc, argv);
  vtoken::StatusOr<LlamaOptions> options = LlamaOptionsFor(flags.device, flags.dtype);
  if (!options.ok()) {
    std::fprintf(stderr, "torch_gpu_bench: error: %s\n", options.status().ToString().c_str());
    return 2;
  }
  vtoken::StatusOr<LlamaModel> model = LoadModel(flags.model, /*seed=*/1, *options);
  if (!model.ok()) {
    std::fprintf(stderr, "torch_gpu_bench: error: %s\n", model.status().ToString().c_str());
    return 1;
  }
  const double kv_bytes_per_token = static_cast<double>(KvBytesPerToken(model->KvOptions(1)));
  benchmark::AddCustomContext(
      "model",
      flags.model + (flags.model.rfind("synthetic:", 0) == 0 ? " (synthetic weights)" : ""));
  benchmark::AddCustomContext("device", flags.device);
  benchmark::AddCustomContext("dtype", flags.dtype);
  benchmark::AddCustomContext("blas", BlasDescription());
  benchmark::AddCustomContext("attention_reference", kTorchHasGqaSdpa ? "sdpa" : "math");
  const std::vector<int64_t> batches =
      flags.quick ? std::vector<int64_t>{1, 32} : std::vector<int64_t>{1, 8, 32, 64};
  const std::vector<int64_t> contexts =
      flags.quick ? std::vector<int64_t>{1024, 4096} : std::vector<int64_t>{1024, 4096, 16384};
  std::string skipped;
  for (int64_t context : contexts) {
    for (int64_t batch : batches) {
      const double gib =
          static_cast<double>(batch * (context + 1)) * kv_bytes_per_token / (1 << 30);
      if (gib > flags.kv_gib) {
        std::fprintf(stderr,
                     "torch_gpu_bench: skipping batch %lld x context %lld: %.1f GiB of KV"
                     " > --kv-gib=%g\n",
                     static_cast<long long>(batch), static_cast<long long>(context), gib,
                     flags.kv_gib);
        skipped += (skipped.empty() ? "" : ", ") + std::to_string(batch) + " x " +
                   std::to_string(context) + " (" + std::to_string(static_cast<int>(gib)) + " GiB)";
        continue;
      }
      using Cell = void (*)(benchmark::State&, const LlamaModel&, int64_t, int64_t, int64_t);
      for (const auto& [kind, cell] : {std::pair<const char*, Cell>{"DecodeStep", DecodeCell},
                                       std::pair<const char*, Cell>{"Attention", AttentionCell}}) {
        const std::string name = std::string("BM_") + kind + "/batch:" + std::to_string(batch) +
                                 "/context:" + std::to_string(context);
        benchmark::RegisterBenchmark(
            name.c_str(),
            [&model, cell, batch, context, warmup = flags.warmup](benchmark::State& state) {
              // A cell that throws (a torch error: out of memory, a
              // failed replay) reports it as its error instead of
              // ending the whole benchmark binary.
              try {
                cell(state, *model, batch, context, warmup);
              } catch (const std::exception& e) {
                const std::string what = e.what();
                state.SkipWithError(("exception: " + what.substr(0, what.find('\n'))).c_str());
              }
            })
            ->Iterations(flags.iterations)
            ->Unit(benchmark::kMillisecond)
            ->UseManualTime();
      }
    }
  }
  // Per-head groups at one shape (batch 8 x 4K; 8 x 1K with --quick): token and head KV stores.
  const int64_t groups_batch = 8, groups_context = flags.quick ? 1024 : 4096;
  const double groups_gib = 2.0 * static_cast<double>(groups_batch * (groups_context + 1)) *
                            kv_bytes_per_token / (1 << 30);
  if (groups_gib > flags.kv_gib) {
    skipped += std::string(skipped.empty() ? "" : ", ") + "groups " + std::to_string(groups_batch) +
               " x " + std::to_string(groups_context);
  } else {
    const std::string name = "BM_DecodeGroups/batch:" + std::to_string(groups_batch) +
                             "/context:" + std::to_string(groups_context);
    benchmark::RegisterBenchmark(
        name.c_str(),
        [&model, batch = groups_batch, context = groups_context,
         warmup = flags.warmup](benchmark::State& state) {
          try {
            GroupsCell(state, *model, batch, context, warmup);
          } catch (const std::exception& e) {
            const std::string what = e.what();
            state.SkipWithError(("exception: " + what.substr(0, what.find('\n'))).c_str());
          }
        })
        ->Iterations(flags.iterations)
        ->Unit(benchmark::kMillisecond)
        ->UseManualTime();
  }
  benchmark::AddCustomContext("skipped_cells", skipped.empty() ? "none" : skipped);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
