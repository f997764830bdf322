// Summary statistics of per-request latencies (TTFT, TPOT, E2E) as docs/METRICS.md defines them.
//
// Percentiles interpolate linearly between closest ranks, as numpy.percentile's default
// ("linear") method: for sorted values a[0..n-1], rank = p / 100 * (n - 1) and the result is
// a[floor(rank)] + (a[ceil(rank)] - a[floor(rank)]) * (rank - floor(rank)).
//
// Missing values: NaN entries (e.g. the TTFT of a request that never produced a token) are
// dropped before anything is computed. A statistic of no values is NaN, so it is stored and
// printed as "no data" instead of as a misleading 0.
//
// Pure functions; safe to call concurrently.
#pragma once

#include <cstdint>
#include <vector>

namespace vtoken::engine {

// Returns the p-th percentile (p in [0, 100]) of the non-NaN `values`, or NaN when there are none
// or p is outside [0, 100] or NaN.
double Percentile(std::vector<double> values, double p);

// Returns the arithmetic mean of the non-NaN `values`, or NaN when there are none.
double Mean(const std::vector<double>& values);

struct LatencySummary {
  int64_t count = 0;  // number of non-NaN values
  // NaN when count == 0.
  double mean = 0.0;
  double p50 = 0.0;
  double p95 = 0.0;
  double p99 = 0.0;
  double max = 0.0;
};

// Returns count, mean, p50, p95, p99 and max of the non-NaN `values` (one sort).
LatencySummary Summarize(std::vector<double> values);

// The mean of repeated measurements (one per seed) with the half-width of its two-sided 95%
// confidence interval from Student's t-distribution: t(0.975, n - 1) * s / sqrt(n), s the sample
// standard deviation. NaN entries are dropped; half_width is NaN for fewer than 2 values.
struct MeanCi {
  int64_t count = 0;
  double mean = 0.0;
  double half_width = 0.0;
};
MeanCi MeanCi95(const std::vector<double>& values);

// t(0.975, df): the two-sided 95% critical value of Student's t with df >= 1 degrees of freedom
// (the 3-digit table to df = 30, then z + (z^3 + z) / (4 df), within 0.2% of the exact value);
// NaN for df < 1.
double StudentT975(int64_t df);

}  // namespace vtoken::engine
