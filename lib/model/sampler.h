// Sampler: picks the next token from a logits vector. Greedy (temperature 0) or seeded
// temperature + nucleus (top-p) sampling; stopping at EOS is the caller's business.
//
// Sampling, exactly: p_i = exp((x_i - max) * (1 / temperature)) in double (1 for the largest
// logit, also when it is +inf, and 0 for a NaN; every logit NaN gives token 0); the tokens sorted
// by p descending (ties: the lower id first); the nucleus is the shortest prefix of that order
// whose mass reaches top_p of the total (every token, in id order, when top_p >= 1); one
// uniform draw r in [0, nucleus mass) walks the nucleus in its order and returns the token where
// the running mass first exceeds r. Only the nucleus is sorted (a histogram of p finds it), so
// a token costs O(vocab) plus the nucleus' sort: about 1 ms at 128,256 on this project's CPUs.
//
// A Sampler owns its random stream: the same seed and the same logits give the same tokens. Each
// sampled (not greedy) token takes one uniform double u in [0, 1) from it (NextUniform) and
// r = u * nucleus mass. Split in two, NextUniform() then Draw(logits, u) is Sample(logits): what
// lets a forward sample on the GPU where the logits are (SampleRows, LogitsOut::kSample) while the
// stream stays on the host. Not thread-safe; use one per sequence (or per thread).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <random>
#include <vector>

namespace vtoken::model {

struct SamplerOptions {
  double temperature = 0.0;  // <= 0: greedy (argmax, lowest id on ties).
  double top_p = 1.0;        // Keep the smallest set of most likely tokens whose mass >= top_p.
  uint64_t seed = 0;         // Seed of the sampler's own random stream.
};

// One token's draw by Sampler's rule, for a forward that samples where the logits are
// (LogitsOut::kSample): the sequence's parameters and the uniform its Sampler drew.
struct SampleDraw {
  double temperature = 0.0;  // <= 0: greedy (`uniform` unused).
  double top_p = 1.0;
  double uniform = 0.0;  // In [0, 1): Sampler::NextUniform().
};

// Whether sampling at `temperature` is greedy (the argmax, lowest id on ties): the rule Sampler
// applies, and LlamaRunner when it has the forward take the argmax instead (LogitsOut::kArgMax).
inline bool IsGreedy(double temperature) { return temperature <= 0; }

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& options = {});

  // logits: [vocab], any float dtype, any device. Returns a token id in [0, vocab).
  int32_t Sample(const torch::Tensor& logits);
  // The uniform of the next sampled token, from the sampler's stream (greedy sampling takes none).
  double NextUniform();
  // Sample's rule with `uniform` (in [0, 1)) as the token's draw; takes nothing from the stream.
  int32_t Draw(const torch::Tensor& logits, double uniform);

 private:
  // Nucleus histogram: 16 buckets per octave of probability from 2^-kOctaves to 2 (probs_ are
  // at most 1), and bucket 0 below.
  static constexpr int kOctaves = 64;
  static constexpr int kBuckets = 1 + (kOctaves + 1) * 16;
  // p's bucket: non-decreasing in p, 0 for p < 2^-kOctaves or NaN.
  static int ProbabilityBucket(double p);
  // probs_[i] = exp((logits[i] - max) / temperature), unnormalised, in double.
  template <class T>
  void Probabilities(const T* logits, int64_t n);

  SamplerOptions options_;
  std::mt19937_64 rng_;
  std::vector<double> probs_;  // Scratch of Sample, reused across tokens.
  std::vector<double> bucket_mass_;
  std::vector<int32_t> order_;
};

// Sampler's rule for one row: Sampler({temperature, top_p}).Draw(logits, draw.uniform).
int32_t SampleRow(const torch::Tensor& logits, const SampleDraw& draw);

// Sampler's rule for a batch of rows, in torch ops on the rows' device (the GPU's sampling:
// nothing but the ids comes back). logits [S, vocab] float, draws [S, 3] double on the same
// device (temperature, top_p, uniform per row, SampleDraw's order). Returns [S] fp32 ids
// (exact below 2^24): the argmax (lowest id on ties, NaN ignored) for a row whose temperature is
// <= 0, else the draw. The arithmetic is Sampler's, in double, with the device's exp and its
// order of summation: a token differs from the host's only when r falls within rounding of a
// boundary of the walk. The nucleus order is by logit (ties: the lower id first), which is the
// host's order by probability except among tokens whose distinct logits round to one
// probability (underflow to 0, never drawn; or temperatures above ~1e8). `nucleus`: whether a
// row has top_p < 1 (the caller knows it on the host; without one nothing is sorted); the call
// never waits on the device. REQUIRES: nucleus when a row with temperature > 0 has top_p < 1.
torch::Tensor SampleRows(const torch::Tensor& logits, const torch::Tensor& draws, bool nucleus);

}  // namespace vtoken::model
