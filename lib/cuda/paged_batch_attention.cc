#include "lib/cuda/paged_batch_attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "lib/cuda/cuda_check.h"
#include "lib/cuda/paged_batch_kernels.h"

namespace vtoken::cuda {
namespace {

Status ArgError(const std::string& message) {
  return InvalidArgumentError("PagedBatchArgs: " + message);
}

std::string Str(int64_t value) { return std::to_string(value); }

size_t ElementBytes(AttnDtype dtype) { return dtype == AttnDtype::kFloat32 ? 4 : 2; }

// Element `index` of a q / K / V / out array of `dtype`, as a double.
double LoadElement(const void* base, int64_t index, AttnDtype dtype) {
  if (dtype == AttnDtype::kFloat32) return static_cast<const float*>(base)[index];
  return HalfBitsToFloat(static_cast<const uint16_t*>(base)[index], dtype);
}

void StoreElement(void* base, int64_t index, double value, AttnDtype dtype) {
  const float f = static_cast<float>(value);
  if (dtype == AttnDtype::kFloat32) {
    static_cast<float*>(base)[index] = f;
  } else {
    static_cast<uint16_t*>(base)[index] = FloatToHalfBits(f, dtype);
  }
}

// The first key of [0, hi) inside the window of the query at position `query_pos`
// (CpuPagedAttention's rule: positions nondecreasing, keys with query_pos - p < window).
// The query is key hi - 1; kpos is read only with a window (it may be null without one).
int64_t WindowStart(const int64_t* kpos, int64_t hi, int64_t window) {
  if (window <= 0) return 0;
  return std::upper_bound(kpos, kpos + hi, kpos[hi - 1] - window) - kpos;
}

int64_t SignalRows(const PagedBatchArgs& a, int64_t s, int64_t n) {
  return std::clamp<int64_t>(a.num_signal[s], 1, n);
}

// The contents checks of the reference (PagedBatchAttentionReference's contract).
Status CheckContents(const PagedBatchArgs& a) {
  const int64_t units = a.num_seqs * a.groups_per_seq;
  if (a.q_offsets[0] != 0 || a.q_offsets[a.num_seqs] != a.num_rows) {
    return ArgError("q_offsets must start at 0 and end at num_rows (" + Str(a.num_rows) + ")");
  }
  if (a.key_offsets[0] != 0 || a.key_offsets[units] != a.num_keys) {
    return ArgError("key_offsets must start at 0 and end at num_keys (" + Str(a.num_keys) + ")");
  }
  for (int64_t h = 0; a.head_group != nullptr && h < a.num_kv_heads; ++h) {
    if (a.head_group[h] < 0 || a.head_group[h] >= a.groups_per_seq) {
      return ArgError("head_group[" + Str(h) + "] = " + Str(a.head_group[h]) + " not in [0, " +
                      Str(a.groups_per_seq) + ")");
    }
  }
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    const int64_t n = a.q_offsets[s + 1] - a.q_offsets[s];
    if (n < 1) return ArgError("sequence " + Str(s) + " has no query rows");
    const bool skipped = a.skip != nullptr && a.skip[s] != 0;  // The max_* bounds skip it.
    if (!skipped && n > a.max_query_rows) {
      return ArgError("sequence " + Str(s) + " has " + Str(n) +
                      " query rows, past max_query_rows " + Str(a.max_query_rows));
    }
    if (!skipped && internal::WantsAttnSignals(a) && a.want_signals[s] != 0 &&
        SignalRows(a, s, n) > a.max_signal_rows) {
      return ArgError("sequence " + Str(s) + " has " + Str(SignalRows(a, s, n)) +
                      " signal rows, past max_signal_rows " + Str(a.max_signal_rows));
    }
    for (int64_t u = s * a.groups_per_seq; u < (s + 1) * a.groups_per_seq; ++u) {
      const int64_t keys = a.key_offsets[u + 1] - a.key_offsets[u];
      if (keys < n) {
        return ArgError("key range " + Str(u) + " has " + Str(keys) + " keys, fewer than its " +
                        "sequence's " + Str(n) + " query rows");
      }
      if (!skipped && keys > a.max_keys) {
        return ArgError("key range " + Str(u) + " has " + Str(keys) + " keys, past max_keys " +
                        Str(a.max_keys));
      }
      const int64_t* kpos = a.sliding_window > 0 ? a.key_positions + a.key_offsets[u] : nullptr;
      if (kpos != nullptr && !std::is_sorted(kpos, kpos + keys)) {
        return ArgError("key_positions decrease within key range " + Str(u));
      }
    }
  }
  for (int64_t j = 0; j < a.num_keys; ++j) {
    if (a.slots[j] < 0 || a.slots[j] >= a.num_slots) {
      return ArgError("slots[" + Str(j) + "] = " + Str(a.slots[j]) + " not in [0, " +
                      Str(a.num_slots) + ")");
    }
  }
  return Status::Ok();
}

}  // namespace

Status ValidatePagedBatchArgs(const PagedBatchArgs& a) {
  if (a.dtype != AttnDtype::kFloat32 && a.dtype != AttnDtype::kBFloat16 &&
      a.dtype != AttnDtype::kFloat16) {
    return ArgError("dtype " + Str(static_cast<int32_t>(a.dtype)) + " unknown");
  }
  if (a.num_seqs < 0 || a.num_seqs > (1 << 20)) {
    return ArgError("num_seqs " + Str(a.num_seqs) + " not in [0, 1048576]");
  }
  if (a.num_heads <= 0 || a.num_heads > internal::kBatchMaxHeads || a.num_kv_heads <= 0 ||
      a.num_heads % a.num_kv_heads != 0) {
    return ArgError("num_heads (" + Str(a.num_heads) + ") must be in [1, " +
                    Str(internal::kBatchMaxHeads) + "] and a multiple of num_kv_heads (" +
                    Str(a.num_kv_heads) + ")");
  }
  if (a.head_dim <= 0 || a.head_dim > internal::kBatchMaxHeadDim) {
    return ArgError("head_dim " + Str(a.head_dim) + " not in [1, " +
                    Str(internal::kBatchMaxHeadDim) + "]");
  }
  if (a.num_slots <= 0) return ArgError("num_slots must be positive");
  if (a.kv_head_stride < 0 ||
      a.slot_stride < (a.num_kv_heads - 1) * a.kv_head_stride + a.head_dim) {
    return ArgError("slot_stride " + Str(a.slot_stride) + " must hold num_kv_heads (" +
                    Str(a.num_kv_heads) + ") heads of head_dim (" + Str(a.head_dim) +
                    ") at kv_head_stride " + Str(a.kv_head_stride));
  }
  if (a.groups_per_seq < 1) return ArgError("groups_per_seq must be positive");
  if (a.norm_heads < 1) return ArgError("norm_heads must be positive");
  if (a.sliding_window < 0) return ArgError("sliding_window must not be negative");
  if (a.num_rows < 0 || a.num_keys < 0) {
    return ArgError("num_rows and num_keys must not be negative");
  }
  if (a.num_seqs > 0 && (a.max_query_rows < 1 || a.max_query_rows > 65535)) {
    return ArgError("max_query_rows " + Str(a.max_query_rows) + " not in [1, 65535]");
  }
  if (a.num_seqs > 0 && a.max_keys < 1) return ArgError("max_keys must be positive");
  if (internal::WantsAttnSignals(a) && a.max_signal_rows < 1) {
    return ArgError("max_signal_rows must be positive when attention signals are wanted");
  }
  if (a.q == nullptr || a.k_cache == nullptr || a.v_cache == nullptr || a.out == nullptr ||
      a.q_offsets == nullptr || a.key_offsets == nullptr || a.slots == nullptr) {
    return ArgError("q, k_cache, v_cache, out, q_offsets, key_offsets and slots must not be null");
  }
  if (a.sliding_window > 0 && a.key_positions == nullptr) {
    return ArgError("a sliding window requires key_positions");
  }
  if (a.want_signals != nullptr && a.num_signal == nullptr) {
    return ArgError("want_signals requires num_signal");
  }
  return Status::Ok();
}

int32_t PagedBatchPartitions(const PagedBatchArgs& args) {
  return internal::TilingOf(args).partitions;
}

size_t PagedBatchWorkspaceBytes(const PagedBatchArgs& args) {
  internal::PagedBatchWorkspace ws;
  return internal::CarveWorkspace(args, internal::TilingOf(args), nullptr, &ws);
}

Status PagedBatchAttention(const PagedBatchArgs& args, void* workspace, size_t workspace_bytes,
                           Stream stream) {
  VTOKEN_RETURN_IF_ERROR(ValidatePagedBatchArgs(args));
  if (args.num_seqs == 0) return Status::Ok();
  const internal::PagedBatchTiling tiling = internal::TilingOf(args);
  if (tiling.row_tiles * tiling.head_tiles > 65535) {
    return ArgError("max_query_rows " + Str(args.max_query_rows) + " needs " +
                    Str(tiling.row_tiles * tiling.head_tiles) + " query tiles, past 65535");
  }
  internal::PagedBatchWorkspace ws;
  const size_t needed = internal::CarveWorkspace(args, tiling, workspace, &ws);
  if (workspace_bytes < needed || (needed > 0 && workspace == nullptr)) {
    return ArgError("workspace of " + Str(static_cast<int64_t>(workspace_bytes)) +
                    " bytes, needs " + Str(static_cast<int64_t>(needed)));
  }
  const int64_t vec = 16 / static_cast<int64_t>(ElementBytes(args.dtype));
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vectorized = args.head_dim % vec == 0 && args.slot_stride % vec == 0 &&
                          args.kv_head_stride % vec == 0 && aligned(args.k_cache) &&
                          aligned(args.v_cache);
  return CudaStatus(internal::LaunchPagedBatch(args, tiling, ws, vectorized, stream),
                    "PagedBatchAttention: kernel launch");
}

Status PagedBatchAttentionReference(const PagedBatchArgs& a) {
  VTOKEN_RETURN_IF_ERROR(ValidatePagedBatchArgs(a));
  if (a.num_seqs == 0) return Status::Ok();
  VTOKEN_RETURN_IF_ERROR(CheckContents(a));
  const int64_t dim = a.head_dim, group = a.num_heads / a.num_kv_heads;
  const AttnDtype dt = a.dtype;
  // Signals of this call, in double, added to the fp32 sums at the end.
  std::vector<double> attn(static_cast<size_t>(a.num_keys), 0.0);
  std::vector<double> norm(static_cast<size_t>(a.num_keys), 0.0);
  std::vector<double> scores, acc;
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    if (a.skip != nullptr && a.skip[s] != 0) continue;
    const int64_t q0 = a.q_offsets[s], n = a.q_offsets[s + 1] - q0;
    const bool signals = a.want_signals != nullptr && a.want_signals[s] != 0;
    const int64_t first_signal = signals ? n - SignalRows(a, s, n) : n;
    for (int64_t g = 0; g < a.num_kv_heads; ++g) {
      const int64_t u = s * a.groups_per_seq + (a.head_group != nullptr ? a.head_group[g] : 0);
      const int64_t k0 = a.key_offsets[u], keys = a.key_offsets[u + 1] - k0, ctx = keys - n;
      const int64_t* kpos = a.sliding_window > 0 ? a.key_positions + k0 : nullptr;
      auto row_of = [&](int64_t j) {
        return a.slots[k0 + j] * a.slot_stride + g * a.kv_head_stride;
      };
      for (int64_t i = 0; i < n; ++i) {
        const int64_t hi = ctx + i + 1;
        const int64_t lo = WindowStart(kpos, hi, a.sliding_window);
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          const int64_t q_at = ((q0 + i) * a.num_heads + h) * dim;
          scores.assign(static_cast<size_t>(hi - lo), 0.0);
          double max_score = -std::numeric_limits<double>::infinity();
          for (int64_t j = lo; j < hi; ++j) {
            double dot = 0;
            for (int64_t d = 0; d < dim; ++d) {
              dot += LoadElement(a.q, q_at + d, dt) * LoadElement(a.k_cache, row_of(j) + d, dt);
            }
            scores[j - lo] = dot * a.scale;
            max_score = std::max(max_score, scores[j - lo]);
          }
          double sum = 0;
          for (double& score : scores) sum += (score = std::exp(score - max_score));
          acc.assign(static_cast<size_t>(dim), 0.0);
          for (int64_t j = lo; j < hi; ++j) {
            const double p = scores[j - lo] / sum;
            for (int64_t d = 0; d < dim; ++d) {
              acc[d] += p * LoadElement(a.v_cache, row_of(j) + d, dt);
            }
            if (a.attn_sum != nullptr && i >= first_signal) attn[k0 + j] += p;
          }
          for (int64_t d = 0; d < dim; ++d) StoreElement(a.out, q_at + d, acc[d], dt);
        }
      }
      if (signals && a.norm_sum != nullptr) {
        for (int64_t j = 0; j < keys; ++j) {
          double sq = 0;
          for (int64_t d = 0; d < dim; ++d) {
            const double x = LoadElement(a.k_cache, row_of(j) + d, dt);
            sq += x * x;
          }
          norm[k0 + j] += std::sqrt(sq) / static_cast<double>(a.norm_heads);
        }
      }
    }
  }
  for (int64_t j = 0; j < a.num_keys; ++j) {
    if (a.attn_sum != nullptr) a.attn_sum[j] += static_cast<float>(attn[j]);
    if (a.norm_sum != nullptr) a.norm_sum[j] += static_cast<float>(norm[j]);
  }
  return Status::Ok();
}

float HalfBitsToFloat(uint16_t bits, AttnDtype dtype) {
  if (dtype == AttnDtype::kBFloat16) return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
  const int32_t exponent = (bits >> 10) & 0x1f;
  const uint32_t mantissa = bits & 0x3ff;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {  // Zero or subnormal: mantissa * 2^-24.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | static_cast<uint32_t>(exponent + 112) << 23 |
                              (mantissa << 13));
}

uint16_t FloatToHalfBits(float value, AttnDtype dtype) {
  const uint32_t u = std::bit_cast<uint32_t>(value);
  if (dtype == AttnDtype::kBFloat16) {
    if (std::isnan(value)) return static_cast<uint16_t>((u >> 16) | 0x40);
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  if (std::isnan(value)) return sign | 0x7e00;
  const float magnitude = std::fabs(value);
  if (magnitude >= 65520.0f) return sign | 0x7c00;  // Rounds to infinity.
  if (magnitude < std::ldexp(1.0f, -14)) {          // Subnormal: multiples of 2^-24, RNE.
    return sign | static_cast<uint16_t>(std::nearbyint(std::ldexp(magnitude, 24)));
  }
  const uint32_t m = std::bit_cast<uint32_t>(magnitude);
  // Rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  const uint32_t rounded = m + 0xfffu + ((m >> 13) & 1u);
  return sign | static_cast<uint16_t>((rounded - (112u << 23)) >> 13);
}

}  // namespace vtoken::cuda
