// FastExp: exp(x) in float for loops that must vectorise (softmaxes in the CPU attention kernels
// and in token signals). Cephes' expf polynomial after reducing by ln 2, x clamped to [-87, 88],
// within 2 ulp of std::exp; branch-free and inline, so a loop over it compiles to vector code.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

namespace vtoken {

inline float FastExp(float x) {
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

}  // namespace vtoken
