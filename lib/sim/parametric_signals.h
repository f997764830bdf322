// ParametricSignals: a generative model of the attention a decoder pays to its KV tokens, for
// simulated runs without a trace. For a query at position q and a live token at position p
// (distance d = q - p), the token's score is
//   s = sink_weight * [p < num_sinks]                       attention sinks
//     + recency_weight * (1 + d)^(-recency_exponent)        recency profile
//     + w_p                                                  persistent importance
// where w_p = exp(importance_sigma * z_p - importance_sigma^2 / 2) (lognormal, mean 1; heavy
// hitters are its tail) is drawn once per (request, position) when the token is written. Each
// step multiplies the score by lognormal noise exp(noise_sigma * z - noise_sigma^2 / 2), drawn per
// (request, position, query position), and the masses are the scores normalised to sum 1. A
// prefill step is modelled from its last query. The key norm is anti-correlated with importance:
//   key_norm = key_norm_median * w_p^(-key_norm_rho) * exp(key_norm_sigma * z'_p).
// Every random draw is a counter-based hash of (seed, request, position[, query]), so the signals
// are the same whatever the batch, the mode or the order of calls. Per token and step the cost is
// one hash and three table lookups: importance and key norm are computed once per token (a
// per-request table grown with the positions, so no allocation per token), the recency profile
// once per distance, and the step noise is read from a 4,096-entry table of the lognormal's
// quantiles (its tails end at the 1/8,192 quantile, +-3.5 sigma).
//
// FitParametric (fit.h) estimates these parameters from a trace; kVtTinyFit holds the ones
// fitted on vt-tiny traces that the experiments use by default.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "lib/sim/signal_source.h"

namespace vtoken::sim {

struct ParametricParams {
  int64_t num_sinks = 1;
  double sink_weight = 0;
  double recency_weight = 0;
  double recency_exponent = 1;
  double importance_sigma = 1;
  double noise_sigma = 0.3;
  double key_norm_median = 1;
  double key_norm_rho = 0;
  double key_norm_sigma = 0.1;
  uint64_t seed = 1;
  // Per-layer / per-head runs: a group's importance of a token is the token's importance times a
  // persistent lognormal factor of (token, group) with this sigma, so groups agree on the
  // token-level trend and differ per head. An assumption, not fitted (traces are token-level).
  double group_sigma = 1.0;
  std::string fitted_on;  // Where the values come from, for labels ("vt-tiny trace ...").

  // InvalidArgument naming the first parameter out of range (negative weights or sigmas,
  // num_sinks < 0).
  Status Validate() const;
};

// The parameters fitted on vt-tiny traces (docs/SIMULATION.md gives the command).
ParametricParams VtTinyFit();

class ParametricSignals final : public SignalSource {
 public:
  explicit ParametricSignals(const ParametricParams& params);

  StatusOr<int32_t> Fill(const SignalQuery& query, std::span<float> attn,
                         std::span<float> key_norm) override;
  void BeginRun(const std::string&) override { tokens_.clear(); }
  std::string Describe() const override;

  // The persistent importance w of a token (exposed for tests and the fit report).
  double Importance(int64_t request, int64_t position) const;

 private:
  struct TokenTables {
    std::vector<float> importance;  // By position.
    std::vector<float> key_norm;
  };
  const TokenTables& TablesFor(int64_t request, int64_t max_position);

  ParametricParams p_;
  std::vector<float> noise_;    // Lognormal noise factors at 4,096 quantiles.
  std::vector<float> group_;    // Lognormal group factors (group_sigma) at 4,096 quantiles.
  std::vector<float> recency_;  // By distance, grown on demand.
  std::unordered_map<int64_t, TokenTables> tokens_;
};

}  // namespace vtoken::sim
