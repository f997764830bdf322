#include "apps/vtoken-cli/config/config_source.h"

#include "apps/vtoken-cli/config/config_keys.h"

namespace vtoken::cli {

Status ConfigSource::ApplyOverride(toml::table& root, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    return InvalidArgumentError("--set '" + assignment + "': expected key=value");
  }
  const std::string path = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  toml::table* table = &root;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    if (dot == std::string::npos) break;
    const std::string part = path.substr(start, dot - start);
    toml::node* n = table->get(part);
    if (n == nullptr) {
      table->insert(part, toml::table{});
      n = table->get(part);
    }
    if (!n->is_table()) {
      return InvalidArgumentError("--set " + path + ": '" + part + "' in " + file_ +
                                  " is not a table");
    }
    table = n->as_table();
    start = dot + 1;
  }
  const std::string leaf = path.substr(start);
  try {
    toml::table parsed = toml::parse("v = " + text);
    table->insert_or_assign(leaf, *parsed.get("v"));
  } catch (const toml::parse_error&) {
    table->insert_or_assign(leaf, text);  // Not a TOML value: take it as a bare string.
  }
  overrides_[path] = assignment;
  return Status::Ok();
}

std::string ConfigSource::Where(std::string_view key, const toml::node* node) const {
  // A key an override gave, or a table an override made: the value has no place in the file.
  for (auto it = overrides_.begin(); it != overrides_.end(); ++it) {
    const std::string& k = it->first;
    if (k == key ||
        (k.size() > key.size() && k.compare(0, key.size(), key) == 0 && k[key.size()] == '.')) {
      if (node == nullptr || node->source().path == nullptr) {
        return file_ + " (--set " + it->second + ")";
      }
    }
  }
  if (node != nullptr && node->source().path != nullptr && node->source().begin.line > 0) {
    return file_ + ":" + std::to_string(node->source().begin.line);
  }
  return file_;
}

Status ConfigSource::KeyError(std::string_view key, const toml::node* node,
                              const std::string& what) const {
  return InvalidArgumentError(Where(key, node) + ": key '" + std::string(key) + "' " + what);
}

Status ConfigSource::UnknownKey(std::string_view key, const toml::node* node) const {
  std::string message = Where(key, node) + ": unknown key '" + std::string(key) + "'";
  if (const std::string near = NearestConfigKey(key); !near.empty()) {
    message += "; did you mean '" + near + "'?";
  }
  return InvalidArgumentError(message);
}

}  // namespace vtoken::cli
