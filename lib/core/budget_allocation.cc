#include "lib/core/budget_allocation.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

namespace vtoken {

const char* BudgetAllocationName(BudgetAllocation allocation) {
  switch (allocation) {
    case BudgetAllocation::kUniform:
      return "uniform";
    case BudgetAllocation::kPyramid:
      return "pyramid";
    case BudgetAllocation::kAdaptive:
      return "adaptive";
  }
  return "unknown";
}

StatusOr<BudgetAllocation> ParseBudgetAllocation(std::string_view name) {
  if (name == "uniform") return BudgetAllocation::kUniform;
  if (name == "pyramid") return BudgetAllocation::kPyramid;
  if (name == "adaptive") return BudgetAllocation::kAdaptive;
  return InvalidArgumentError("unknown budget allocation '" + std::string(name) +
                              "' (expected uniform, pyramid or adaptive)");
}

Status CheckAllocationFits(BudgetAllocation allocation, Granularity granularity) {
  if (allocation == BudgetAllocation::kPyramid && granularity == Granularity::kToken) {
    return InvalidArgumentError(
        "\"pyramid\" gives each layer its own budget: it needs cache.granularity \"layer\" or "
        "\"head\"");
  }
  if (allocation == BudgetAllocation::kAdaptive && granularity != Granularity::kHead) {
    return InvalidArgumentError(
        "\"adaptive\" shares a layer's budget across its KV heads: it needs cache.granularity "
        "\"head\"");
  }
  return Status::Ok();
}

std::vector<int64_t> PyramidBudgets(int64_t budget, int32_t num_layers, double beta) {
  std::vector<int64_t> out(static_cast<size_t>(num_layers), budget);
  if (num_layers == 1) return out;
  const double b_min = static_cast<double>(budget) / beta;
  const double b_max = 2.0 * static_cast<double>(budget) - b_min;
  // Floors of the (decreasing) schedule, at least 1; the tokens the floors lost go one each to
  // the first layers, and tokens the minimum of 1 added come off the last of the largest layers:
  // both keep the budgets non-increasing and their sum exactly num_layers * budget.
  int64_t left = budget * num_layers;
  for (int32_t l = 0; l < num_layers; ++l) {
    const double b = b_max - (b_max - b_min) * l / (num_layers - 1);
    out[l] = std::max<int64_t>(1, static_cast<int64_t>(std::floor(b)));
    left -= out[l];
  }
  for (int32_t l = 0; left > 0; l = (l + 1) % num_layers, --left) ++out[l];
  while (left < 0) {
    int32_t last_max = 0;
    for (int32_t l = 1; l < num_layers; ++l) {
      if (out[l] >= out[last_max]) last_max = l;
    }
    if (out[last_max] <= 1) break;  // budget >= 1 per layer: cannot happen.
    --out[last_max];
    ++left;
  }
  return out;
}

std::vector<int64_t> AdaptiveKeepCounts(std::span<const HeadCandidates> heads,
                                        int64_t layer_budget) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  struct Entry {
    double score;
    size_t head;
  };
  std::vector<int64_t> keep(heads.size(), 0);
  std::vector<Entry> pool;  // Candidates left after every head took its floor.
  int64_t left = layer_budget;
  for (size_t h = 0; h < heads.size(); ++h) {
    const std::span<const float> s = heads[h].scores;
    float lo = std::numeric_limits<float>::infinity();
    double sum = 0;
    for (float x : s) lo = std::isfinite(x) ? std::min(lo, x) : lo;
    for (float x : s) sum += std::isfinite(x) ? x - lo : 0.0;
    std::vector<double> norm;
    for (float x : s) {
      const double uniform = 1.0 / static_cast<double>(s.size());
      norm.push_back(std::isnan(x)       ? -kInf
                     : !std::isfinite(x) ? x
                     : sum > 0           ? (x - lo) / sum
                                         : uniform);
    }
    std::sort(norm.begin(), norm.end(), std::greater<>());
    keep[h] = std::clamp<int64_t>(heads[h].min_keep, 0, static_cast<int64_t>(norm.size()));
    left -= heads[h].kept + keep[h];
    for (size_t i = static_cast<size_t>(keep[h]); i < norm.size(); ++i)
      pool.push_back({norm[i], h});
  }
  left = std::clamp<int64_t>(left, 0, static_cast<int64_t>(pool.size()));
  // Ties go to the head listed first (stable).
  std::stable_sort(pool.begin(), pool.end(),
                   [](const Entry& a, const Entry& b) { return a.score > b.score; });
  for (int64_t i = 0; i < left; ++i) ++keep[pool[i].head];
  return keep;
}

}  // namespace vtoken
