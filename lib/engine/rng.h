// Rng: the engine's deterministic random numbers (workloads, task instances). xoshiro256**
// (Blackman & Vigna) seeded through SplitMix64, with hand-written transforms instead of <random>'s
// distributions, whose output differs between standard libraries: a seed means the same draws on
// every platform. `stream` derives independent streams from one seed.
//
// Not thread-safe: one Rng per thread.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>

#include "lib/core/mix.h"

namespace vtoken::engine {

class Rng {
 public:
  Rng(uint64_t seed, uint64_t stream) {
    uint64_t x = seed ^ (stream * 0xD1B54A32D192ED03ull);
    for (uint64_t& word : s_) word = SplitMix64(x);
  }

  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1), 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Uniform in (0, 1]: safe to take the log of.
  double UniformPositive() { return 1.0 - Uniform(); }

  // Uniform integer in [lo, hi]; rejection sampling keeps it unbiased.
  int64_t UniformInt(int64_t lo, int64_t hi) {
    const uint64_t range = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) + 1;
    if (range == 0) return static_cast<int64_t>(Next());  // the full 64-bit range
    const uint64_t limit = std::numeric_limits<uint64_t>::max() / range * range;
    uint64_t x;
    do {
      x = Next();
    } while (x >= limit);
    return lo + static_cast<int64_t>(x % range);
  }

  // Standard normal (Box-Muller, one value per call).
  double Normal() {
    const double r = std::sqrt(-2.0 * std::log(UniformPositive()));
    return r * std::cos(2.0 * std::numbers::pi * Uniform());
  }

  double Exponential(double mean) { return -mean * std::log(UniformPositive()); }

  // Gamma(shape, scale) by Marsaglia & Tsang; shape < 1 through Gamma(shape + 1) * U^(1/shape).
  double Gamma(double shape, double scale) {
    if (shape < 1.0) {
      return Gamma(shape + 1.0, scale) * std::pow(UniformPositive(), 1.0 / shape);
    }
    const double d = shape - 1.0 / 3.0;
    const double c = 1.0 / std::sqrt(9.0 * d);
    while (true) {
      const double x = Normal();
      double v = 1.0 + c * x;
      if (v <= 0.0) continue;
      v = v * v * v;
      const double u = UniformPositive();
      if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return d * v * scale;
    }
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace vtoken::engine
