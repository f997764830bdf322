// Fitting ParametricSignals to a recorded trace (`vtoken-cli fit-signals TRACE`), and judging
// the fit by what a policy does with it.
//
// The fit uses the trace's decode steps (one new token), in relative units rho = attn * n (1 is a
// uniform share of the step's n tokens):
//   - the recency profile g(d) = mean rho of non-sink tokens at distance d (log-spaced bins); far
//     tokens (the top quarter of distances) give the mean score S = 1 / g(far), and
//     recency_weight * (1 + d)^(-recency_exponent) = g(d) * S - 1 is fitted in log-log space;
//   - sinks: the leading positions whose mean rho exceeds 3x g(far); sink_weight from their
//     excess;
//   - importance: far tokens' log(rho * S) per token; the spread of the per-token means is
//     importance_sigma (after removing the noise's share), the spread within a token over steps
//     is noise_sigma;
//   - key norm: a log-log regression of the tokens' key norms on their importance.
// The check: at each request's prefill step (where H2O makes its first and largest eviction),
// the set H2O keeps (sinks and recent tokens protected, then the highest attention) under the
// trace's signals vs under the fitted model's, at three budgets; reported as the overlap
// |A n B| / |A| beside what a random choice of the unprotected tokens would give.
#pragma once

#include <string>
#include <vector>

#include "lib/sim/parametric_signals.h"
#include "lib/sim/signal_trace.h"

namespace vtoken::sim {

struct FitOverlap {
  double keep_ratio = 0;
  double overlap_fitted = 0;  // Mean over requests.
  double overlap_random = 0;  // Expected overlap of a random choice, same protection.
  int64_t requests = 0;
};

struct FitResult {
  ParametricParams params;
  int64_t decode_records = 0;
  int64_t observations = 0;
  std::vector<std::pair<double, double>> profile;  // (distance, g) bins.
  std::vector<double> leading;                     // Mean rho of positions 0, 1, 2, ...
  std::vector<FitOverlap> overlaps;
  std::string Report() const;  // Multi-line text: parameters, profile, overlaps.
};

// FailedPrecondition when the trace has too few decode steps to fit (< 10) or no far tokens.
StatusOr<FitResult> FitParametric(const SignalTrace& trace, const std::string& mode = "");

}  // namespace vtoken::sim
