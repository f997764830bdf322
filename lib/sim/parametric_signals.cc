#include "lib/sim/parametric_signals.h"

#include <cmath>

#include "lib/sim/mix.h"

namespace vtoken::sim {
namespace {

// Key's first two rounds: one value per (seed, request, stream), hoisted out of per-token loops.
uint64_t KeyPrefix(uint64_t seed, int64_t request, uint64_t stream) {
  return Mix(Mix(seed ^ (stream * 0xd6e8feb86659fd93ULL)) ^ static_cast<uint64_t>(request));
}

inline uint64_t KeyFrom(uint64_t prefix, int64_t position, int64_t query) {
  return Mix(Mix(prefix ^ static_cast<uint64_t>(position)) ^ static_cast<uint64_t>(query));
}

uint64_t Key(uint64_t seed, int64_t request, int64_t position, int64_t query, uint64_t stream) {
  return KeyFrom(KeyPrefix(seed, request, stream), position, query);
}

// A standard normal from one 64-bit hash (Box-Muller on its two 32-bit halves).
double Normal(uint64_t h) {
  const double u1 = (static_cast<double>(h >> 32) + 0.5) / 4294967296.0;
  const double u2 = (static_cast<double>(h & 0xffffffffULL) + 0.5) / 4294967296.0;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

constexpr uint64_t kImportance = 1, kNoise = 2, kKeyNorm = 3, kGroup = 4;

}  // namespace

Status ParametricParams::Validate() const {
  const std::pair<const char*, double> non_negative[] = {
      {"sink_weight", sink_weight},           {"recency_weight", recency_weight},
      {"recency_exponent", recency_exponent}, {"importance_sigma", importance_sigma},
      {"noise_sigma", noise_sigma},           {"key_norm_rho", key_norm_rho},
      {"key_norm_sigma", key_norm_sigma},     {"group_sigma", group_sigma}};
  for (const auto& [name, v] : non_negative) {
    if (!(v >= 0) || !std::isfinite(v)) {
      return InvalidArgumentError(std::string("sim.parametric.") + name + " must be >= 0");
    }
  }
  if (!(key_norm_median > 0) || !std::isfinite(key_norm_median)) {
    return InvalidArgumentError("sim.parametric.key_norm_median must be > 0");
  }
  if (num_sinks < 0) return InvalidArgumentError("sim.parametric.num_sinks must be >= 0");
  return Status::Ok();
}

namespace {

// The standard normal quantile (Acklam's rational approximation, relative error < 1.2e-9).
double NormalQuantile(double u) {
  static constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,
                                 -2.759285104469687e+02, 1.383577518672690e+02,
                                 -3.066479806614716e+01, 2.506628277459239e+00};
  static constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02,
                                 -1.556989798598866e+02, 6.680131188771972e+01,
                                 -1.328068155288572e+01};
  static constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01,
                                 -2.400758277161838e+00, -2.549732539343734e+00,
                                 4.374664141464968e+00,  2.938163982698783e+00};
  static constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01,
                                 2.445134137142996e+00, 3.754408661907416e+00};
  if (u < 0.02425) {
    const double q = std::sqrt(-2 * std::log(u));
    return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
           ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  if (u > 1 - 0.02425) return -NormalQuantile(1 - u);
  const double q = u - 0.5, r = q * q;
  return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
         (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
}

constexpr int kNoiseLevels = 4096;

}  // namespace

ParametricSignals::ParametricSignals(const ParametricParams& params) : p_(params) {
  const double ns = p_.noise_sigma;
  noise_.resize(kNoiseLevels);
  for (int i = 0; i < kNoiseLevels; ++i) {
    const double z = NormalQuantile((i + 0.5) / kNoiseLevels);
    noise_[i] = static_cast<float>(std::exp(ns * z - 0.5 * ns * ns));
  }
  const double gs = p_.group_sigma;
  group_.resize(kNoiseLevels);
  for (int i = 0; i < kNoiseLevels; ++i) {
    const double z = NormalQuantile((i + 0.5) / kNoiseLevels);
    group_[i] = static_cast<float>(std::exp(gs * z - 0.5 * gs * gs));
  }
}

double ParametricSignals::Importance(int64_t request, int64_t position) const {
  const double s = p_.importance_sigma;
  return std::exp(s * Normal(Key(p_.seed, request, position, 0, kImportance)) - 0.5 * s * s);
}

const ParametricSignals::TokenTables& ParametricSignals::TablesFor(int64_t request,
                                                                   int64_t max_position) {
  TokenTables& t = tokens_[request];
  for (int64_t pos = static_cast<int64_t>(t.importance.size()); pos <= max_position; ++pos) {
    const double w = Importance(request, pos);
    t.importance.push_back(static_cast<float>(w));
    t.key_norm.push_back(static_cast<float>(
        p_.key_norm_median * std::pow(w, -p_.key_norm_rho) *
        std::exp(p_.key_norm_sigma * Normal(Key(p_.seed, request, pos, 0, kKeyNorm)))));
  }
  return t;
}

StatusOr<int32_t> ParametricSignals::Fill(const SignalQuery& q, std::span<float> attn,
                                          std::span<float> key_norm) {
  const size_t n = q.positions.size();
  if (n == 0) return -1;
  const int64_t query = q.positions[n - 1];
  const TokenTables& t = TablesFor(q.request, query);
  for (int64_t d = static_cast<int64_t>(recency_.size()); d <= query; ++d) {
    recency_.push_back(static_cast<float>(
        p_.recency_weight * std::pow(1.0 + static_cast<double>(d), -p_.recency_exponent)));
  }
  const uint64_t group_key = KeyPrefix(p_.seed, q.request, kGroup);
  const uint64_t noise_key = KeyPrefix(p_.seed, q.request, kNoise);
  double total = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t pos = q.positions[i];
    float w = t.importance[pos];
    if (q.num_groups > 1) w *= group_[KeyFrom(group_key, pos, q.group) >> 52];
    float s = w + recency_[query - pos];
    if (pos < p_.num_sinks) s += static_cast<float>(p_.sink_weight);
    s *= noise_[KeyFrom(noise_key, pos, query) >> 52];
    attn[i] = s;
    total += s;
    key_norm[i] = t.key_norm[pos];
  }
  const float inv = static_cast<float>(1.0 / total);
  for (size_t i = 0; i < n; ++i) attn[i] *= inv;
  return -1;
}

std::string ParametricSignals::Describe() const {
  return "parametric" + (p_.fitted_on.empty() ? std::string() : " (" + p_.fitted_on + ")");
}

}  // namespace vtoken::sim

namespace vtoken::sim {

// `vtoken-cli fit-signals` on the trace of experiments/quickstart.toml with 24 requests, naive
// mode and keep_ratio 1.0 (full contexts, so the fit sees every token, not only H2O's survivors):
// docs/SIMULATION.md has the commands. vt-tiny has no attention sink (position 0 gets 0.39 of a
// uniform share) and attends mostly to its most recent tokens.
ParametricParams VtTinyFit() {
  ParametricParams p;
  p.num_sinks = 0;
  p.sink_weight = 0;
  p.recency_weight = 732.5;
  p.recency_exponent = 1.389;
  p.importance_sigma = 0.3092;
  p.noise_sigma = 0.569;
  p.key_norm_median = 8.108;
  p.key_norm_rho = 0.2571;
  p.key_norm_sigma = 0.1348;
  p.fitted_on = "fitted on vt-tiny";
  return p;
}

}  // namespace vtoken::sim
