// ExpectedAttention: Devoto et al., "Expected Attention: KV Cache Compression by Estimating
// Attention from Future Queries Distribution", 2025 (kvpress's ExpectedAttentionPress).
// Rule: keep the tokens that future queries are expected to attend most, weighted by their
// value norms: evict the lowest expected_attention (the relative token signal over the live
// tokens at each eviction, from the runner's statistics of the sequence's queries). Reads no
// attention, so the model computes none for it.
#include "lib/core/policy.h"

namespace vtoken {
namespace {

class ExpectedAttention final : public Policy {
 public:
  explicit ExpectedAttention(const PolicyParams& /*params*/) {}

  uint8_t signals() const override { return 0; }
  std::vector<std::string> token_signals() const override { return {"expected_attention"}; }
  void Score(std::span<const TokenView> tokens, PolicyContext& /*ctx*/,
             std::span<float> scores) const override {
    for (size_t i = 0; i < tokens.size(); ++i) scores[i] = tokens[i].token_signals[0];
  }
};

}  // namespace

VTOKEN_REGISTER_POLICY(ExpectedAttention, "expected_attention",
                       "evict the lowest attention expected from the queries' statistics x |v|");

}  // namespace vtoken
