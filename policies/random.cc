// Random: the baseline every eviction paper compares against.
// Rule: keep a uniformly random subset of the tokens; the draws come from the sequence's seeded
// PolicyRng, so a run is reproducible from its seed.
// Defaults: no parameters.
#include "lib/core/policy.h"

namespace vtoken {
namespace {

class Random final : public Policy {
 public:
  uint8_t signals() const override { return 0; }
  void Score(std::span<const TokenView>, PolicyContext& ctx,
             std::span<float> scores) const override {
    for (float& score : scores) score = static_cast<float>(ctx.rng.Uniform());
  }
};

}  // namespace

VTOKEN_REGISTER_POLICY(Random, "random", "keep a uniformly random subset (seeded)");

}  // namespace vtoken
