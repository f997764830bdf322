// Torch building blocks shared by LlamaModel's dense forward (llama.cc) and its paged step
// (llama_paged*.cc). Internal to lib/model.
#pragma once

#include <torch/torch.h>

#include <bit>
#include <cstdint>
#include <limits>
#include <span>

#include "lib/model/cpu_ops.h"
#include "lib/model/llama.h"
#include "lib/model/sampler.h"

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

// A prefill chunk of at least this many new tokens is attended with BLAS (gather + bmm) on both
// paged paths: a fused kernel's per-query loop (CpuPagedAttention, lib/cuda's) wins for decode,
// GEMMs win for long query blocks (BM_PrefillFusedVsReference in bench/torch_model_bench.cc).
inline constexpr int64_t kBlasAttentionMinQueries = 16;

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

// What a paged step's inputs ask of their last-token logits (LogitsOut): `rows`, whether one wants
// its logits row back (or the vocabulary is too large for fp32 ids, and every row comes back);
// `draws`, whether one samples at a temperature > 0; `nucleus`, whether such a one has
// top_p < 1 (SampleRows sorts only then).
struct LogitsAsked {
  bool rows = false, draws = false, nucleus = false;
};
inline LogitsAsked AskedOfLogits(std::span<const PagedSeqView> inputs, int64_t vocab) {
  LogitsAsked a{.rows = vocab > kMaxFloatExactVocab};
  for (const PagedSeqView& in : inputs) {
    a.rows |= in.logits == LogitsOut::kFull;
    if (in.logits == LogitsOut::kSample && !IsGreedy(in.draw.temperature)) {
      a.draws = true;
      a.nucleus |= in.draw.top_p < 1;
    }
  }
  return a;
}

// Sets in `out` what `in` asked of its last-token logits: the row (kFull: `row`, then defined), or
// the token: `*id` when the step took it where the logits are (id non-null), else taken on the
// host from `row` (a contiguous fp32 [vocab]) by Sampler's rule.
inline void TakeLogitsOut(const PagedSeqView& in, const torch::Tensor& row, const float* id,
                          PagedSeqOutput& out) {
  switch (in.logits) {
    case LogitsOut::kFull:
      out.last_logits = row;
      break;
    case LogitsOut::kArgMax:
      out.token =
          static_cast<int32_t>(id != nullptr ? *id : CpuArgMax(row.data_ptr<float>(), row.numel()));
      break;
    case LogitsOut::kSample:
      out.token = id != nullptr ? static_cast<int32_t>(*id) : SampleRow(row, in.draw);
      break;
    case LogitsOut::kNone:
      break;
  }
}

// SampleRows' draws [rows, 3] as int64 words (the doubles' bits) at `words`: per row its draw
// (temperature, top_p, uniform), temperature 0 (the argmax) for a row that does not sample and
// for the rows past the inputs (padding).
inline void WriteDrawWords(std::span<const PagedSeqView> inputs, int64_t rows, int64_t* words) {
  for (int64_t s = 0; s < rows; ++s) {
    const bool draws =
        s < static_cast<int64_t>(inputs.size()) && inputs[s].logits == LogitsOut::kSample;
    const SampleDraw d = draws ? inputs[s].draw : SampleDraw{};
    words[3 * s] = std::bit_cast<int64_t>(d.temperature);
    words[3 * s + 1] = std::bit_cast<int64_t>(d.top_p);
    words[3 * s + 2] = std::bit_cast<int64_t>(d.uniform);
  }
}

}  // namespace vtoken::model::internal
