// Sampler: picks the next token from a logits vector. Greedy (temperature 0) or seeded
// temperature + nucleus (top-p) sampling; stopping at EOS is the caller's business.
//
// A Sampler owns its random stream: the same seed and the same logits give the same tokens.
// Not thread-safe; use one per sequence (or per thread).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <random>

namespace vtoken::model {

struct SamplerOptions {
  double temperature = 0.0;  // <= 0: greedy (argmax, lowest id on ties).
  double top_p = 1.0;        // Keep the smallest set of most likely tokens whose mass >= top_p.
  uint64_t seed = 0;         // Seed of the sampler's own random stream.
};

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& options = {});

  // logits: [vocab], any float dtype, any device. Returns a token id in [0, vocab).
  int32_t Sample(const torch::Tensor& logits);

 private:
  SamplerOptions options_;
  std::mt19937_64 rng_;
};

}  // namespace vtoken::model
