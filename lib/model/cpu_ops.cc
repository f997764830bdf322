#include "lib/model/cpu_ops.h"

#include <cmath>
#include <limits>

#include "lib/model/cpu_simd.h"

namespace vtoken::model {
namespace {

using simd::Dot;
using simd::Exp;
using simd::kLanes;
using simd::Load16;
using simd::Reduce16;
using simd::V16;

// out[r][o] = x_r . w_o for a tile of R rows of x and O rows of W, k long. Each pair's sum is
// built in the same order whatever the tile's shape (lane l sums elements l, l + 16, ...; the
// lanes then add up as Reduce16's tree; the tail last), so an output does not depend on which
// tile, and so which thread, computed it.
template <int R, int O>
VTOKEN_INLINE void DotTile(const float* x, const float* w, int64_t k, float (&out)[R][O]) {
  V16 acc[R][O];
  for (int r = 0; r < R; ++r) {
    for (int o = 0; o < O; ++o) acc[r][o] = V16{};
  }
  int64_t i = 0;
  for (; i + kLanes <= k; i += kLanes) {
    V16 xv[R], wv[O];
    for (int r = 0; r < R; ++r) xv[r] = Load16(x + r * k + i);
    for (int o = 0; o < O; ++o) wv[o] = Load16(w + o * k + i);
    for (int r = 0; r < R; ++r) {
      for (int o = 0; o < O; ++o) acc[r][o] += xv[r] * wv[o];
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int o = 0; o < O; ++o) {
      float sum = Reduce16(acc[r][o]);
      for (int64_t j = i; j < k; ++j) sum += x[r * k + j] * w[o * k + j];
      out[r][o] = sum;
    }
  }
}

// Rows [r0, r0 + R) x outputs [o0, o0 + O) of y.
template <int R, int O>
VTOKEN_INLINE void Tile(const CpuLinearArgs& a, int64_t r0, int64_t o0) {
  const int64_t k = a.in_features;
  float out[R][O];
  DotTile<R, O>(a.x + r0 * k, a.w + o0 * k, k, out);
  for (int r = 0; r < R; ++r) {
    float* y = a.y + (r0 + r) * a.out_features + o0;
    for (int o = 0; o < O; ++o) {
      const float v = out[r][o] + (a.bias != nullptr ? a.bias[o0 + o] : 0.0f);
      y[o] = a.accumulate ? y[o] + v : v;
    }
  }
}

template <int O>
VTOKEN_INLINE void OutputBlock(const CpuLinearArgs& a, int64_t o0) {
  int64_t r = 0;
  for (; r + 4 <= a.rows; r += 4) Tile<4, O>(a, r, o0);
  switch (a.rows - r) {
    case 3:
      Tile<3, O>(a, r, o0);
      break;
    case 2:
      Tile<2, O>(a, r, o0);
      break;
    case 1:
      Tile<1, O>(a, r, o0);
      break;
    default:
      break;
  }
}

// Outputs in blocks of 4; in each block, rows in tiles of 4: a block's 4 weight rows are read
// from memory once and from L1 for every row tile after the first.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void Rows(
    const CpuLinearArgs& a, int64_t o_begin, int64_t o_end) {
  int64_t o = o_begin;
  for (; o + 4 <= o_end; o += 4) {
    if (o + 4 < o_end) __builtin_prefetch(a.w + (o + 4) * a.in_features);
    OutputBlock<4>(a, o);
  }
  for (; o < o_end; ++o) OutputBlock<1>(a, o);
}

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
  Rows(args, o_begin, o_end);
}

}  // namespace vtoken::model
