// NamedRegistry: a process-wide table of things registered by name at static-initialization
// time (policies, policy_registry.h; token signals, token_signal.h), kept sorted by name. One
// instance per kind, behind a function-local static (registration order across files is
// unspecified). Registering a name twice exits with a message naming both source files: it is a
// build error, found by running any binary.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "lib/core/status.h"

namespace vtoken {

// Info: a struct with `name` and `source_file` strings.
template <typename Info>
class NamedRegistry {
 public:
  // `kind` names what is registered in messages ("policy", "token signal").
  explicit NamedRegistry(const char* kind) : kind_(kind) {}

  // Adds `info`; a name registered twice exits (see the file comment).
  void Add(Info info) {
    auto it = entries_.find(info.name);
    if (it != entries_.end()) {
      std::fprintf(stderr, "vtoken: %s '%s' is registered twice (%s and %s)\n", kind_,
                   info.name.c_str(), it->second.source_file.c_str(), info.source_file.c_str());
      std::exit(1);
    }
    std::string name = info.name;
    entries_.emplace(std::move(name), std::move(info));
  }

  // The entry registered as `name`, or NotFound: "unknown KIND 'NAME' (registered: a, b)".
  StatusOr<const Info*> Find(std::string_view name) const {
    auto it = entries_.find(name);
    if (it != entries_.end()) return &it->second;
    std::string known;
    for (const auto& [n, info] : entries_) known += (known.empty() ? "" : ", ") + n;
    return NotFoundError("unknown " + std::string(kind_) + " '" + std::string(name) +
                         "' (registered: " + (known.empty() ? "none" : known) + ")");
  }

  // Every entry, sorted by name (pointers stay valid: entries are never removed).
  std::vector<const Info*> All() const {
    std::vector<const Info*> out;
    for (const auto& [name, info] : entries_) out.push_back(&info);
    return out;
  }

 private:
  const char* kind_;
  std::map<std::string, Info, std::less<>> entries_;
};

}  // namespace vtoken
