#include "lib/engine/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace vtoken::engine {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Removes NaNs and sorts ascending.
void SortValid(std::vector<double>& values) {
  std::erase_if(values, [](double v) { return std::isnan(v); });
  std::sort(values.begin(), values.end());
}

// REQUIRES: `sorted` is ascending, non-empty, NaN-free; p in [0, 100].
double PercentileOfSorted(const std::vector<double>& sorted, double p) {
  const double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

}  // namespace

double Percentile(std::vector<double> values, double p) {
  if (!(p >= 0.0 && p <= 100.0)) return kNaN;
  SortValid(values);
  if (values.empty()) return kNaN;
  return PercentileOfSorted(values, p);
}

double Mean(const std::vector<double>& values) {
  double sum = 0.0;
  int64_t count = 0;
  for (double v : values) {
    if (std::isnan(v)) continue;
    sum += v;
    ++count;
  }
  return count == 0 ? kNaN : sum / static_cast<double>(count);
}

LatencySummary Summarize(std::vector<double> values) {
  SortValid(values);
  LatencySummary s;
  s.count = static_cast<int64_t>(values.size());
  if (values.empty()) {
    s.mean = s.p50 = s.p95 = s.p99 = s.max = kNaN;
    return s;
  }
  s.mean = Mean(values);
  s.p50 = PercentileOfSorted(values, 50.0);
  s.p95 = PercentileOfSorted(values, 95.0);
  s.p99 = PercentileOfSorted(values, 99.0);
  s.max = values.back();
  return s;
}

double StudentT975(int64_t df) {
  static constexpr double kTable[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306,
                                      2.262,  2.228, 2.201, 2.179, 2.160, 2.145, 2.131, 2.120,
                                      2.110,  2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
                                      2.060,  2.056, 2.052, 2.048, 2.045, 2.042};
  if (df < 1) return std::numeric_limits<double>::quiet_NaN();
  if (df <= 30) return kTable[df - 1];
  // Beyond 30: t ~ z + (z^3 + z) / (4 df), z = 1.95996 (first term of the Cornish-Fisher series).
  const double z = 1.959964;
  return z + (z * z * z + z) / (4.0 * static_cast<double>(df));
}

MeanCi MeanCi95(const std::vector<double>& values) {
  MeanCi r;
  double sum = 0;
  for (double v : values) {
    if (std::isnan(v)) continue;
    sum += v;
    ++r.count;
  }
  if (r.count == 0) {
    r.mean = r.half_width = std::numeric_limits<double>::quiet_NaN();
    return r;
  }
  r.mean = sum / static_cast<double>(r.count);
  if (r.count < 2) {
    r.half_width = std::numeric_limits<double>::quiet_NaN();
    return r;
  }
  double ss = 0;
  for (double v : values) {
    if (!std::isnan(v)) ss += (v - r.mean) * (v - r.mean);
  }
  const double sd = std::sqrt(ss / static_cast<double>(r.count - 1));
  r.half_width = StudentT975(r.count - 1) * sd / std::sqrt(static_cast<double>(r.count));
  return r;
}

}  // namespace vtoken::engine
