#include "lib/core/policy_params.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace vtoken {
namespace {

std::string Prefix(std::string_view policy, std::string_view name) {
  return "policy '" + std::string(policy) + "': parameter '" + std::string(name) + "'";
}

std::string NameList(std::span<const ParamSpec> specs) {
  if (specs.empty()) return "it has none";
  std::string out = "known:";
  for (const ParamSpec& spec : specs) out += " " + spec.name;
  return out;
}

const ParamSpec* FindSpec(std::span<const ParamSpec> specs, std::string_view name) {
  for (const ParamSpec& spec : specs) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

std::string RangeText(const ParamSpec& spec) {
  std::ostringstream out;
  out << (spec.min_exclusive ? "(" : "[") << spec.min << ", " << spec.max
      << (spec.max_exclusive ? ")" : "]");
  return out.str();
}

// Checks range or choices of a value already of the declared type.
Status CheckDomain(std::string_view policy, const ParamSpec& spec, const ParamValue& value) {
  double number = 0;
  if (const auto* i = std::get_if<int64_t>(&value)) number = static_cast<double>(*i);
  if (const auto* d = std::get_if<double>(&value)) number = *d;
  if (std::holds_alternative<int64_t>(value) || std::holds_alternative<double>(value)) {
    const bool above = spec.min_exclusive ? number > spec.min : number >= spec.min;
    const bool below = spec.max_exclusive ? number < spec.max : number <= spec.max;
    if (!(above && below)) {
      return InvalidArgumentError(Prefix(policy, spec.name) + " = " + ParamValueToString(value) +
                                  " is outside " + RangeText(spec));
    }
  }
  if (const auto* s = std::get_if<std::string>(&value); s != nullptr && !spec.choices.empty()) {
    for (const std::string& choice : spec.choices) {
      if (choice == *s) return Status::Ok();
    }
    std::string allowed;
    for (const std::string& choice : spec.choices)
      allowed += (allowed.empty() ? "" : ", ") + choice;
    return InvalidArgumentError(Prefix(policy, spec.name) + " = '" + *s + "' is not one of " +
                                allowed);
  }
  return Status::Ok();
}

// Writes `text` converted to the declared type of `spec` into `out`. (An out-parameter: GCC 12
// misreports StatusOr<ParamValue> returns as maybe-uninitialized under sanitizers.)
Status ParseAs(std::string_view policy, const ParamSpec& spec, const std::string& text,
               ParamValue* out) {
  const ParamType type = TypeOf(spec.default_value);
  const Status bad = InvalidArgumentError(Prefix(policy, spec.name) + " expects " +
                                          ParamTypeName(type) + ", got '" + text + "'");
  switch (type) {
    case ParamType::kInt: {
      int64_t v = 0;
      const char* end = text.data() + text.size();
      auto [ptr, ec] = std::from_chars(text.data(), end, v);
      if (ec != std::errc() || ptr != end || text.empty()) return bad;
      *out = v;
      return Status::Ok();
    }
    case ParamType::kDouble: {
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v)) return bad;
      *out = v;
      return Status::Ok();
    }
    case ParamType::kBool:
      if (text != "true" && text != "1" && text != "false" && text != "0") return bad;
      *out = text == "true" || text == "1";
      return Status::Ok();
    case ParamType::kString:
      *out = text;
      return Status::Ok();
  }
  return bad;
}

}  // namespace

const char* ParamTypeName(ParamType type) {
  switch (type) {
    case ParamType::kInt:
      return "int";
    case ParamType::kDouble:
      return "double";
    case ParamType::kBool:
      return "bool";
    case ParamType::kString:
      return "string";
  }
  return "?";
}

ParamType TypeOf(const ParamValue& value) { return static_cast<ParamType>(value.index()); }

std::string ParamValueToString(const ParamValue& value) {
  if (const auto* i = std::get_if<int64_t>(&value)) return std::to_string(*i);
  if (const auto* b = std::get_if<bool>(&value)) return *b ? "true" : "false";
  if (const auto* s = std::get_if<std::string>(&value)) return *s;
  std::ostringstream out;
  out << std::get<double>(value);
  return out.str();
}

StatusOr<PolicyParams> ResolveParams(std::string_view policy, std::span<const ParamSpec> specs,
                                     const RawParams& raw) {
  for (const auto& [name, value] : raw) {
    if (FindSpec(specs, name) == nullptr) {
      return InvalidArgumentError("policy '" + std::string(policy) + "' has no parameter '" + name +
                                  "' (" + NameList(specs) + ")");
    }
  }
  RawParams resolved;
  for (const ParamSpec& spec : specs) {
    auto it = raw.find(spec.name);
    ParamValue value = it == raw.end() ? spec.default_value : it->second;
    const ParamType want = TypeOf(spec.default_value);
    if (want == ParamType::kDouble && std::holds_alternative<int64_t>(value)) {
      value = static_cast<double>(std::get<int64_t>(value));
    }
    if (TypeOf(value) != want) {
      return InvalidArgumentError(Prefix(policy, spec.name) + " expects " + ParamTypeName(want) +
                                  ", got " + ParamTypeName(TypeOf(value)) + " '" +
                                  ParamValueToString(value) + "'");
    }
    VTOKEN_RETURN_IF_ERROR(CheckDomain(policy, spec, value));
    resolved.emplace(spec.name, std::move(value));
  }
  return PolicyParams(std::move(resolved));
}

StatusOr<RawParams> ParseParamAssignments(std::string_view policy, std::span<const ParamSpec> specs,
                                          std::span<const std::string> assignments) {
  RawParams raw;
  for (const std::string& assignment : assignments) {
    const size_t eq = assignment.find('=');
    if (eq == std::string::npos || eq == 0) {
      return InvalidArgumentError("policy '" + std::string(policy) + "': parameter '" + assignment +
                                  "' is not key=value");
    }
    const std::string key = assignment.substr(0, eq);
    const ParamSpec* spec = FindSpec(specs, key);
    if (spec == nullptr) {
      return InvalidArgumentError("policy '" + std::string(policy) + "' has no parameter '" + key +
                                  "' (" + NameList(specs) + ")");
    }
    if (raw.count(key) > 0) {
      return InvalidArgumentError(Prefix(policy, key) + " is given twice");
    }
    ParamValue value;
    VTOKEN_RETURN_IF_ERROR(ParseAs(policy, *spec, assignment.substr(eq + 1), &value));
    raw.emplace(key, std::move(value));
  }
  return raw;
}

}  // namespace vtoken
