#include "lib/sim/fit.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>

namespace vtoken::sim {
namespace {

constexpr int64_t kSinkScan = 16;    // Positions examined as sink candidates.
constexpr int64_t kProtectSink = 4;  // H2O protection in the overlap check (the defaults).
constexpr int64_t kProtectRecent = 32;

int BinOf(int64_t d) {  // 0..3 exact, then 4 bins per doubling.
  if (d < 4) return static_cast<int>(d);
  return 4 + static_cast<int>(std::floor(4.0 * std::log2(static_cast<double>(d) / 4.0)));
}

// Indices H2O keeps from a prefill step's signals.
std::vector<size_t> H2oKeep(const std::vector<float>& attn, double keep_ratio) {
  const size_t n = attn.size();
  const size_t budget =
      std::max<size_t>(1, static_cast<size_t>(keep_ratio * static_cast<double>(n)));
  std::vector<size_t> keep, rest;
  for (size_t i = 0; i < n; ++i) {
    const bool protect = i < kProtectSink || i + kProtectRecent >= n;
    (protect ? keep : rest).push_back(i);
  }
  if (keep.size() >= budget) {
    keep.resize(budget);
    return keep;
  }
  std::stable_sort(rest.begin(), rest.end(), [&](size_t a, size_t b) { return attn[a] > attn[b]; });
  keep.insert(keep.end(), rest.begin(), rest.begin() + (budget - keep.size()));
  std::sort(keep.begin(), keep.end());
  return keep;
}

struct Moments {
  double n = 0, sum = 0, sq = 0;
  void Add(double x) {
    n += 1;
    sum += x;
    sq += x * x;
  }
  double mean() const { return n > 0 ? sum / n : 0; }
  double var() const { return n > 1 ? std::max(0.0, (sq - sum * sum / n) / (n - 1)) : 0; }
};

}  // namespace

StatusOr<FitResult> FitParametric(const SignalTrace& trace, const std::string& mode) {
  FitResult fit;
  std::vector<const SignalRecord*> decode, prefill;
  std::map<int64_t, bool> seen_request;
  for (const SignalRecord& r : trace.records) {
    if (!mode.empty() && r.mode != mode) continue;
    if (r.num_new == 1 && r.positions.size() > 1) {
      decode.push_back(&r);
    } else if (!seen_request[r.request]) {
      prefill.push_back(&r);
    }
    seen_request[r.request] = true;
  }
  fit.decode_records = static_cast<int64_t>(decode.size());
  if (decode.size() < 10) {
    return FailedPreconditionError("the trace has " + std::to_string(decode.size()) +
                                   " decode steps; fitting needs at least 10");
  }
  // Far distance: the 75th percentile of all distances.
  std::vector<int64_t> distances;
  for (const SignalRecord* r : decode) {
    for (int32_t p : r->positions) distances.push_back(r->positions.back() - p);
  }
  std::nth_element(distances.begin(), distances.begin() + distances.size() * 3 / 4,
                   distances.end());
  const int64_t far = std::max<int64_t>(8, distances[distances.size() * 3 / 4]);
  fit.observations = static_cast<int64_t>(distances.size());

  std::map<int, Moments> bins;
  std::map<int, Moments> bin_d;
  std::vector<Moments> sink(kSinkScan);
  Moments far_rho;
  for (const SignalRecord* r : decode) {
    const double n = static_cast<double>(r->positions.size());
    const int64_t q = r->positions.back();
    for (size_t i = 0; i < r->positions.size(); ++i) {
      const int64_t p = r->positions[i];
      const double rho = r->attn[i] * n;
      if (p < kSinkScan) sink[p].Add(rho);
      if (p < kSinkScan) continue;
      const int64_t d = q - p;
      bins[BinOf(d)].Add(rho);
      bin_d[BinOf(d)].Add(static_cast<double>(d));
      if (d >= far) far_rho.Add(rho);
    }
  }
  if (far_rho.n < 1 || !(far_rho.mean() > 0)) {
    return FailedPreconditionError("the trace has no tokens far from their query to fit");
  }
  const double score_mean = 1.0 / far_rho.mean();
  for (const Moments& m : sink) fit.leading.push_back(m.mean());
  ParametricParams& p = fit.params;
  // Sinks: the leading run of positions with rho above 3x the far level.
  p.num_sinks = 0;
  while (p.num_sinks < kSinkScan && sink[p.num_sinks].n > 0 &&
         sink[p.num_sinks].mean() > 3 * far_rho.mean()) {
    ++p.num_sinks;
  }
  // Recency: least squares of log(g S - 1) on log(1 + d), near bins only.
  double sx = 0, sy = 0, sxx = 0, sxy = 0, m = 0;
  for (const auto& [bin, mo] : bins) {
    const double d = bin_d[bin].mean();
    fit.profile.push_back({d, mo.mean()});
    const double excess = mo.mean() * score_mean - 1;
    if (d >= static_cast<double>(far) || excess <= 0.05 || mo.n < 5) continue;
    const double x = std::log1p(d), y = std::log(excess);
    sx += x, sy += y, sxx += x * x, sxy += x * y, m += 1;
  }
  if (m >= 2 && sxx * m - sx * sx > 0) {
    const double slope = (m * sxy - sx * sy) / (m * sxx - sx * sx);
    p.recency_exponent = std::max(0.0, -slope);
    p.recency_weight = std::exp((sy - slope * sx) / m);
  } else {
    p.recency_exponent = 1;
    p.recency_weight = 0;
  }
  auto recency = [&](double d) { return p.recency_weight * std::pow(1 + d, -p.recency_exponent); };
  Moments sink_excess;
  for (int64_t s = 0; s < p.num_sinks; ++s) sink_excess.Add(sink[s].mean() * score_mean - 1);
  p.sink_weight = std::max(0.0, sink_excess.mean());

  // Importance and noise from far tokens, per (request, position).
  std::map<std::pair<int64_t, int32_t>, Moments> per_token;
  std::map<std::pair<int64_t, int32_t>, Moments> per_token_kn;
  for (const SignalRecord* r : decode) {
    const double n = static_cast<double>(r->positions.size());
    const int64_t q = r->positions.back();
    for (size_t i = 0; i < r->positions.size(); ++i) {
      const int64_t d = q - r->positions[i];
      if (r->positions[i] < kSinkScan || d < far) continue;
      const double v = r->attn[i] * n * score_mean - recency(static_cast<double>(d));
      if (!(v > 0) || !(r->key_norm[i] > 0)) continue;
      per_token[{r->request, r->positions[i]}].Add(std::log(v));
      per_token_kn[{r->request, r->positions[i]}].Add(std::log(r->key_norm[i]));
    }
  }
  Moments within, between, steps;
  double kx = 0, ky = 0, kxx = 0, kxy = 0, kyy = 0, km = 0;
  for (const auto& [key, mo] : per_token) {
    if (mo.n < 3) continue;
    within.Add(mo.var());
    between.Add(mo.mean());
    steps.Add(mo.n);
    const double x = mo.mean(), y = per_token_kn[key].mean();
    kx += x, ky += y, kxx += x * x, kxy += x * y, kyy += y * y, km += 1;
  }
  p.noise_sigma = std::sqrt(within.mean());
  p.importance_sigma =
      std::sqrt(std::max(0.0, between.var() - within.mean() / std::max(1.0, steps.mean())));
  if (km >= 2 && kxx * km - kx * kx > 0) {
    const double slope = (km * kxy - kx * ky) / (km * kxx - kx * kx);
    p.key_norm_rho = std::max(0.0, -slope);
    // log kn = log median - rho * log w: the median follows from the means of both sides.
    p.key_norm_median = std::exp(ky / km + p.key_norm_rho * (kx / km));
    const double resid = (kyy - ky * ky / km) - slope * (kxy - kx * ky / km);
    p.key_norm_sigma = std::sqrt(std::max(0.0, resid / std::max(1.0, km - 2)));
  }

  // Overlap of H2O's prefill keep sets, trace vs fitted model.
  ParametricSignals model(p);
  for (double ratio : {0.1, 0.25, 0.5}) {
    FitOverlap o{.keep_ratio = ratio};
    for (const SignalRecord* r : prefill) {
      const size_t n = r->positions.size();
      if (n < 2 * (kProtectSink + kProtectRecent)) continue;
      std::vector<int64_t> pos(r->positions.begin(), r->positions.end());
      std::vector<float> attn(n), kn(n);
      model.Fill({.request = r->request, .positions = pos, .num_new = r->num_new}, attn, kn)
          .status()
          .IgnoreError();  // The parametric model always answers.
      const std::vector<size_t> a = H2oKeep(r->attn, ratio), b = H2oKeep(attn, ratio);
      std::vector<size_t> both;
      std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
      o.overlap_fitted += static_cast<double>(both.size()) / static_cast<double>(a.size());
      const double budget = static_cast<double>(a.size());
      const double prot = std::min(budget, static_cast<double>(kProtectSink + kProtectRecent));
      const double free = budget - prot, pool = static_cast<double>(n) - prot;
      o.overlap_random += (prot + free * free / pool) / budget;
      ++o.requests;
    }
    if (o.requests > 0) {
      o.overlap_fitted /= static_cast<double>(o.requests);
      o.overlap_random /= static_cast<double>(o.requests);
    }
    fit.overlaps.push_back(o);
  }
  return fit;
}

std::string FitResult::Report() const {
  const ParametricParams& p = params;
  char buf[1024];
  std::string out;
  std::snprintf(buf, sizeof(buf),
                "fitted on %lld decode steps (%lld token observations)\n"
                "  num_sinks = %lld\n  sink_weight = %.4g\n  recency_weight = %.4g\n"
                "  recency_exponent = %.4g\n  importance_sigma = %.4g\n  noise_sigma = %.4g\n"
                "  key_norm_median = %.4g\n  key_norm_rho = %.4g\n  key_norm_sigma = %.4g\n",
                static_cast<long long>(decode_records), static_cast<long long>(observations),
                static_cast<long long>(p.num_sinks), p.sink_weight, p.recency_weight,
                p.recency_exponent, p.importance_sigma, p.noise_sigma, p.key_norm_median,
                p.key_norm_rho, p.key_norm_sigma);
  out += buf;
  out += "recency profile (distance: mean attention relative to a uniform share)\n ";
  for (const auto& [d, g] : profile) {
    std::snprintf(buf, sizeof(buf), " %.0f:%.3g", d, g);
    out += buf;
  }
  out += "\nleading positions (position: mean attention relative to a uniform share)\n ";
  for (size_t i = 0; i < leading.size(); ++i) {
    std::snprintf(buf, sizeof(buf), " %zu:%.3g", i, leading[i]);
    out += buf;
  }
  out += "\nH2O prefill keep set, trace vs fitted model (overlap |A n B| / |A|)\n";
  for (const FitOverlap& o : overlaps) {
    std::snprintf(
        buf, sizeof(buf), "  keep_ratio %.2f: fitted %.3f, random choice %.3f (%lld requests)\n",
        o.keep_ratio, o.overlap_fitted, o.overlap_random, static_cast<long long>(o.requests));
    out += buf;
  }
  return out;
}

}  // namespace vtoken::sim
