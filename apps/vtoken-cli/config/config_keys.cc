#include "apps/vtoken-cli/config/config_keys.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>

namespace vtoken::cli {
namespace {

std::string NumberText(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];  // Shortest round-trip form: 0.9, not 0.90000000000000002.
  return std::string(buf, std::to_chars(buf, buf + sizeof(buf), v).ptr);
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

const char* KeyTypeNoun(KeyType type) {
  switch (type) {
    case KeyType::kInt:
      return "an integer";
    case KeyType::kDouble:
      return "a number";
    case KeyType::kBool:
      return "true or false";
    case KeyType::kString:
      return "a string";
    case KeyType::kStringList:
      return "an array of strings";
    case KeyType::kDoubleList:
      return "an array of numbers";
    case KeyType::kParams:
      return "a table";
  }
  return "?";
}

std::string ConfigKey::FlagName() const {
  std::string flag = "--" + name.substr(name.rfind('.') + 1);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

const ConfigKey* FindConfigKey(std::string_view name) {
  static const std::map<std::string, const ConfigKey*, std::less<>> index = [] {
    std::map<std::string, const ConfigKey*, std::less<>> m;
    for (const ConfigKey& k : ConfigKeys()) m.emplace(k.name, &k);
    return m;
  }();
  auto it = index.find(name);
  return it == index.end() ? nullptr : it->second;
}

bool IsConfigSection(std::string_view name) {
  const std::string prefix = std::string(name) + ".";
  return std::any_of(ConfigKeys().begin(), ConfigKeys().end(),
                     [&](const ConfigKey& k) { return k.name.rfind(prefix, 0) == 0; });
}

std::string NearestName(std::string_view name, const std::vector<std::string>& known) {
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const std::string& k : known) {
    // A key in the wrong table (budget_tokens at the top) counts as one edit.
    const std::string_view leaf = std::string_view(k).substr(k.rfind('.') + 1);
    const size_t d = std::min(EditDistance(name, k), leaf == name ? size_t{1} : SIZE_MAX);
    if (d < best_distance) best_distance = d, best = k;
  }
  // A typo, not another word: at most a third of the name's characters differ.
  return best_distance <= std::max<size_t>(2, name.size() / 3) ? best : "";
}

std::string NearestConfigKey(std::string_view name) {
  std::vector<std::string> known = {"sweep", "sweep.name", "sweep.seeds", "sweep.grid"};
  for (const ConfigKey& k : ConfigKeys()) known.push_back(k.name);
  return NearestName(name, known);
}

std::string RangeText(const ConfigKey& key) {
  if (!key.range_text.empty()) return key.range_text;
  if (!key.choices.empty()) {
    std::string text;
    for (size_t i = 0; i < key.choices.size(); ++i) {
      text += (i == 0 ? "" : i + 1 == key.choices.size() ? " or " : ", ");
      text += "\"" + key.choices[i] + "\"";
    }
    return text;
  }
  const bool has_min = std::isfinite(key.min), has_max = std::isfinite(key.max);
  if (has_min && has_max) {
    return std::string("in ") + (key.min_exclusive ? "(" : "[") + NumberText(key.min) + ", " +
           NumberText(key.max) + (key.max_exclusive ? ")" : "]");
  }
  if (has_min) return (key.min_exclusive ? "> " : ">= ") + NumberText(key.min);
  if (has_max) return (key.max_exclusive ? "< " : "<= ") + NumberText(key.max);
  return "";
}

std::string CheckRange(const ConfigKey& key, const KeyValue& value) {
  if (!key.choices.empty()) {
    const std::string* s = std::get_if<std::string>(&value);
    if (s == nullptr ||
        std::find(key.choices.begin(), key.choices.end(), *s) != key.choices.end()) {
      return "";
    }
    return RangeText(key);
  }
  double v;
  if (const int64_t* i = std::get_if<int64_t>(&value)) {
    v = static_cast<double>(*i);
  } else if (const double* d = std::get_if<double>(&value)) {
    v = *d;
  } else {
    return "";
  }
  const bool low_ok = key.min_exclusive ? v > key.min : v >= key.min;
  const bool high_ok = key.max_exclusive ? v < key.max : v <= key.max;
  if (low_ok && high_ok) return "";
  const std::string range = RangeText(key);
  return range.empty() ? "a finite number" : range;  // Finite() alone: an infinity
}

std::string KeyValueText(const KeyValue& value) {
  struct Visitor {
    std::string operator()(int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const { return NumberText(v); }
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(const std::string& v) const { return "\"" + v + "\""; }
    std::string operator()(const std::vector<std::string>& v) const {
      std::string text = "[";
      for (size_t i = 0; i < v.size(); ++i) text += (i ? ", \"" : "\"") + v[i] + "\"";
      return text + "]";
    }
    std::string operator()(const std::vector<double>& v) const {
      std::string text = "[";
      for (size_t i = 0; i < v.size(); ++i) text += (i ? ", " : "") + NumberText(v[i]);
      return text + "]";
    }
    std::string operator()(const RawParams&) const { return "{}"; }
  };
  return std::visit(Visitor{}, value);
}

std::string ConfigKeysMarkdown() {
  static const char* const kTypes[] = {
      "int", "number", "bool", "string", "array of strings", "array of numbers", "table"};
  const ExperimentConfig defaults;
  auto cell = [](std::string text) {
    std::string out;
    for (char ch : text) {
      if (ch == '\n') {
        out += "\\n";
      } else {
        if (ch == '|') out += '\\';
        out += ch;
      }
    }
    return out;
  };
  std::string md =
      "| key | type | default | unit | range | recorded | meaning |\n"
      "|---|---|---|---|---|---|---|\n";
  for (const ConfigKey& k : ConfigKeys()) {
    std::string def = k.default_text;
    if (def.empty()) def = "`" + KeyValueText(k.get(defaults)) + "`";
    std::string range = k.range_text;
    if (!k.choices.empty()) {
      range.clear();
      for (const std::string& c : k.choices) range += (range.empty() ? "`" : ", `") + c + "`";
    } else if (range.empty()) {
      range = RangeText(k);
    }
    const std::string recorded = !k.resolved            ? "never"
                                 : k.record_doc.empty() ? "always"
                                                        : k.record_doc;
    md += "| `" + k.name + "` | " + kTypes[static_cast<int>(k.type)] + " | " + cell(def) + " | " +
          k.unit + " | " + cell(range) + " | " + recorded + " | " + cell(k.doc) + " |\n";
  }
  return md;
}

}  // namespace vtoken::cli
