#include "lib/cuda/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "lib/cuda/cuda_check.h"
#include "lib/cuda/kernels.h"

namespace vtoken::cuda {
namespace {

Status ArgError(const std::string& message) {
  return InvalidArgumentError("PagedDecodeArgs: " + message);
}

}  // namespace

Status ValidatePagedDecodeArgs(const PagedDecodeArgs& a) {
  if (a.num_seqs < 0 || a.num_seqs > 65535) {
    return ArgError("num_seqs " + std::to_string(a.num_seqs) + " not in [0, 65535]");
  }
  if (a.num_heads <= 0 || a.num_kv_heads <= 0 || a.num_heads % a.num_kv_heads != 0) {
    return ArgError("num_heads (" + std::to_string(a.num_heads) + ") must be a positive multiple " +
                    "of num_kv_heads (" + std::to_string(a.num_kv_heads) + ")");
  }
  if (a.head_dim <= 0 || a.head_dim > internal::kMaxHeadDim) {
    return ArgError("head_dim " + std::to_string(a.head_dim) + " not in [1, " +
                    std::to_string(internal::kMaxHeadDim) + "]");
  }
  if (a.num_slots <= 0) return ArgError("num_slots must be positive");
  if (a.num_tokens < 0) return ArgError("num_tokens must not be negative");
  if (a.q == nullptr || a.k == nullptr || a.v == nullptr || a.seq_offsets == nullptr ||
      a.out == nullptr || (a.num_tokens > 0 && a.slots == nullptr)) {
    return ArgError("q, k, v, seq_offsets, slots and out must not be null");
  }
  if (a.token_mass != nullptr && a.lse == nullptr) {
    return ArgError("token_mass requires lse (the mass is normalized by it)");
  }
  return Status::Ok();
}

Status PagedDecodeAttention(const PagedDecodeArgs& args, Stream stream) {
  VTOKEN_RETURN_IF_ERROR(ValidatePagedDecodeArgs(args));
  if (args.num_seqs == 0) return Status::Ok();
  return CudaStatus(internal::LaunchPagedDecode(args, stream),
                    "PagedDecodeAttention: kernel launch");
}

Status PagedDecodeAttentionReference(const PagedDecodeArgs& a) {
  VTOKEN_RETURN_IF_ERROR(ValidatePagedDecodeArgs(a));
  if (a.seq_offsets[0] != 0 || a.seq_offsets[a.num_seqs] != a.num_tokens) {
    return ArgError("seq_offsets must start at 0 and end at num_tokens (" +
                    std::to_string(a.num_tokens) + ")");
  }
  for (int32_t s = 0; s < a.num_seqs; ++s) {
    if (a.seq_offsets[s + 1] < a.seq_offsets[s]) {
      return ArgError("seq_offsets decrease at sequence " + std::to_string(s));
    }
  }
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    if (a.slots[t] < 0 || a.slots[t] >= a.num_slots) {
      return ArgError("slots[" + std::to_string(t) + "] = " + std::to_string(a.slots[t]) +
                      " not in [0, " + std::to_string(a.num_slots) + ")");
    }
  }
  const int64_t dim = a.head_dim;
  const int32_t group = a.num_heads / a.num_kv_heads;
  if (a.token_mass != nullptr) {
    for (int64_t t = 0; t < a.num_tokens; ++t) a.token_mass[t] = 0.0f;
  }
  std::vector<double> scores;
  std::vector<double> acc(dim);
  for (int32_t s = 0; s < a.num_seqs; ++s) {
    const int64_t begin = a.seq_offsets[s];
    const int64_t end = a.seq_offsets[s + 1];
    for (int32_t h = 0; h < a.num_heads; ++h) {
      const float* q = a.q + (static_cast<int64_t>(s) * a.num_heads + h) * dim;
      float* out = a.out + (static_cast<int64_t>(s) * a.num_heads + h) * dim;
      const int64_t kv_head = h / group;
      scores.assign(end - begin, 0.0);
      double max_score = -std::numeric_limits<double>::infinity();
      for (int64_t t = begin; t < end; ++t) {
        const float* k = a.k + (a.slots[t] * a.num_kv_heads + kv_head) * dim;
        double dot = 0;
        for (int64_t d = 0; d < dim; ++d) dot += static_cast<double>(q[d]) * k[d];
        scores[t - begin] = dot * a.scale;
        max_score = std::max(max_score, scores[t - begin]);
      }
      double sum = 0;
      for (double& score : scores) sum += (score = std::exp(score - max_score));
      acc.assign(dim, 0.0);
      for (int64_t t = begin; t < end; ++t) {
        const float* v = a.v + (a.slots[t] * a.num_kv_heads + kv_head) * dim;
        for (int64_t d = 0; d < dim; ++d) acc[d] += scores[t - begin] * v[d];
      }
      for (int64_t d = 0; d < dim; ++d)
        out[d] = end > begin ? static_cast<float>(acc[d] / sum) : 0.0f;
      if (a.lse != nullptr) {
        a.lse[static_cast<int64_t>(s) * a.num_heads + h] =
            end > begin ? static_cast<float>(max_score + std::log(sum))
                        : -std::numeric_limits<float>::infinity();
      }
      if (a.token_mass != nullptr) {
        for (int64_t t = begin; t < end; ++t) {
          a.token_mass[t] += static_cast<float>(scores[t - begin] / sum / a.num_heads);
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace vtoken::cuda
