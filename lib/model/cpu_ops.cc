#include "lib/model/cpu_ops.h"

#include <cmath>
#include <limits>

#include "lib/model/cpu_isa.h"
#include "lib/model/cpu_simd.h"

namespace vtoken::model {
namespace {

using simd::Dot;
using simd::Exp;
using simd::kLanes;
using simd::Lanes16;
using simd::Load16;
using simd::V16;
using simd::V4;
using simd::V8;

// The shape of CpuLinear's tile for native vector N: kRows rows of x by kOutputs rows of W, so
// that its kRows * kOutputs * Lanes16<N>::kParts accumulators, the kRows x vectors and one W
// vector fit the instruction set's registers with no spill in the inner loop (check with
// `objdump -d`: no load or store relative to %rsp or %rbp between the loop's FMAs).
template <typename N>
struct LinearTile;
template <>
struct LinearTile<V16> {  // AVX-512, 32 registers: 16 accumulators + 4 + 1.
  static constexpr int kRows = 4, kOutputs = 4;
};
template <>
struct LinearTile<V8> {  // AVX2, 16 registers: 12 accumulators + 2 + 1.
  static constexpr int kRows = 2, kOutputs = 3;
};
template <>
struct LinearTile<V4> {  // SSE2, 16 registers: 8 accumulators + 1 + 1.
  static constexpr int kRows = 1, kOutputs = 2;
};

// out[r][o] = x_r . w_o for a tile of R rows of x and O rows of W, k long. Each pair's sum is
// built in the same order whatever the tile's shape and the instruction set (lane l of Lanes16
// sums elements l, l + 16, ...; the lanes then add up as Reduce16's tree; the tail last), so an
// output does not depend on which tile, and so which thread, computed it.
template <typename N, int R, int O>
VTOKEN_INLINE void DotTile(const float* x, const float* w, int64_t k, float (&out)[R][O]) {
  using L = Lanes16<N>;
  N acc[R][O][L::kParts];
  for (int r = 0; r < R; ++r) {
    for (int o = 0; o < O; ++o) {
      for (int p = 0; p < L::kParts; ++p) acc[r][o][p] = N{};
    }
  }
  int64_t i = 0;
  for (; i + kLanes <= k; i += kLanes) {
    for (int p = 0; p < L::kParts; ++p) {
      const int64_t at = i + p * L::kWidth;
      N xv[R];
      for (int r = 0; r < R; ++r) __builtin_memcpy(&xv[r], x + r * k + at, sizeof(N));
      for (int o = 0; o < O; ++o) {
        N wv;
        __builtin_memcpy(&wv, w + o * k + at, sizeof(N));
        for (int r = 0; r < R; ++r) acc[r][o][p] += xv[r] * wv;
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int o = 0; o < O; ++o) {
      L lanes;
      for (int p = 0; p < L::kParts; ++p) lanes.part[p] = acc[r][o][p];
      float sum = lanes.Reduce();
      for (int64_t j = i; j < k; ++j) sum = L::TailMulAdd(sum, x[r * k + j], w[o * k + j]);
      out[r][o] = sum;
    }
  }
}

// Rows [r0, r0 + R) x outputs [o0, o0 + O) of y.
template <typename N, int R, int O>
VTOKEN_INLINE void Tile(const CpuLinearArgs& a, int64_t r0, int64_t o0) {
  const int64_t k = a.in_features;
  float out[R][O];
  DotTile<N, R, O>(a.x + r0 * k, a.w + o0 * k, k, out);
  for (int r = 0; r < R; ++r) {
    float* y = a.y + (r0 + r) * a.out_features + o0;
    for (int o = 0; o < O; ++o) {
      const float v = out[r][o] + (a.bias != nullptr ? a.bias[o0 + o] : 0.0f);
      y[o] = a.accumulate ? y[o] + v : v;
    }
  }
}

// The last rows from r on, fewer than a tile's: one tile of exactly that many.
template <typename N, int R, int O>
VTOKEN_INLINE void RowTail(const CpuLinearArgs& a, int64_t r, int64_t o0) {
  if constexpr (R >= 1) {
    if (a.rows - r == R) return Tile<N, R, O>(a, r, o0);
    RowTail<N, R - 1, O>(a, r, o0);
  }
}

template <typename N, int O>
VTOKEN_INLINE void OutputBlock(const CpuLinearArgs& a, int64_t o0) {
  constexpr int R = LinearTile<N>::kRows;
  int64_t r = 0;
  for (; r + R <= a.rows; r += R) Tile<N, R, O>(a, r, o0);
  RowTail<N, R - 1, O>(a, r, o0);
}

// One row (batch-1 decode) streams W once, so memory bandwidth bounds it: tiles of 2 outputs,
// each prefetching all of the next tile's weight rows (contiguous in W). On SmolLM2's decode
// matrices, one thread, AVX-512 host: 17.4 GB/s against 11.7-14.0 for 4-output tiles that
// prefetch one cache line ahead (both levels alike; docs/PERFORMANCE.md).
template <typename N>
VTOKEN_INLINE void OneRow(const CpuLinearArgs& a, int64_t o_begin, int64_t o_end) {
  constexpr int O = 2;
  const int64_t k = a.in_features;
  const char* end = reinterpret_cast<const char*>(a.w + o_end * k);
  int64_t o = o_begin;
  for (; o + O <= o_end; o += O) {
    const char* next = reinterpret_cast<const char*>(a.w + (o + O) * k);
    for (int64_t at = 0; at < O * k * 4 && next + at < end; at += 64) {
      __builtin_prefetch(next + at);
    }
    Tile<N, 1, O>(a, 0, o);
  }
  for (; o < o_end; ++o) Tile<N, 1, 1>(a, 0, o);
}

// Outputs in blocks of kOutputs; in each block, rows in tiles of kRows: a block's weight rows are
// read from memory once and from L1 for every row tile after the first.
template <typename N>
VTOKEN_INLINE void RowsOn(const CpuLinearArgs& a, int64_t o_begin, int64_t o_end) {
  if (a.rows == 1) return OneRow<N>(a, o_begin, o_end);
  constexpr int O = LinearTile<N>::kOutputs;
  int64_t o = o_begin;
  for (; o + O <= o_end; o += O) {
    if (o + O < o_end) __builtin_prefetch(a.w + (o + O) * a.in_features);
    OutputBlock<N, O>(a, o);
  }
  for (; o < o_end; ++o) OutputBlock<N, 1>(a, o);
}

#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"))) void RowsAvx512(const CpuLinearArgs& a, int64_t b,
                                                          int64_t e) {
  RowsOn<V16>(a, b, e);
}
__attribute__((target("arch=x86-64-v3"))) void RowsAvx2(const CpuLinearArgs& a, int64_t b,
                                                        int64_t e) {
  RowsOn<V8>(a, b, e);
}
#endif
void RowsBaseline(const CpuLinearArgs& a, int64_t b, int64_t e) { RowsOn<V4>(a, b, e); }

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void RmsRows(
    const float* x, const float* w, float* y, int64_t rows, int64_t width, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * width;
    const float scale = 1.0f / std::sqrt(Dot(row, row, width) / static_cast<float>(width) + eps);
    float* out = y + r * width;
    for (int64_t i = 0; i < width; ++i) out[i] = w[i] * (row[i] * scale);
  }
}

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void SiluMul(
    float* g, const float* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = g[i] / (1.0f + Exp(-g[i])) * u[i];
}

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) int64_t ArgMax(
    const float* x, int64_t n) {
  // The largest value: lane-wise maxima, then the lanes'; the first index holding it after. NaN
  // never compares greater, so it is never the largest.
  float top = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  if (n >= kLanes) {
    V16 m = V16{} + top;  // -inf in every lane.
    for (; i + kLanes <= n; i += kLanes) {
      const V16 v = Load16(x + i);
      m = v > m ? v : m;
    }
    for (int64_t l = 0; l < kLanes; ++l) top = m[l] > top ? m[l] : top;
  }
  for (; i < n; ++i) top = x[i] > top ? x[i] : top;
  for (i = 0; i + kLanes <= n; i += kLanes) {
    const auto hit = Load16(x + i) == top;
    for (int64_t l = 0; l < kLanes; ++l) {
      if (hit[l] != 0) return i + l;
    }
  }
  for (; i < n; ++i) {
    if (x[i] == top) return i;
  }
  return 0;  // Only NaNs.
}

}  // namespace

int64_t CpuArgMax(const float* x, int64_t n) { return ArgMax(x, n); }

void CpuRmsNorm(const float* x, const float* weight, float* y, int64_t rows, int64_t width,
                float eps) {
  RmsRows(x, weight, y, rows, width, eps);
}

void CpuSiluMul(float* gate, const float* up, int64_t n) { SiluMul(gate, up, n); }

void CpuLinear(const CpuLinearArgs& args, int64_t o_begin, int64_t o_end) {
  switch (ActiveCpuIsa()) {
#if defined(__x86_64__)
    case CpuIsa::kAvx512:
      return RowsAvx512(args, o_begin, o_end);
    case CpuIsa::kAvx2:
      return RowsAvx2(args, o_begin, o_end);
#endif
    default:
      return RowsBaseline(args, o_begin, o_end);
  }
}

}  // namespace vtoken::model
