#include "lib/model/cpu_ops.h"

#include <cmath>

#include "lib/model/cpu_simd.h"

namespace vtoken::model {
namespace {

using simd::Dot;
using simd::Exp;

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void Rows(
    const CpuLinearArgs& a, int64_t o_begin, int64_t o_end) {
  const int64_t k = a.in_features, o_n = a.out_features;
  for (int64_t o = o_begin; o < o_end; ++o) {
    const float* w = a.w + o * k;
    if (o + 1 < o_end) __builtin_prefetch(w + k + 64);
    const float b = a.bias != nullptr ? a.bias[o] : 0.0f;
    for (int64_t r = 0; r < a.rows; ++r) {
      const float v = Dot(a.x + r * k, w, k) + b;
      float& y = a.y[r * o_n + o];
      y = a.accumulate ? y + v : v;
    }
  }
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

}  // namespace

void CpuRmsNorm(const float* x, const float* weight, float* y, int64_t rows, int64_t width,
                float eps) {
  RmsRows(x, weight, y, rows, width, eps);
}

void CpuSiluMul(float* gate, const float* up, int64_t n) { SiluMul(gate, up, n); }

void CpuLinear(const CpuLinearArgs& args, int64_t o_begin, int64_t o_end) {
  Rows(args, o_begin, o_end);
}

}  // namespace vtoken::model
