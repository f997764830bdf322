// Typed parameters of eviction policies. A policy declares its parameters (ParamSpec: name, type
// via the default value, range or choices); callers supply raw values by name (RawParams: the
// engine converts a TOML table, the CLI parses key=value flags with ParseParamAssignments);
// ResolveParams checks them against the declaration and fills in defaults, producing the
// PolicyParams a policy is constructed from.
//
// Every error is InvalidArgument and names the policy and the parameter at fault.
// Thread-compatible: plain values.
#pragma once

#include <cassert>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "lib/core/status.h"

namespace vtoken {

// One parameter value. The alternative held by a ParamSpec's default is the parameter's type.
using ParamValue = std::variant<int64_t, double, bool, std::string>;

enum class ParamType { kInt = 0, kDouble = 1, kBool = 2, kString = 3 };  // = variant index.

const char* ParamTypeName(ParamType type);
ParamType TypeOf(const ParamValue& value);
// Renders a value as a user would type it: 3, 0.5, true, max.
std::string ParamValueToString(const ParamValue& value);

struct ParamSpec {
  std::string name;
  ParamValue default_value;  // Also fixes the type.
  std::string help;          // One line.
  // Int and double parameters: range of accepted values, inclusive unless marked exclusive.
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  // String parameters: accepted values (empty: any string).
  std::vector<std::string> choices;
  bool min_exclusive = false;  // min itself is refused: (min, ...
  bool max_exclusive = false;  // max itself is refused: ..., max)

  // Chainable: DoubleParam("decay", 0.9, "per-step decay", 0, 1).ExclusiveMin() accepts (0, 1].
  ParamSpec ExclusiveMin() && {
    min_exclusive = true;
    return std::move(*this);
  }
  ParamSpec ExclusiveMax() && {
    max_exclusive = true;
    return std::move(*this);
  }
};

// Declarations, one per type, as policies write them:
//   IntParam("window", 32, "observation window in steps", /*min=*/1, /*max=*/1024)
inline ParamSpec IntParam(std::string name, int64_t default_value, std::string help,
                          double min = -std::numeric_limits<double>::infinity(),
                          double max = std::numeric_limits<double>::infinity()) {
  return ParamSpec{std::move(name), default_value, std::move(help), min, max, {}};
}
inline ParamSpec DoubleParam(std::string name, double default_value, std::string help,
                             double min = -std::numeric_limits<double>::infinity(),
                             double max = std::numeric_limits<double>::infinity()) {
  return ParamSpec{std::move(name), default_value, std::move(help), min, max, {}};
}
inline ParamSpec BoolParam(std::string name, bool default_value, std::string help) {
  return ParamSpec{std::move(name),
                   default_value,
                   std::move(help),
                   -std::numeric_limits<double>::infinity(),
                   std::numeric_limits<double>::infinity(),
                   {}};
}
// `choices` empty: any string is accepted.
inline ParamSpec StringParam(std::string name, std::string default_value, std::string help,
                             std::vector<std::string> choices = {}) {
  return ParamSpec{std::move(name),
                   std::move(default_value),
                   std::move(help),
                   -std::numeric_limits<double>::infinity(),
                   std::numeric_limits<double>::infinity(),
                   std::move(choices)};
}

// Raw values by parameter name, as supplied by a caller.
using RawParams = std::map<std::string, ParamValue, std::less<>>;

// The resolved parameters of one policy: every declared parameter has a value of its type.
class PolicyParams {
 public:
  PolicyParams() = default;
  explicit PolicyParams(RawParams values) : values_(std::move(values)) {}

  // REQUIRES: `name` is declared with the getter's type (a policy reads its own declaration).
  int64_t Int(std::string_view name) const { return std::get<int64_t>(Get(name)); }
  double Double(std::string_view name) const { return std::get<double>(Get(name)); }
  bool Bool(std::string_view name) const { return std::get<bool>(Get(name)); }
  const std::string& String(std::string_view name) const {
    return std::get<std::string>(Get(name));
  }
  const RawParams& values() const { return values_; }

 private:
  const ParamValue& Get(std::string_view name) const {
    auto it = values_.find(name);
    assert(it != values_.end() && "policy reads a parameter it did not declare");
    return it->second;
  }

  RawParams values_;
};

// Checks `raw` against `specs` and returns every declared parameter's value (raw or default).
// An int is accepted for a double parameter; nothing else converts. InvalidArgument for an
// unknown name, a value of the wrong type, a number out of range or a string not in choices.
StatusOr<PolicyParams> ResolveParams(std::string_view policy, std::span<const ParamSpec> specs,
                                     const RawParams& raw);

// Parses "key=value" strings, converting each value to the declared type of `key` (ints and
// doubles in C syntax, bools as true/false/1/0, strings verbatim). InvalidArgument for a string
// without '=', an unknown key, a key given twice or a value that does not parse.
StatusOr<RawParams> ParseParamAssignments(std::string_view policy, std::span<const ParamSpec> specs,
                                          std::span<const std::string> assignments);

}  // namespace vtoken
