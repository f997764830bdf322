// Torch building blocks shared by LlamaModel's dense forward (llama.cc) and its paged step
// (llama_paged.cc). Internal to lib/model.
#pragma once

#include <torch/torch.h>

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

}  // namespace vtoken::model::internal
