// Request lengths: the input and output token counts of the synthetic kinds, drawn from their
// distributions (sharegpt_like: lognormal; longbench_like: uniform), and the proportional cut
// that fits a request into max_total_tokens (every kind that has lengths to cut uses it).
//
// Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "lib/engine/workload_options.h"

namespace vtoken::engine {

struct Lengths {
  int64_t input = 0;
  int64_t output = 0;
};

// Scales input and output down proportionally so they sum to max_total (if they exceed it),
// keeping both at least 1. REQUIRES: max_total == 0 or >= 2.
Lengths ClampToTotal(Lengths l, int64_t max_total);

// The lengths of the options.num_requests requests of a synthetic kind, each cut to
// max_total_tokens; drawn from WorkloadStream::kLengths.
// REQUIRES: ValidateWorkloadOptions(o).ok(), o.kind sharegpt_like or longbench_like.
std::vector<Lengths> SampleLengths(const WorkloadOptions& o);

}  // namespace vtoken::engine
