// Command-line flags that mirror config keys (`generate --top-p`, `check --frag-threshold`): the
// key table (config_keys.h) gives the flag its spelling (ConfigKey::FlagName), its help (the
// key's doc) and its check (the key's type and range), so that a key and its flag cannot drift
// apart. Old spellings stay as aliases that say they are deprecated.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "apps/vtoken-cli/config/config_keys.h"

namespace vtoken::cli {

// The flag's help: `prefix`, then the key's doc up to its first "; " or ". " (capitalized
// without a prefix), without Markdown backticks.
std::string KeyFlagHelp(const ConfigKey& key, const std::string& prefix);

// Checks a flag's text against the key's type and range: "must be a number in (0, 1], got 5".
CLI::Validator KeyValidator(const ConfigKey& key);

// Adds the flag of config key `key` (which must exist) to `cmd`, stored in `target`, with
// KeyFlagHelp(prefix) and KeyValidator; each of `deprecated` is an alias of it (excluded with it)
// that prints a note naming the flag to use.
template <typename T>
CLI::Option* AddKeyFlag(CLI::App& cmd, std::string_view key, T& target,
                        const std::string& prefix = "",
                        const std::vector<std::string>& deprecated = {}) {
  const ConfigKey& k = *FindConfigKey(key);
  const std::string flag = k.FlagName();
  CLI::Option* option = cmd.add_option(flag, target, KeyFlagHelp(k, prefix));
  if constexpr (!std::is_same_v<T, bool>) option->check(KeyValidator(k));
  for (const std::string& old : deprecated) {
    CLI::Option* alias = cmd.add_option(old, target, "Deprecated spelling of " + flag);
    if constexpr (!std::is_same_v<T, bool>) alias->check(KeyValidator(k));
    alias->excludes(option)->each([old, flag](const std::string&) {
      std::fprintf(stderr, "vtoken-cli: note: %s is deprecated; use %s\n", old.c_str(),
                   flag.c_str());
    });
  }
  return option;
}

}  // namespace vtoken::cli
