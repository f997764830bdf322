// The cost of a policy written in Python (lib/pypolicy/python_policy.h): one Score call over n
// live tokens of python/policies/py_h2o.py against the C++ h2o it ports, in one run. Both get the
// same random attn_sum; the reported time is py_h2o's, counters give both and the ratio.
// Run from the source tree (or set VTOKEN_SOURCE_DIR):
//   build/release/bench/python_policy_bench
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "lib/core/policy_registry.h"
#include "lib/pypolicy/python_policy.h"

namespace vtoken {
namespace {

const Status& Loaded() {
  static const Status status = [] {
    const char* src = std::getenv("VTOKEN_SOURCE_DIR");
    const std::string dir = src != nullptr ? std::string(src) + "/" : std::string();
    return RegisterPythonPolicy(dir + "python/policies/py_h2o.py:PyH2O").status();
  }();
  return status;
}

double Seconds(const Policy& p, std::span<const TokenView> views, std::vector<float>& scores) {
  PolicyRng rng(1);
  PolicyContext ctx{.step = 1, .budget = static_cast<int64_t>(views.size() / 4), .rng = rng};
  const auto begin = std::chrono::steady_clock::now();
  p.Score(views, ctx, scores);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
}

void BM_PythonVsCppScore(benchmark::State& state) {
  if (!Loaded().ok()) return state.SkipWithError(Loaded().ToString().c_str());
  const auto n = static_cast<size_t>(state.range(0));
  auto cpp = CreatePolicy("h2o", {});
  auto py = CreatePolicy("py_h2o", {});
  if (!cpp.ok() || !py.ok()) return state.SkipWithError("cannot create the policies");
  std::vector<TokenView> views(n);
  std::mt19937_64 rng(3);
  for (size_t i = 0; i < n; ++i) {
    views[i].position = static_cast<TokenId>(i);
    views[i].attn_sum = static_cast<float>(rng() % 1000) / 1000.0f;
  }
  std::vector<float> a(n), b(n);
  double cpp_s = 0, py_s = 0;
  for (auto _ : state) {
    const double tc = Seconds(**cpp, views, a);
    const double tp = Seconds(**py, views, b);
    if (a != b) return state.SkipWithError("py_h2o scored differently from h2o");
    cpp_s += tc;
    py_s += tp;
    state.SetIterationTime(tp);
  }
  const double it = static_cast<double>(state.iterations());
  state.counters["cpp_us"] = 1e6 * cpp_s / it;
  state.counters["py_us"] = 1e6 * py_s / it;
  state.counters["py_over_cpp"] = py_s / cpp_s;
}
BENCHMARK(BM_PythonVsCppScore)
    ->ArgName("tokens")
    ->Arg(64)
    ->Arg(512)
    ->Arg(4096)
    ->Unit(benchmark::kMicrosecond)
    ->UseManualTime();

}  // namespace
}  // namespace vtoken
BENCHMARK_MAIN();
