// The experiment config's key table: one ConfigKey per key of the TOML file of `run` / `sweep`
// (name, type, default, unit, range, one-line doc, where the value lands in ExperimentConfig and
// when the resolved config records it), modelled on the policies' ParamSpec. The one table
// drives parsing (experiment_config.cc), `--set`, range validation, the resolved config that
// is hashed and recorded, docs/EXPERIMENTS.md's key reference (`vtoken-cli config-keys`), the
// CLI flags that mirror keys (FlagName) and the suggestion for a mistyped key.
//
// [sweep] (`name`, `seeds`, `grid`) is not in the table: it is how a config is swept, not what a
// run runs, so it is never part of the resolved config (docs/SWEEPS.md).
// Thread-safe: the table is built once and never changes.
#pragma once

#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "apps/vtoken-cli/config/experiment_config.h"
#include "lib/core/policy_params.h"
#include "lib/core/status.h"

namespace vtoken::cli {

// One key's value. The alternative is the key's type (KeyType = variant index).
using KeyValue = std::variant<int64_t, double, bool, std::string, std::vector<std::string>,
                              std::vector<double>, RawParams>;
enum class KeyType { kInt, kDouble, kBool, kString, kStringList, kDoubleList, kParams };

// TOML spelling of a type, as errors and the docs give it: "an integer", "a number", ...
const char* KeyTypeNoun(KeyType type);

struct ConfigKey {
  std::string name;  // Dotted: "policy.keep_ratio".
  KeyType type = KeyType::kInt;
  std::string unit;  // "tokens", "blocks", "s", "GiB", ... ; empty for none.
  std::string doc;   // One line (docs/EXPERIMENTS.md's cell).
  // Numbers: the accepted range, inclusive unless marked exclusive.
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_exclusive = false;
  bool max_exclusive = false;
  // Strings: the accepted values (empty: any string).
  std::vector<std::string> choices;
  // The docs' default when the value of a default config does not say it ("file stem").
  std::string default_text;
  // The range as errors and docs say it, when the generated one does not ("a finite number >=
  // 0 (0 = greedy)"); errors read "key 'K' must be <range>".
  std::string range_text;
  // Reads the key's effective value.
  std::function<KeyValue(const ExperimentConfig&)> get;
  // Stores a value of the key's type, already checked against range and choices. Errors for a
  // value the table cannot check (a device spec, a preset) say what it must be, without the key.
  std::function<Status(ExperimentConfig&, const KeyValue&)> set;
  // The resolved config (of one mode: config.modes has one element) records the key only when
  // this holds; empty: always. Keeps the hashes of configs from before a key existed.
  std::function<bool(const ExperimentConfig&)> record_when;
  std::string record_doc;  // When record_when is set: when it records, for the docs.
  bool resolved = true;    // false: never recorded (db: where results go, not what ran).
  // The CLI flag spelling of the key in commands that mirror it ("--keep-ratio").
  std::string FlagName() const;
};

// Every key, in the order a config is applied (a key's setter may read the keys before it:
// sim.hardware.preset before the hardware figures, policy.name before policy.params).
const std::vector<ConfigKey>& ConfigKeys();

// The key named `name`, or nullptr.
const ConfigKey* FindConfigKey(std::string_view name);

// True when `name` is a table of the config ("policy", "sim.hardware"): a prefix of some key.
bool IsConfigSection(std::string_view name);

// The known key nearest to `name` by edit distance (also sections and the [sweep] keys), or ""
// when none is close enough to be a typo.
std::string NearestConfigKey(std::string_view name);

// The name of `known` nearest to `name` by edit distance, or "" when none is close enough to be
// a typo (at most a third of the name's characters differ).
std::string NearestName(std::string_view name, const std::vector<std::string>& known);

// The key's accepted values as errors, `--help` and the docs say them: "in (0, 1]", ">= 1",
// "\"reserve\" or \"greedy\"", the key's range_text; "" for a key without a range.
std::string RangeText(const ConfigKey& key);

// "" when `value` (of the key's type) is in the key's range and choices, else what the value
// must be ("in (0, 1]", "\"reserve\" or \"greedy\"").
std::string CheckRange(const ConfigKey& key, const KeyValue& value);

// A value as TOML writes it: 0.25, "h2o", ["native", "naive"].
std::string KeyValueText(const KeyValue& value);

// docs/EXPERIMENTS.md's key reference: a Markdown table, one row per key (key, type, default,
// unit, range, when the resolved config records it, meaning). `vtoken-cli config-keys` prints it.
std::string ConfigKeysMarkdown();

}  // namespace vtoken::cli
