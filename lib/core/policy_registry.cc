#include "lib/core/policy_registry.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "lib/core/named_registry.h"

namespace vtoken {
namespace {

NamedRegistry<PolicyInfo>& Registry() {
  static NamedRegistry<PolicyInfo> registry("policy");
  return registry;
}

}  // namespace

bool RegisterPolicy(PolicyInfo info) {
  Registry().Add(std::move(info));
  return true;
}

StatusOr<const PolicyInfo*> FindPolicy(std::string_view name) { return Registry().Find(name); }

std::vector<const PolicyInfo*> RegisteredPolicies() { return Registry().All(); }

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
