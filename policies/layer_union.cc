// LayerUnion: per-layer scoring at one shared budget (kvpress scores each layer on its own).
// Rule: rank the live tokens by a token signal in each layer of the group separately (its
// NAME@layer view; over = head: each KV row, NAME@head) and keep the tokens some layer ranks
// high: a token's score is its best rank over the layers, so the kept tokens are the union of
// every layer's top m for the largest m that fits the budget. Averaging over layers instead
// drowns a token that one layer needs. A group of one layer (layer or head granularity) keeps
// the signal's own order. Defaults: signal = expected_attention, over = layer.
#include <algorithm>
#include <utility>
#include <vector>

#include "lib/core/policy.h"

namespace vtoken {
namespace {

class LayerUnion final : public Policy {
 public:
  explicit LayerUnion(const PolicyParams& p)
      : signal_(p.String("signal") + "@" + p.String("over")) {}

  uint8_t signals() const override { return 0; }
  std::vector<std::string> token_signals() const override { return {signal_}; }
  void Score(std::span<const TokenView> tokens, PolicyContext& ctx,
             std::span<float> scores) const override {
    const size_t n = tokens.size(), columns = n == 0 ? 0 : ctx.token_signal(tokens[0], 0).size();
    std::fill(scores.begin(), scores.end(), 0.0f);
    std::vector<std::pair<float, size_t>> order(n);  // (value, token): equal values, older first.
    for (size_t c = 0; c < columns; ++c) {
      for (size_t i = 0; i < n; ++i) order[i] = {ctx.token_signal(tokens[i], 0)[c], i};
      std::sort(order.begin(), order.end());  // Rank r + 1 of n by the column's value.
      for (size_t r = 0; r < n; ++r) {
        float& score = scores[order[r].second];
        score = std::max(score, static_cast<float>(r + 1) / static_cast<float>(n));
      }
    }
  }

 private:
  std::string signal_;
};

}  // namespace

VTOKEN_REGISTER_POLICY(LayerUnion, "layer_union",
                       "keep the union of every layer's top tokens by a token signal",
                       StringParam("signal", "expected_attention",
                                   "the token signal ranked in each layer"),
                       StringParam("over", "layer", "rank per layer, or per KV head of each layer",
                                   {"layer", "head"}));

}  // namespace vtoken
