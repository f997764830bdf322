// Drop: evicts exactly the tokens at the listed positions (RoPE positions; the BOS token, when
// the model adds one, is 0) and keeps every other token. The simplest eviction to reason about,
// and what reference comparisons need: `vtoken-cli generate --drop 3,4,9` runs it right after
// prefill with a budget of the prompt minus the listed positions. Unlisted tokens tie at the
// keep score, so a smaller budget takes the oldest of them after the listed ones.
#include <charconv>
#include <set>
#include <string>

#include "lib/core/policy.h"

namespace vtoken {
namespace {

class Drop final : public Policy {
 public:
  explicit Drop(const PolicyParams& p) {
    const std::string& list = p.String("positions");
    for (size_t start = 0; start < list.size();) {
      size_t end = list.find(',', start);
      if (end == std::string::npos) end = list.size();
      int64_t v = -1;
      std::from_chars(list.data() + start, list.data() + end, v);
      if (v >= 0) drop_.insert(v);
      start = end + 1;
    }
  }

  uint8_t signals() const override { return 0; }
  void Score(std::span<const TokenView> tokens, PolicyContext&,
             std::span<float> scores) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      scores[i] = drop_.count(tokens[i].position) ? -kKeepScore : kKeepScore;
    }
  }

 private:
  std::set<int64_t> drop_;
};

}  // namespace

VTOKEN_REGISTER_POLICY(Drop, "drop", "evict exactly the listed positions, keep all others",
                       StringParam("positions", "", "comma-separated positions to evict"));

}  // namespace vtoken
