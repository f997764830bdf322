// Torch building blocks shared by LlamaModel's dense forward (llama.cc) and its paged step
// (llama_paged.cc). Internal to lib/model.
#pragma once

#include <torch/torch.h>

#include <limits>

namespace vtoken::model::internal {

inline torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& w,
                            const torch::Tensor& b) {
  return b.defined() ? torch::nn::functional::linear(x, w, b) : torch::matmul(x, w.t());
}

// HF rotate_half: [x1, x2] -> [-x2, x1] over the last dimension's halves.
inline torch::Tensor RotateHalf(const torch::Tensor& x) {
  auto halves = x.chunk(2, -1);
  return torch::cat({-halves[1], halves[0]}, -1);
}

inline torch::Tensor ApplyRope(const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin) {
  return x * cos + RotateHalf(x) * sin;
}

// Token ids below 2^24 are exact in fp32 (Llama 3's vocabulary has 128,256): a step's argmax
// can come back in the fp32 buffer its signals come back in.
inline constexpr int64_t kMaxFloatExactVocab = int64_t{1} << 24;

// [rows, vocab] logits -> [rows] fp32: each row's argmax, the lowest id on ties (torch's
// contract for argmax on every device) and NaN ignored (0 for a row of NaN): Sampler's greedy
// rule (CpuArgMax). torch's argmax alone would take a NaN as the largest.
inline torch::Tensor ArgMaxRows(const torch::Tensor& logits) {
  const double inf = std::numeric_limits<double>::infinity();
  return logits.nan_to_num(-inf, inf, -inf).argmax(1).to(torch::kFloat32);
}

}  // namespace vtoken::model::internal
