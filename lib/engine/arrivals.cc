#include "lib/engine/arrivals.h"

#include "lib/engine/rng.h"

namespace vtoken::engine {

void AssignArrivals(const WorkloadOptions& o, std::vector<Request>& requests) {
  Rng rng(o.seed, static_cast<uint64_t>(WorkloadStream::kArrivals));
  const double mean_gap = 1.0 / o.rate;
  const double shape = 1.0 / (o.gamma_cv * o.gamma_cv);
  double t = 0.0;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (i > 0 && o.arrival == "poisson") t += rng.Exponential(mean_gap);
    if (i > 0 && o.arrival == "gamma") t += rng.Gamma(shape, mean_gap / shape);
    requests[i].arrival_s = t;
  }
}

}  // namespace vtoken::engine
