#include "lib/model/cpu_gemm.h"

#include <algorithm>
#include <vector>

#include "lib/model/cpu_isa.h"
#include "lib/model/cpu_simd.h"

namespace vtoken::model {
namespace {

using simd::V16;
using simd::V4;
using simd::V8;

// The tile for native vector N: kRows rows by kVectors vectors of outputs; kRows * kVectors
// accumulators, kVectors panel vectors and one broadcast fit the registers with no spill in the
// inner loop (check with `objdump -d`: no access relative to %rsp or %rbp between its FMAs).
template <typename N>
struct GemmTile;
template <>
struct GemmTile<V16> {  // AVX-512, 32 registers: 24 + 3 + 1.
  static constexpr int kRows = 8, kVectors = 3;
};
template <>
struct GemmTile<V8> {  // AVX2, 16 registers: 12 + 2 + 1.
  static constexpr int kRows = 6, kVectors = 2;
};
template <>
struct GemmTile<V4> {  // SSE2, 16 registers: 8 + 2 + 1.
  static constexpr int kRows = 4, kVectors = 2;
};

template <typename N>
constexpr int64_t Lanes() {
  return static_cast<int64_t>(sizeof(N) / sizeof(float));
}

// acc[r][v] = sum_i x[r][i] * panel[i][v lanes], i over [0, in) in order; then y[r][o] = acc
// (+ bias[o]) (+ y[r][o]) for the panel's first `width` outputs.
template <typename N, int R, int V>
VTOKEN_INLINE void Tile(const float* x, int64_t ldx, const float* panel, int64_t in,
                        const float* bias, float* y, int64_t ldy, int64_t width, bool accumulate) {
  constexpr int64_t W = Lanes<N>();
  N acc[R][V];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = N{};
  }
  for (int64_t i = 0; i < in; ++i) {
    N w[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) __builtin_memcpy(&w[v], panel + i * V * W + v * W, sizeof(N));
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float xs = x[r * ldx + i];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] += w[v] * xs;
    }
  }
  for (int r = 0; r < R; ++r) {
    float out[V * W];
    for (int v = 0; v < V; ++v) __builtin_memcpy(out + v * W, &acc[r][v], sizeof(N));
    float* yr = y + r * ldy;
    for (int64_t o = 0; o < width; ++o) {
      float s = out[o];
      if (bias != nullptr) s += bias[o];
      yr[o] = accumulate ? yr[o] + s : s;
    }
  }
}

// A block's rows [0, rows) against one packed panel: full tiles of R rows, then one tile of the
// rest. (Packing x k-major as well was slower: both threads pack the same rows, for as few as 96
// outputs each in SmolLM2's k and v projections.)
template <typename N, int R, int V>
VTOKEN_INLINE void PanelRows(const float* x, int64_t ldx, int64_t rows, const float* panel,
                             int64_t in, const float* bias, float* y, int64_t ldy, int64_t width,
                             bool accumulate) {
  if constexpr (R > 0) {
    int64_t r = 0;
    for (; r + R <= rows; r += R) {
      Tile<N, R, V>(x + r * ldx, ldx, panel, in, bias, y + r * ldy, ldy, width, accumulate);
    }
    if (r < rows) {
      PanelRows<N, R - 1, V>(x + r * ldx, ldx, rows - r, panel, in, bias, y + r * ldy, ldy, width,
                             accumulate);
    }
  }
}

template <typename N>
VTOKEN_INLINE void GemmOn(const CpuLinearArgs& a, int64_t o_begin, int64_t o_end) {
  using T = GemmTile<N>;
  constexpr int64_t kPanel = T::kVectors * Lanes<N>();
  const int64_t in = a.in_features, out = a.out_features;
  thread_local std::vector<float> panel;
  panel.resize(static_cast<size_t>(in * kPanel));
  for (int64_t r0 = 0; r0 < a.rows; r0 += kGemmBlockRows) {
    const int64_t rows = std::min(kGemmBlockRows, a.rows - r0);
    for (int64_t o0 = o_begin; o0 < o_end; o0 += kPanel) {
      const int64_t width = std::min(kPanel, o_end - o0);
      // Pack W's rows [o0, o0 + width) k-major, zeros past the last.
      for (int64_t j = 0; j < kPanel; ++j) {
        const float* wr = a.w + (o0 + j) * in;
        if (j < width) {
          for (int64_t i = 0; i < in; ++i) panel[i * kPanel + j] = wr[i];
        } else {
          for (int64_t i = 0; i < in; ++i) panel[i * kPanel + j] = 0.0f;
        }
      }
      PanelRows<N, T::kRows, T::kVectors>(a.x + r0 * in, in, rows, panel.data(), in,
                                          a.bias != nullptr ? a.bias + o0 : nullptr,
                                          a.y + r0 * out + o0, out, width, a.accumulate);
    }
  }
}

#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"))) void GemmAvx512(const CpuLinearArgs& a, int64_t b,
                                                          int64_t e) {
  GemmOn<V16>(a, b, e);
}
__attribute__((target("arch=x86-64-v3"))) void GemmAvx2(const CpuLinearArgs& a, int64_t b,
                                                        int64_t e) {
  GemmOn<V8>(a, b, e);
}
#endif

}  // namespace

bool UseCpuGemm() { return ActiveCpuIsa() == CpuIsa::kAvx512; }

void CpuGemm(const CpuLinearArgs& args, int64_t o_begin, int64_t o_end) {
  switch (ActiveCpuIsa()) {
#if defined(__x86_64__)
    case CpuIsa::kAvx512:
      return GemmAvx512(args, o_begin, o_end);
    case CpuIsa::kAvx2:
      return GemmAvx2(args, o_begin, o_end);
#endif
    default:
      return GemmOn<V4>(args, o_begin, o_end);
  }
}

}  // namespace vtoken::model
