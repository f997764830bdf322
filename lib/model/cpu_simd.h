// Inline fp32 helpers shared by the CPU kernels (cpu_paged_attention.cc, cpu_ops.cc). They are
// always inlined, so each target clone of a kernel compiles them for its own instruction set;
// reductions vectorize through `omp simd` (the kernels' files are built with -fopenmp-simd, no
// OpenMP runtime), the rest as plain loops. Internal to lib/model.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

#define VTOKEN_INLINE inline __attribute__((always_inline))

namespace vtoken::model::simd {

VTOKEN_INLINE float Dot(const float* a, const float* b, int64_t n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

VTOKEN_INLINE float Sum(const float* a, int64_t n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i];
  return s;
}

VTOKEN_INLINE float Max(const float* a, int64_t n) {
  float m = a[0];
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = std::max(m, a[i]);
  return m;
}

VTOKEN_INLINE void Axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// exp(x) for x clamped to [-87, 88]: Cephes' expf polynomial after reducing by ln 2, within
// 2 ulp of std::exp, branch-free so that loops over it vectorize.
VTOKEN_INLINE float Exp(float x) {
  const float v = std::clamp(x, -87.0f, 88.0f);
  const float t = v * 1.44269504088896341f;
  const float k = (t + 12582912.0f) - 12582912.0f;  // Round to nearest (|t| < 2^22).
  const float r = (v - k * 0.693359375f) - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * std::bit_cast<float>((static_cast<int32_t>(k) + 127) << 23);
}

}  // namespace vtoken::model::simd
