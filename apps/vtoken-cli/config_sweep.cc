#include "apps/vtoken-cli/config_sweep.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>

namespace vtoken::cli {
namespace {

// A grid value as the TOML text an override takes ("4", "'h2o'", "[ 'naive' ]").
std::string TomlValueText(const toml::node& value) {
  if (auto d = value.value_exact<double>(); d && std::isfinite(*d)) {
    char buf[32];  // Shortest round-trip form: 0.9, not 0.90000000000000002.
    std::string text(buf, std::to_chars(buf, buf + sizeof(buf), *d).ptr);
    if (text.find_first_of(".e") == std::string::npos) text += ".0";
    return text;
  }
  toml::table holder;
  holder.insert("v", value);
  std::ostringstream out;
  out << holder;
  return out.str().substr(4);  // Drop "v = ".
}

// Flattens [sweep.grid] into axes: a quoted dotted key ("engine.max_num_seqs" = [...]) and an
// unquoted one (a nested table in TOML) name the same config key.
Status ParseGrid(const toml::table& t, const std::string& prefix, const std::string& file,
                 std::vector<SweepAxis>& axes) {
  for (const auto& [key, node] : t) {
    const std::string k =
        prefix.empty() ? std::string(key.str()) : prefix + "." + std::string(key.str());
    if (const toml::table* sub = node.as_table()) {
      VTOKEN_RETURN_IF_ERROR(ParseGrid(*sub, k, file, axes));
      continue;
    }
    const std::string where = file + ": key 'sweep.grid.\"" + k + "\"'";
    if (k == "db" || k == "sweep" || k.rfind("sweep.", 0) == 0) {
      return InvalidArgumentError(where + " cannot be swept (use --db and [sweep] name)");
    }
    const toml::array* values = node.as_array();
    if (values == nullptr || values->empty()) {
      return InvalidArgumentError(where + " must be a non-empty array of values");
    }
    SweepAxis axis{.key = k, .values = {}};
    for (const toml::node& v : *values) {
      if (v.is_table() || v.is_array_of_tables()) {
        return InvalidArgumentError(where + " values must not be tables");
      }
      const std::string text = TomlValueText(v);
      // Two equal points would run twice and share one config hash.
      if (std::find(axis.values.begin(), axis.values.end(), text) != axis.values.end()) {
        return InvalidArgumentError(where + " lists " + text + " twice");
      }
      axis.values.push_back(text);
    }
    for (const SweepAxis& other : axes) {
      if (other.key == k) return InvalidArgumentError(where + " is given twice");
    }
    axes.push_back(std::move(axis));
  }
  return Status::Ok();
}

}  // namespace

Status ParseSweep(const toml::table* t, const ConfigSource& source, ExperimentConfig& c) {
  c.sweep_name = c.name;
  if (t == nullptr) return Status::Ok();
  for (const auto& [key, node] : *t) {
    const std::string k(key.str());
    if (k != "name" && k != "grid" && k != "seeds") return source.UnknownKey("sweep." + k, &node);
  }
  if (const toml::node* name = t->get("name")) {
    std::optional<std::string> s = name->value_exact<std::string>();
    if (!s) return source.KeyError("sweep.name", name, "must be a string");
    if (s->empty()) return source.KeyError("sweep.name", name, "must not be empty");
    c.sweep_name = *s;
  }
  if (const toml::node* grid = t->get("grid")) {
    if (!grid->is_table()) return source.KeyError("sweep.grid", grid, "must be a table");
    VTOKEN_RETURN_IF_ERROR(ParseGrid(*grid->as_table(), "", source.file(), c.sweep_grid));
  }
  if (const toml::node* seeds_node = t->get("seeds")) {
    const toml::array* seeds = seeds_node->as_array();
    if (seeds == nullptr || seeds->empty())
      return source.KeyError("sweep.seeds", seeds_node, "must be a non-empty array");
    SweepAxis axis{.key = "seed", .values = {}, .also = {"workload.seed"}};
    for (const toml::node& v : *seeds) {
      const std::optional<int64_t> seed = v.value<int64_t>();
      if (!v.is_integer() || !seed || *seed < 0) {
        return source.KeyError("sweep.seeds", seeds_node, "must list integers >= 0");
      }
      const std::string text = std::to_string(*seed);
      if (std::find(axis.values.begin(), axis.values.end(), text) != axis.values.end()) {
        return source.KeyError("sweep.seeds", seeds_node, "lists " + text + " twice");
      }
      axis.values.push_back(text);
    }
    for (const SweepAxis& other : c.sweep_grid) {
      if (other.key == "seed" || other.key == "workload.seed") {
        return source.KeyError("sweep.seeds", seeds_node,
                               "cannot be combined with a [sweep.grid] axis \"" + other.key + "\"");
      }
    }
    c.sweep_grid.push_back(std::move(axis));
  }
  return Status::Ok();
}

}  // namespace vtoken::cli
