// Budget allocation across KV groups (per-layer and per-head eviction), separate from scoring: a
// policy scores tokens within one group; the allocation decides how many tokens each group keeps.
//   uniform   every group keeps the budget (the only choice at token granularity);
//   pyramid   PyramidKV (Cai et al. 2024): a linear schedule over layers, the first layer keeps
//             most, the last budget / beta; the layers' budgets sum to num_layers * budget;
//   adaptive  AdaKV (Feng et al. 2024): the heads of a layer share num_kv_heads * budget; after
//             per-head normalisation the highest scores across the layer's heads are kept, and
//             every head keeps at least floor * budget (AdaKV's safeguard).
// docs/WRITING_A_POLICY.md describes them with their parameters.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "lib/core/status.h"
#include "lib/core/types.h"

namespace vtoken {

enum class BudgetAllocation { kUniform, kPyramid, kAdaptive };

const char* BudgetAllocationName(BudgetAllocation allocation);
StatusOr<BudgetAllocation> ParseBudgetAllocation(std::string_view name);

// InvalidArgument when `granularity` cannot express `allocation` (pyramid needs per-layer groups,
// adaptive per-head ones); the message starts with the allocation's quoted name.
Status CheckAllocationFits(BudgetAllocation allocation, Granularity granularity);

// PyramidKV's per-layer budgets for a mean budget `budget` over `num_layers` layers: layer l gets
// b_max - (b_max - b_min) * l / (num_layers - 1) with b_min = budget / beta and
// b_max = 2 * budget - b_min: each floored (at least 1), the tokens the floors lost given one
// each to the first layers (and any the minimum of 1 added taken off the largest), so the budgets
// are non-increasing and sum to exactly num_layers * budget. REQUIRES: budget >= 1, num_layers >=
// 1, beta >= 1.
std::vector<int64_t> PyramidBudgets(int64_t budget, int32_t num_layers, double beta);

// One head's part of an adaptive (AdaKV) allocation.
struct HeadCandidates {
  std::span<const float> scores;  // Its evictable live tokens' scores (higher = keep; NaN lowest).
  int64_t kept = 0;               // Tokens it keeps outside `scores` (the protected ones).
  int64_t min_keep = 0;           // Candidates it keeps at least (AdaKV's floor).
};

// AdaKV's selection within one layer: normalises each head's scores to a distribution (shifted
// by the head's minimum, divided by their sum; +inf stays above everything, NaN below), gives
// each head its min_keep best candidates, then fills the layer's budget with the highest
// normalised scores across all heads. Returns, per head, how many of its candidates it keeps
// (its highest-scoring ones); the sum of kept and the counts is layer_budget (or every
// candidate, when there are fewer).
std::vector<int64_t> AdaptiveKeepCounts(std::span<const HeadCandidates> heads,
                                        int64_t layer_budget);

}  // namespace vtoken
