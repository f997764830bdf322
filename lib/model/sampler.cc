#include "lib/model/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "lib/model/cpu_ops.h"

namespace vtoken::model {

Sampler::Sampler(const SamplerOptions& options) : options_(options), rng_(options.seed) {}

namespace {

// `logits` as a contiguous host tensor of fp32 (fp16 / bf16 widen exactly), or of doubles, so
// that no two of them round to one float.
torch::Tensor HostLogits(const torch::Tensor& logits) {
  torch::Tensor t = logits.detach().to(torch::kCPU);
  if (t.scalar_type() != torch::kDouble) t = t.to(torch::kFloat);
  return t.contiguous();
}

}  // namespace

int32_t Sampler::Sample(const torch::Tensor& logits) {
  return Draw(logits, IsGreedy(options_.temperature) ? 0.0 : NextUniform());
}

double Sampler::NextUniform() {
  // What std::uniform_real_distribution<double>(0, b) scales by b: the streams of the earlier
  // single-step Sample are unchanged.
  return std::generate_canonical<double, std::numeric_limits<double>::digits>(rng_);
}

int32_t Sampler::Draw(const torch::Tensor& logits, double uniform) {
  // Both modes read the host logits where they lie: no double copy of the vocabulary per token
  // (128K entries for Llama 3).
  const torch::Tensor t = HostLogits(logits);
  const int64_t n = t.numel();
  const bool doubles = t.scalar_type() == torch::kDouble;
  if (IsGreedy(options_.temperature)) {
    if (doubles) {
      const double* v = t.data_ptr<double>();
      return static_cast<int32_t>(std::max_element(v, v + n) - v);
    }
    return static_cast<int32_t>(CpuArgMax(t.data_ptr<float>(), n));
  }
  // Softmax in double on the host: the draw must not depend on the device's reduction order.
  probs_.resize(static_cast<size_t>(n));
  if (doubles) {
    Probabilities(t.data_ptr<double>(), n);
  } else {
    Probabilities(t.data_ptr<float>(), n);
  }
  double total = 0;
  for (double p : probs_) total += p;
  if (!(total > 0)) return 0;  // Every logit NaN: token 0, as greedy answers.
  size_t num_kept = 0;
  double kept = 0;
  if (options_.top_p >= 1) {
    // Every token is kept: the draw walks them in id order (no sort).
    order_.resize(static_cast<size_t>(n));
    std::iota(order_.begin(), order_.end(), 0);
    num_kept = order_.size();
    kept = total;
  } else {
    // The nucleus: the most likely tokens (ties: the lower id first) until their mass reaches
    // top_p of the total. Only candidates are sorted: a histogram of the probabilities (1/16
    // octave buckets, ProbabilityBucket) finds the bucket where the mass from the top crosses
    // the target, and the tokens from that bucket up are sorted; all of them when rounding
    // keeps the sorted sum below the target.
    const double target = options_.top_p * total;
    bucket_mass_.assign(kBuckets, 0.0);
    for (double p : probs_) bucket_mass_[ProbabilityBucket(p)] += p;
    int lowest = 0;
    double mass = 0;
    for (int b = kBuckets - 1; b > 0; --b) {
      mass += bucket_mass_[b];
      if (mass >= target) {
        lowest = b;
        break;
      }
    }
    const auto more_likely = [&](int32_t a, int32_t b) {
      return probs_[a] > probs_[b] || (probs_[a] == probs_[b] && a < b);
    };
    for (;; lowest = 0) {
      order_.clear();
      for (int64_t i = 0; i < n; ++i) {
        if (ProbabilityBucket(probs_[i]) >= lowest) order_.push_back(static_cast<int32_t>(i));
      }
      std::sort(order_.begin(), order_.end(), more_likely);
      num_kept = 0;
      kept = 0;
      while (num_kept < order_.size() && (num_kept == 0 || kept < target)) {
        kept += probs_[order_[num_kept++]];
      }
      if (kept >= target || lowest == 0) break;
    }
  }
  double r = uniform * kept;
  for (size_t i = 0; i < num_kept; ++i) {
    r -= probs_[order_[i]];
    if (r < 0) return order_[i];
  }
  return order_[num_kept - 1];
}

int32_t SampleRow(const torch::Tensor& logits, const SampleDraw& draw) {
  return Sampler({.temperature = draw.temperature, .top_p = draw.top_p}).Draw(logits, draw.uniform);
}

torch::Tensor SampleRows(const torch::Tensor& logits, const torch::Tensor& draws, bool nucleus) {
  const double inf = std::numeric_limits<double>::infinity();
  const torch::Tensor x = logits.to(torch::kDouble);
  // The logits with NaN never the largest, in their own dtype (fp32: half the bytes of doubles,
  // the same order): the max, the sort and the argmax read it.
  const torch::Tensor key = logits.nan_to_num(-inf, inf, -inf);
  const torch::Tensor temperature = draws.select(1, 0), top_p = draws.select(1, 1);
  const torch::Tensor max = key.amax(1, /*keepdim=*/true).to(torch::kDouble);
  // Sampler::Probabilities: 1 for the largest logit, exp((x - max) / temperature) for the others,
  // 0 for a NaN.
  torch::Tensor p = ((x - max) * temperature.reciprocal().unsqueeze(1)).exp();
  p = torch::where(x == max, torch::ones_like(p), p);
  p = torch::where(p >= 0, p, torch::zeros_like(p));
  const torch::Tensor total = p.sum(1);
  // The walk's order: id order for top_p >= 1, else by logit descending, ties by id (stable).
  const torch::Tensor whole = top_p >= 1;
  torch::Tensor order;
  torch::Tensor walked = p;
  if (nucleus) {
    order = std::get<1>(key.sort(/*stable=*/true, /*dim=*/1, /*descending=*/true));
    order = torch::where(whole.unsqueeze(1),
                         torch::arange(x.size(1), order.options()).unsqueeze(0).expand_as(order),
                         order);
    walked = p.gather(1, order);
  }
  const torch::Tensor cum = walked.cumsum(1);
  // The nucleus: one token, then more while the mass walked is below top_p of the total.
  const torch::Tensor target = torch::where(whole, torch::full_like(total, inf), top_p * total);
  const torch::Tensor kept_count = ((cum < target.unsqueeze(1)).sum(1) + 1).clamp_max(x.size(1));
  const torch::Tensor kept = cum.gather(1, (kept_count - 1).unsqueeze(1)).squeeze(1);
  // r = u * mass; the token where the running mass first exceeds r.
  const torch::Tensor r = draws.select(1, 2) * kept;
  torch::Tensor pick = torch::minimum((cum <= r.unsqueeze(1)).sum(1), kept_count - 1);
  if (order.defined()) pick = order.gather(1, pick.unsqueeze(1)).squeeze(1);
  pick = torch::where(total > 0, pick, torch::zeros_like(pick));  // Every logit NaN: token 0.
  return torch::where(temperature > 0, pick, key.argmax(1)).to(torch::kFloat32);
}

int Sampler::ProbabilityBucket(double p) {
  if (!(p >= 0x1p-64)) return 0;  // Also NaN.
  if (p >= 2) return kBuckets - 1;
  // Positive doubles order as their bits: the exponent, then the top 4 bits of the mantissa.
  const uint64_t bits = std::bit_cast<uint64_t>(p);
  const int exponent = static_cast<int>(bits >> 52) - 1023;  // p in [2^exponent, 2^(exponent+1))
  return 1 + (exponent + kOctaves) * 16 + static_cast<int>((bits >> 48) & 15);
}

template <class T>
void Sampler::Probabilities(const T* logits, int64_t n) {
  // The largest logit takes probability 1 exactly (also when it is +inf; the finite ones then
  // take 0); a NaN logit takes 0.
  double max = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) max = logits[i] > max ? logits[i] : max;
  const double inverse_temperature = 1.0 / options_.temperature;
  for (int64_t i = 0; i < n; ++i) {
    const double x = logits[i];
    const double p = x == max ? 1.0 : std::exp((x - max) * inverse_temperature);
    probs_[i] = p >= 0 ? p : 0.0;
  }
}

}  // namespace vtoken::model
