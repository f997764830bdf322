#include "lib/model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "lib/model/cpu_ops.h"

namespace vtoken::model {

Sampler::Sampler(const SamplerOptions& options) : options_(options), rng_(options.seed) {}

int32_t Sampler::Sample(const torch::Tensor& logits) {
  if (options_.temperature <= 0) {
    // Greedy reads fp32 host logits (what every forward returns) where they lie: no double copy
    // of the vocabulary per token (128K entries for Llama 3). fp16 / bf16 widen to fp32 exactly;
    // doubles stay doubles, so that no two of them round to one float.
    torch::Tensor t = logits.detach().to(torch::kCPU);
    if (t.scalar_type() != torch::kDouble) t = t.to(torch::kFloat);
    t = t.contiguous();
    const int64_t n = t.numel();
    if (t.scalar_type() == torch::kDouble) {
      const double* v = t.data_ptr<double>();
      return static_cast<int32_t>(std::max_element(v, v + n) - v);
    }
    return static_cast<int32_t>(CpuArgMax(t.data_ptr<float>(), n));
  }
  auto values = logits.detach().to(torch::kCPU, torch::kDouble).contiguous();
  const double* v = values.data_ptr<double>();
  const int64_t n = values.numel();
  // Softmax in double on the host: the vocabulary is small next to the forward pass, and the
  // draw must not depend on the device's reduction order.
  const double max = *std::max_element(v, v + n);
  std::vector<double> probs(n);
  for (int64_t i = 0; i < n; ++i) probs[i] = std::exp((v[i] - max) / options_.temperature);
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return probs[a] > probs[b]; });
  const double total = std::accumulate(probs.begin(), probs.end(), 0.0);
  double kept = 0;
  size_t num_kept = 0;
  while (num_kept < order.size() && (num_kept == 0 || kept < options_.top_p * total)) {
    kept += probs[order[num_kept++]];
  }
  double r = std::uniform_real_distribution<double>(0.0, kept)(rng_);
  for (size_t i = 0; i < num_kept; ++i) {
    r -= probs[order[i]];
    if (r < 0) return order[i];
  }
  return order[num_kept - 1];
}

}  // namespace vtoken::model
