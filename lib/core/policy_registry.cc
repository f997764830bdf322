#include "lib/core/policy_registry.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

namespace vtoken {
namespace {

std::map<std::string, PolicyInfo, std::less<>>& Registry() {
  static std::map<std::string, PolicyInfo, std::less<>> registry;
  return registry;
}

}  // namespace

bool RegisterPolicy(PolicyInfo info) {
  auto& registry = Registry();
  auto it = registry.find(info.name);
  if (it != registry.end()) {
    std::fprintf(stderr, "vtoken: policy '%s' is registered twice (%s and %s)\n", info.name.c_str(),
                 it->second.source_file.c_str(), info.source_file.c_str());
    std::exit(1);
  }
  std::string name = info.name;
  registry.emplace(std::move(name), std::move(info));
  return true;
}

StatusOr<const PolicyInfo*> FindPolicy(std::string_view name) {
  const auto& registry = Registry();
  auto it = registry.find(name);
  if (it != registry.end()) return &it->second;
  std::string known;
  for (const auto& [n, info] : registry) known += (known.empty() ? "" : ", ") + n;
  return NotFoundError("unknown policy '" + std::string(name) +
                       "' (registered: " + (known.empty() ? "none" : known) + ")");
}

std::vector<const PolicyInfo*> RegisteredPolicies() {
  std::vector<const PolicyInfo*> out;
  for (const auto& [name, info] : Registry()) out.push_back(&info);
  return out;
}

StatusOr<std::unique_ptr<Policy>> CreatePolicy(std::string_view name, const RawParams& raw) {
  VTOKEN_ASSIGN_OR_RETURN(const PolicyInfo* info, FindPolicy(name));
  VTOKEN_ASSIGN_OR_RETURN(PolicyParams params, ResolveParams(info->name, info->params, raw));
  return info->factory(params);
}

StatusOr<int64_t> CountCodeLines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("cannot read policy source '" + path + "'");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  enum class State { kCode, kLineComment, kBlockComment, kString, kChar };
  State state = State::kCode;
  int64_t lines = 0;
  bool line_has_code = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    const char next = i + 1 < text.size() ? text[i + 1] : '\0';
    if (c == '\n') {
      lines += line_has_code ? 1 : 0;
      line_has_code = false;
      if (state == State::kLineComment) state = State::kCode;
      continue;
    }
    switch (state) {
      case State::kCode:
        if (c == '/' && next == '/') {
          state = State::kLineComment;
          ++i;
        } else if (c == '/' && next == '*') {
          state = State::kBlockComment;
          ++i;
        } else if (c != ' ' && c != '\t' && c != '\r') {
          line_has_code = true;
          if (c == '"') state = State::kString;
          if (c == '\'') state = State::kChar;
        }
        break;
      case State::kLineComment:
        break;
      case State::kBlockComment:
        if (c == '*' && next == '/') {
          state = State::kCode;
          ++i;
        }
        break;
      case State::kString:
      case State::kChar:
        if (c == '\\') {
          ++i;  // An escaped character never ends the literal.
        } else if ((c == '"' && state == State::kString) || (c == '\'' && state == State::kChar)) {
          state = State::kCode;
        }
        break;
    }
  }
  return lines + (line_has_code ? 1 : 0);
}

}  // namespace vtoken
