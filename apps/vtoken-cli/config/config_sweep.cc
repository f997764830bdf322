#include "apps/vtoken-cli/config/config_sweep.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
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

// Calls `leaf(key, node)` for every value under `t` that is not a table, its key dotted as a
// grid key is written: a quoted dotted key ("engine.max_num_seqs" = ...) and an unquoted one (a
// nested table in TOML) name the same config key.
template <typename Leaf>
Status ForEachDottedKey(const toml::table& t, const std::string& prefix, Leaf&& leaf) {
  for (const auto& [key, node] : t) {
    const std::string k =
        prefix.empty() ? std::string(key.str()) : prefix + "." + std::string(key.str());
    if (const toml::table* sub = node.as_table()) {
      VTOKEN_RETURN_IF_ERROR(ForEachDottedKey(*sub, k, leaf));
      continue;
    }
    VTOKEN_RETURN_IF_ERROR(leaf(k, node));
  }
  return Status::Ok();
}

// Keys a sweep cannot set: the database and the [sweep] table itself.
bool Unsweepable(const std::string& k) {
  return k == "db" || k == "sweep" || k.rfind("sweep.", 0) == 0;
}

// Flattens [sweep.grid] into axes.
Status ParseGrid(const toml::table& t, const std::string& file, std::vector<SweepAxis>& axes) {
  return ForEachDottedKey(t, "", [&](const std::string& k, const toml::node& node) -> Status {
    const std::string where = file + ": key 'sweep.grid.\"" + k + "\"'";
    if (Unsweepable(k)) {
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
    return Status::Ok();
  });
}

// Flattens one [[sweep.exclude]] / [[sweep.add]] table into `out` ("key=value", value as TOML
// text).
Status ParsePointTable(const toml::table& t, const std::string& where, SweepOverrides& out) {
  return ForEachDottedKey(t, "", [&](const std::string& k, const toml::node& node) -> Status {
    if (Unsweepable(k)) {
      return InvalidArgumentError(where + ": key '" + k +
                                  "' cannot be swept (use --db and [sweep] name)");
    }
    if (node.is_array_of_tables()) {
      return InvalidArgumentError(where + ": key '" + k + "' must not be a table");
    }
    out.push_back(k + "=" + TomlValueText(node));
    return Status::Ok();
  });
}

// Reads [[sweep.exclude]] or [[sweep.add]] (`name`) into `entries`, one per table.
Status ParsePointList(const toml::node& node, const std::string& name, const ConfigSource& source,
                      std::vector<SweepOverrides>& entries) {
  const toml::array* list = node.as_array();
  if (list == nullptr || !list->is_array_of_tables() || list->empty()) {
    return source.KeyError("sweep." + name, &node,
                           "must be a non-empty array of tables ([[sweep." + name + "]])");
  }
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string where =
        source.file() + ": [[sweep." + name + "]] entry " + std::to_string(i + 1);
    SweepOverrides entry;
    VTOKEN_RETURN_IF_ERROR(ParsePointTable(*list->get(i)->as_table(), where, entry));
    if (entry.empty()) return InvalidArgumentError(where + " sets no key");
    entries.push_back(std::move(entry));
  }
  return Status::Ok();
}

// The key of a "key=value" override.
std::string OverrideKey(const std::string& kv) { return kv.substr(0, kv.find('=')); }

// Every exclusion names grid axes and values they take (an entry that could match no point is a
// mistake); an added point sets no key that [sweep] seeds repeats and is no other point again;
// the sweep has a point left.
Status CheckPointLists(const ExperimentConfig& c, const std::string& file) {
  for (size_t i = 0; i < c.sweep_exclude.size(); ++i) {
    const std::string where = file + ": [[sweep.exclude]] entry " + std::to_string(i + 1);
    for (const std::string& kv : c.sweep_exclude[i]) {
      const std::string key = OverrideKey(kv);
      auto axis = std::find_if(c.sweep_grid.begin(), c.sweep_grid.end(),
                               [&](const SweepAxis& a) { return a.key == key; });
      if (axis == c.sweep_grid.end()) {
        std::string axes;
        for (const SweepAxis& a : c.sweep_grid) axes += (axes.empty() ? "" : ", ") + a.key;
        return InvalidArgumentError(where + ": key '" + key + "' is not a [sweep.grid] axis (" +
                                    (axes.empty() ? "there is none" : "axes: " + axes) + ")");
      }
      const std::string value = kv.substr(key.size() + 1);
      if (std::find(axis->values.begin(), axis->values.end(), value) == axis->values.end()) {
        return InvalidArgumentError(where + ": " + value + " is not a value of axis '" + key + "'");
      }
    }
  }
  for (size_t i = 0; i < c.sweep_add.size(); ++i) {
    for (const std::string& kv : c.sweep_add[i]) {
      for (const SweepAxis& a : c.sweep_grid) {
        if (a.also.empty()) continue;
        const std::string key = OverrideKey(kv);
        if (key == a.key || std::find(a.also.begin(), a.also.end(), key) != a.also.end()) {
          return InvalidArgumentError(file + ": [[sweep.add]] entry " + std::to_string(i + 1) +
                                      ": key '" + key + "' is repeated by [sweep] seeds");
        }
      }
    }
  }
  const std::vector<SweepPoint> points = ExpandSweep(c.sweep_grid, c.sweep_exclude, c.sweep_add);
  if (points.empty()) {
    return InvalidArgumentError(file +
                                ": [sweep] has no point left (every point of the grid is "
                                "excluded)");
  }
  // An added point that repeats another would run twice under one config hash.
  std::set<SweepOverrides> seen;
  for (const SweepPoint& p : points) {
    SweepOverrides sorted = p.overrides;
    std::sort(sorted.begin(), sorted.end());
    if (!seen.insert(sorted).second) {
      std::string text;
      for (const std::string& kv : p.overrides) text += (text.empty() ? "" : ", ") + kv;
      return InvalidArgumentError(file + ": [[sweep.add]] lists a point the sweep already has (" +
                                  text + ")");
    }
  }
  return Status::Ok();
}

}  // namespace

Status ParseSweep(const toml::table* t, const ConfigSource& source, bool check_points,
                  ExperimentConfig& c) {
  c.sweep_name = c.name;
  if (t == nullptr) return Status::Ok();
  for (const auto& [key, node] : *t) {
    const std::string k(key.str());
    if (std::find(kSweepKeys.begin(), kSweepKeys.end(), k) == kSweepKeys.end()) {
      return source.UnknownKey("sweep." + k, &node);
    }
  }
  if (const toml::node* name = t->get("name")) {
    std::optional<std::string> s = name->value_exact<std::string>();
    if (!s) return source.KeyError("sweep.name", name, "must be a string");
    if (s->empty()) return source.KeyError("sweep.name", name, "must not be empty");
    c.sweep_name = *s;
  }
  if (const toml::node* grid = t->get("grid")) {
    if (!grid->is_table()) return source.KeyError("sweep.grid", grid, "must be a table");
    VTOKEN_RETURN_IF_ERROR(ParseGrid(*grid->as_table(), source.file(), c.sweep_grid));
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
  if (const toml::node* exclude = t->get("exclude")) {
    VTOKEN_RETURN_IF_ERROR(ParsePointList(*exclude, "exclude", source, c.sweep_exclude));
  }
  if (const toml::node* add = t->get("add")) {
    VTOKEN_RETURN_IF_ERROR(ParsePointList(*add, "add", source, c.sweep_add));
  }
  return check_points ? CheckPointLists(c, source.file()) : Status::Ok();
}

}  // namespace vtoken::cli
