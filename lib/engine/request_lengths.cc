#include "lib/engine/request_lengths.h"

#include <algorithm>
#include <cmath>

#include "lib/engine/rng.h"

namespace vtoken::engine {

Lengths ClampToTotal(Lengths l, int64_t max_total) {
  if (max_total == 0 || l.input + l.output <= max_total) return l;
  // long double: input * max_total can exceed 2^53 only for absurd inputs, but be exact anyway.
  const auto scaled = static_cast<int64_t>(static_cast<long double>(l.input) * max_total /
                                           static_cast<long double>(l.input + l.output));
  l.input = std::clamp<int64_t>(scaled, 1, max_total - 1);
  l.output = max_total - l.input;
  return l;
}

std::vector<Lengths> SampleLengths(const WorkloadOptions& o) {
  Rng rng(o.seed, static_cast<uint64_t>(WorkloadStream::kLengths));
  const double sigma = o.length_sigma;
  // Lognormal mean is exp(mu + sigma^2 / 2); solve for mu so the documented mean holds.
  const double mu_in = std::log(o.input_mean) - 0.5 * sigma * sigma;
  const double mu_out = std::log(o.output_mean) - 0.5 * sigma * sigma;
  auto lognormal = [&](double mu) {
    return std::max<int64_t>(1, std::llround(std::exp(mu + sigma * rng.Normal())));
  };
  std::vector<Lengths> out(static_cast<size_t>(o.num_requests));
  for (Lengths& l : out) {
    if (o.kind == "sharegpt_like") {
      l.input = lognormal(mu_in);
      l.output = lognormal(mu_out);
    } else {
      l.input = rng.UniformInt(o.input_min, o.input_max);
      l.output = rng.UniformInt(o.output_min, o.output_max);
    }
    l = ClampToTotal(l, o.max_total_tokens);
  }
  return out;
}

}  // namespace vtoken::engine
