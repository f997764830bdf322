// Helpers shared by the policy tests.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <numeric>
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

// Token ids begin, begin + 1, ..., end - 1.
inline std::vector<TokenId> Range(TokenId begin, TokenId end) {
  std::vector<TokenId> ids(static_cast<size_t>(end - begin));
  std::iota(ids.begin(), ids.end(), begin);
  return ids;
}

}  // namespace vtoken::testing_util
