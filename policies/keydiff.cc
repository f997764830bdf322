// KeyDiff: Park et al., "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM
// Inference in Resource-Constrained Environments", 2025 (kvpress's KeyDiffPress).
// Rule: keep the tokens whose keys differ most from the rest: evict the highest cosine of the
// key to the mean unit key of the live tokens (the relative token signal key_anchor_cosine,
// taken over the group's live tokens at each eviction). Query-agnostic: it reads no attention.
#include "lib/core/policy.h"

namespace vtoken {
namespace {

class KeyDiff final : public Policy {
 public:
  explicit KeyDiff(const PolicyParams& /*params*/) {}

  uint8_t signals() const override { return 0; }
  std::vector<std::string> token_signals() const override { return {"key_anchor_cosine"}; }
  void Score(std::span<const TokenView> tokens, PolicyContext& /*ctx*/,
             std::span<float> scores) const override {
    for (size_t i = 0; i < tokens.size(); ++i) scores[i] = -tokens[i].token_signals[0];
  }
};

}  // namespace

VTOKEN_REGISTER_POLICY(KeyDiff, "keydiff",
                       "evict the keys most similar to the mean unit key of the live tokens");

}  // namespace vtoken
