// Where a config value came from, for errors: the file and line of a key in the TOML file, or
// the `--set` that gave it. Every config error names the file and the key, and the line or the
// `--set`: "x.toml:4: key 'policy.keep_ratio' must be in (0, 1] (is 1.5)".
// Thread-compatible: plain values.
#pragma once

#include <toml++/toml.h>

#include <map>
#include <string>
#include <string_view>

#include "lib/core/status.h"

namespace vtoken::cli {

class ConfigSource {
 public:
  explicit ConfigSource(std::string file) : file_(std::move(file)) {}

  const std::string& file() const { return file_; }

  // Applies "section.key=value" to `root` (the value parsed as a TOML value, or taken as a string
  // when it does not parse) and remembers it, so errors about the key name the `--set`.
  Status ApplyOverride(toml::table& root, const std::string& assignment);

  // "x.toml:4" for a key read from the file (`node` its value), "x.toml (--set k=v)" for one an
  // override gave, "x.toml" when neither is known.
  std::string Where(std::string_view key, const toml::node* node) const;

  // InvalidArgument "WHERE: key 'KEY' WHAT".
  Status KeyError(std::string_view key, const toml::node* node, const std::string& what) const;

  // InvalidArgument "WHERE: unknown key 'KEY'", with "; did you mean 'K'?" when a known key is
  // near (NearestConfigKey).
  Status UnknownKey(std::string_view key, const toml::node* node) const;

 private:
  std::string file_;
  std::map<std::string, std::string, std::less<>> overrides_;  // dotted key -> assignment
};

}  // namespace vtoken::cli
