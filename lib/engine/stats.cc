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

}  // namespace vtoken::engine
