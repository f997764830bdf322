// Arrivals: when each request of a workload reaches the engine (WorkloadOptions::arrival): all at
// t = 0, or after exponential (poisson) or gamma-distributed gaps of mean 1 / rate, drawn from
// WorkloadStream::kArrivals whatever the kind, so the prompts do not change with the arrivals.
//
// Thread-safe: pure functions.
#pragma once

#include <vector>

#include "lib/engine/workload.h"

namespace vtoken::engine {

// Sets every request's arrival_s, in order: the first at 0, each next one a gap later.
// REQUIRES: ValidateWorkloadOptions(o).ok().
void AssignArrivals(const WorkloadOptions& o, std::vector<Request>& requests);

}  // namespace vtoken::engine
