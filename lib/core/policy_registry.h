// The process-wide registry of eviction policies. Every policies/*.cc file adds itself at static
// initialization (VTOKEN_REGISTER_POLICY in policy.h); after main() starts the registry is only
// read, so lookups are safe from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lib/core/policy.h"
#include "lib/core/status.h"

namespace vtoken {

// Returns the policy registered as `name`, or NotFound naming it and listing the registered ones.
StatusOr<const PolicyInfo*> FindPolicy(std::string_view name);

// Every registered policy, sorted by name.
std::vector<const PolicyInfo*> RegisteredPolicies();

// Resolves `raw` against the policy's parameters and constructs it. NotFound for an unknown
// policy, InvalidArgument (naming policy and key) for a bad parameter.
StatusOr<std::unique_ptr<Policy>> CreatePolicy(std::string_view name, const RawParams& raw);

// Lines of code of a C++ source file: lines holding anything besides whitespace and comments
// (// and /* */, string and character literals respected). NotFound when it cannot be read.
StatusOr<int64_t> CountCodeLines(const std::string& path);

}  // namespace vtoken
