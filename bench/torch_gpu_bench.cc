// The model decode step on a GPU (or any device): Google Benchmark cells of batch x context for a
// model of any size, by default synthetic:llama-3.1-8b in bf16 on CUDA (synthetic weights: seeded
// random, not a trained model; the step's cost does not depend on the weights' values). Run by
// scripts/device-check.sh; on this CPU-only machine a test runs it on vt-tiny (tests/CMakeLists).
//
// Each cell times one ForwardPaged decode step (one new token for each of `batch` sequences of
// `context` earlier tokens) twice per iteration, in alternating order: with every context's slots
// scattered over the store by one random permutation (what evictions and relocations leave), and
// with contiguous slots (what a dense cache reads). ratio = scattered / contiguous is the
// indirection overhead. A third step per iteration runs the scattered inputs through the static
// decode step (lib/model/static_decode.h) as LlamaRunner's engine.cuda_graphs runs it: replaying
// a CUDA graph when libtorch has CUDA and the device is CUDA (counter graphs = 1), else the same
// body eagerly (graphs = 0: the padded static path, no capture). graph_speedup = scattered eager
// time / static time (> 1: the graph is faster). `warmup` untimed steps of each come first (the
// first static one also captures), then `iterations` timed ones (defaults 3 and 10). Times are
// wall time: both paths return host outputs, so each step ends with the device idle.
//
// Flags (before Google Benchmark's own):
//   --model=SPEC     a model directory or synthetic:NAME (default synthetic:llama-3.1-8b)
//   --device=NAME    cpu, cuda or cuda:N (default cuda)
//   --dtype=NAME     float32, bfloat16 or float16 (default bfloat16)
//   --kv-gib=X       skip cells whose KV store would exceed X GiB (default 64)
//   --quick          batch {1, 32} x context {1024, 4096} instead of {1, 8, 32, 64} x {1K, 4K, 16K}
//   --warmup=N --iterations=N
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bench/decode_inputs.h"
#include "lib/model/blas_info.h"
#include "lib/model/kv_tensors.h"
#include "lib/model/llama.h"
#include "lib/model/llama_runner.h"
#include "lib/model/static_decode.h"
#include "lib/model/torch_device.h"

namespace vtoken::model {
namespace {

struct Flags {
  std::string model = "synthetic:llama-3.1-8b";
  std::string device = "cuda";
  std::string dtype = "bfloat16";
  double kv_gib = 64;
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
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void DecodeCell(benchmark::State& state, const LlamaModel& model, int64_t batch, int64_t context,
                int64_t warmup) {
  // One slot past the inputs': the static step's scratch slot.
  const int64_t slots = batch * (context + 1);
  std::optional<KvTensors> kv = FilledKv(model, slots + 1, state);
  if (!kv) return;
#ifdef VTOKEN_TORCH_CUDA
  const bool capture = model.options().device.is_cuda();
#else
  const bool capture = false;
#endif
  StatusOr<std::unique_ptr<internal::StaticDecode>> graphs =
      internal::StaticDecode::Create(model, *kv, {.capture = capture, .scratch_slot = slots});
  if (!graphs.ok()) return state.SkipWithError(graphs.status().ToString().c_str());
  const int64_t vocab = model.config().vocab_size;
  const auto scattered = DecodeInputs(batch, context, vocab, /*scattered=*/true, 3);
  const auto contiguous = DecodeInputs(batch, context, vocab, /*scattered=*/false, 0);
  std::string error;
  const bool fits = (*graphs)->Eligible(scattered);
  auto timed = [&](auto&& run) {
    const double begin = Seconds();
    StatusOr<std::vector<PagedSeqOutput>> out = run();
    const double took = Seconds() - begin;
    if (!out.ok() && error.empty()) error = out.status().ToString();
    benchmark::DoNotOptimize(out);
    return took;
  };
  auto step = [&](const std::vector<PagedSeqInput>& inputs) {
    return timed([&] { return model.ForwardPaged(inputs, *kv); });
  };
  auto static_step = [&] {
    return fits ? timed([&] { return (*graphs)->Step(scattered); }) : 0.0;
  };
  for (int64_t i = 0; i < warmup; ++i) {
    step(scattered);
    step(contiguous);
    static_step();
  }
  if (!error.empty()) return state.SkipWithError(error.c_str());
  double scattered_s = 0, contiguous_s = 0, static_s = 0;
  int64_t turn = 0;
  for (auto _ : state) {
    double s = 0, c = 0, g = 0;
    for (int64_t k = 0; k < 3; ++k) {  // The three steps in rotating order.
      switch ((turn + k) % 3) {
        case 0: s = step(scattered); break;
        case 1: c = step(contiguous); break;
        default: g = static_step(); break;
      }
    }
    ++turn;
    scattered_s += s;
    contiguous_s += c;
    static_s += g;
    state.SetIterationTime(s);
  }
  if (!error.empty()) return state.SkipWithError(error.c_str());
  const double n = static_cast<double>(state.iterations());
  state.counters["scattered_ms"] = 1e3 * scattered_s / n;
  state.counters["contiguous_ms"] = 1e3 * contiguous_s / n;
  state.counters["ratio"] = scattered_s / contiguous_s;
  state.counters["tok_per_s"] = static_cast<double>(batch) * n / scattered_s;
  if (fits) {  // Batches over StaticDecode::kMaxBatch have no static step.
    state.counters["graphs"] = capture ? 1 : 0;
    state.counters["static_ms"] = 1e3 * static_s / n;
    state.counters["graph_speedup"] = scattered_s / static_s;
  }
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
  benchmark::AddCustomContext("model", flags.model + (flags.model.rfind("synthetic:", 0) == 0
                                                          ? " (synthetic weights)"
                                                          : ""));
  benchmark::AddCustomContext("device", flags.device);
  benchmark::AddCustomContext("dtype", flags.dtype);
  benchmark::AddCustomContext("blas", BlasDescription());
  const std::vector<int64_t> batches =
      flags.quick ? std::vector<int64_t>{1, 32} : std::vector<int64_t>{1, 8, 32, 64};
  const std::vector<int64_t> contexts =
      flags.quick ? std::vector<int64_t>{1024, 4096} : std::vector<int64_t>{1024, 4096, 16384};
  for (int64_t context : contexts) {
    for (int64_t batch : batches) {
      const double gib = static_cast<double>(batch * (context + 1)) * kv_bytes_per_token / (1 << 30);
      if (gib > flags.kv_gib) {
        std::fprintf(stderr, "torch_gpu_bench: skipping batch %lld x context %lld: %.1f GiB of KV"
                     " > --kv-gib=%g\n", static_cast<long long>(batch),
                     static_cast<long long>(context), gib, flags.kv_gib);
        continue;
      }
      const std::string name = "BM_DecodeStep/batch:" + std::to_string(batch) +
                               "/context:" + std::to_string(context);
      benchmark::RegisterBenchmark(name.c_str(),
                                   [&model, batch, context, warmup = flags.warmup](
                                       benchmark::State& state) {
                                     DecodeCell(state, *model, batch, context, warmup);
                                   })
          ->Iterations(flags.iterations)
          ->Unit(benchmark::kMillisecond)
          ->UseManualTime();
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
