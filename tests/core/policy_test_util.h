// Helpers shared by the policy tests.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "lib/core/policy_evictor.h"

namespace vtoken::testing_util {

// The evictor for `policy`, or nullptr after recording a test failure.
inline std::unique_ptr<PolicyEvictor> Make(const std::string& policy, const EvictorOptions& options,
                                           const RawParams& params = {}) {
  StatusOr<std::unique_ptr<PolicyEvictor>> e = PolicyEvictor::Create(policy, params, options);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

// A token signal's stand-in value for token `id` and signal `j`: in [0.5, 5.3), fixed per token
// (token signals never change once a token is written).
inline float TokenValueFor(TokenId id, size_t j) {
  return 0.5f + static_cast<float>((static_cast<uint64_t>(id) * 7919 + j * 104729) % 97) / 20.0f;
}

// The absolute token signals `e` takes with an observation of `live` for group `group` of `seq`:
// those of the tokens it has not seen (ids >= UnseenFrom), token-major, by TokenValueFor.
inline std::vector<float> UnseenTokenValues(const PolicyEvictor& e, SeqId seq, int32_t group,
                                            std::span<const TokenId> live) {
  std::vector<float> values;
  const TokenId unseen = e.UnseenFrom(seq, group);
  for (const TokenId id : live) {
    if (id < unseen) continue;
    for (size_t j = 0; j < e.absolute_width(); ++j) {
      values.push_back(TokenValueFor(id, j));
    }
  }
  return values;
}

// After an observation of `live` on an eviction step (`scores`: e.ScoresNext(seq) before it),
// gives `e` the relative token signals of every live token, by TokenValueFor of the token and
// the step (they move as the live set does); nothing otherwise.
inline Status GiveRelativeValues(PolicyEvictor& e, SeqId seq, int32_t group,
                                 std::span<const TokenId> live, bool scores, int64_t step) {
  const size_t nr = e.relative_width();
  if (!scores || nr == 0) return Status::Ok();
  std::vector<float> values;
  for (const TokenId id : live) {
    for (size_t j = 0; j < nr; ++j) values.push_back(TokenValueFor(id + step, j + 7));
  }
  return e.ObserveRelative(seq, group, values);
}

// Token ids begin, begin + 1, ..., end - 1.
inline std::vector<TokenId> Range(TokenId begin, TokenId end) {
  std::vector<TokenId> ids(static_cast<size_t>(end - begin));
  std::iota(ids.begin(), ids.end(), begin);
  return ids;
}

}  // namespace vtoken::testing_util
