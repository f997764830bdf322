// StreamingLLM: Xiao et al., "Efficient Streaming Language Models with Attention Sinks",
// ICLR 2024.
// Rule: keep the first sink_tokens tokens (the attention sinks) and fill the rest of the budget
// with the most recent tokens; attention plays no part.
// Defaults: sink_tokens = 4, as in the paper.
#include "lib/core/policy.h"

namespace vtoken {
namespace {

class StreamingLlm final : public Policy {
 public:
  explicit StreamingLlm(const PolicyParams& p)
      : sinks_(static_cast<size_t>(p.Int("sink_tokens"))) {}

  uint8_t signals() const override { return 0; }
  void Score(std::span<const TokenView> tokens, PolicyContext&,
             std::span<float> scores) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      scores[i] = i < sinks_ ? kKeepScore : static_cast<float>(tokens[i].position);
    }
  }

 private:
  size_t sinks_;
};

}  // namespace

VTOKEN_REGISTER_POLICY(StreamingLlm, "streaming_llm",
                       "keep the first tokens (attention sinks) and the most recent ones",
                       IntParam("sink_tokens", 4, "first tokens always kept", /*min=*/0));

}  // namespace vtoken
