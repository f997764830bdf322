#include "apps/vtoken-cli/config/run_config.h"

#include <toml++/toml.h>

#include <charconv>
#include <sstream>

namespace vtoken::cli {
namespace {

std::string ValueText(const toml::node& node) {
  if (auto s = node.value_exact<std::string>()) return *s;
  if (auto d = node.value_exact<double>()) {
    char buf[32];
    const auto end = std::to_chars(buf, buf + sizeof(buf), *d).ptr;
    return std::string(buf, end);
  }
  toml::table holder;
  holder.insert("v", node);
  std::ostringstream out;
  out << holder;
  return out.str().substr(4);  // Drop "v = ".
}

void Flatten(const toml::table& t, const std::string& prefix, FlatConfig& out) {
  for (const auto& [key, node] : t) {
    const std::string k = prefix + std::string(key.str());
    if (const toml::table* sub = node.as_table()) {
      Flatten(*sub, k + ".", out);
    } else {
      out[k] = ValueText(node);
    }
  }
}

}  // namespace

StatusOr<FlatConfig> FlattenConfig(const std::string& config_toml, const std::string& what) {
  FlatConfig out;
  try {
    Flatten(toml::parse(config_toml), "", out);
  } catch (const toml::parse_error& e) {
    return DataLossError(what + ": config_toml does not parse: " + std::string(e.description()));
  }
  return out;
}

std::vector<std::string> VaryingKeys(const std::vector<const FlatConfig*>& configs,
                                     const std::set<std::string>& ignore) {
  return VaryingKeys(configs, std::vector<bool>(configs.size(), false), ignore);
}

std::vector<std::string> VaryingKeys(const std::vector<const FlatConfig*>& configs,
                                     const std::vector<bool>& native,
                                     const std::set<std::string>& ignore) {
  std::set<std::string> keys;
  for (const FlatConfig* c : configs) {
    for (const auto& [k, v] : *c) keys.insert(k);
  }
  std::vector<std::string> out;
  for (const std::string& k : keys) {
    if (ignore.count(k)) continue;
    const bool native_ignores = NativeIgnores(k);
    std::set<std::string> values;
    for (size_t i = 0; i < configs.size(); ++i) {
      if (native[i] && native_ignores) continue;
      auto it = configs[i]->find(k);
      values.insert(it == configs[i]->end() ? "(unset)" : "=" + it->second);
    }
    if (values.size() > 1) out.push_back(k);
  }
  return out;
}

bool NativeIgnores(const std::string& key) {
  return key.rfind("policy.", 0) == 0 || key.rfind("reclaim.", 0) == 0;
}

FlatConfig NativeView(const FlatConfig& config) {
  FlatConfig out;
  for (const auto& [key, value] : config) {
    if (!NativeIgnores(key)) out.emplace(key, value);
  }
  return out;
}

FlatConfig SeedPointConfig(FlatConfig config) {
  config.erase("modes");
  for (const std::string& k : kSeedKeys) config.erase(k);
  return config;
}

std::vector<std::vector<size_t>> GroupSeedPoints(
    size_t n, const std::function<const FlatConfig&(size_t)>& config,
    const std::function<std::string(size_t)>& label) {
  std::vector<std::vector<size_t>> groups;
  std::map<std::pair<std::string, FlatConfig>, size_t> index;  // -> groups[i]
  for (size_t i = 0; i < n; ++i) {
    auto [it, added] = index.try_emplace({label(i), SeedPointConfig(config(i))}, groups.size());
    if (added) groups.emplace_back();
    groups[it->second].push_back(i);
  }
  return groups;
}

std::string ConfigValue(const FlatConfig& config, const std::string& key,
                        const std::string& missing) {
  auto it = config.find(key);
  return it == config.end() ? missing : it->second;
}

}  // namespace vtoken::cli
