// The resolved experiment config a run recorded (runs.config_toml) as flat dotted keys, and the
// keys that tell a set of runs apart: what `compare` shows as config rows, `report` as grid axes
// and `export` as config columns. Needs nothing but the database.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "lib/core/status.h"

namespace vtoken::cli {

// Leaf key ("engine.max_num_seqs") -> value text.
using FlatConfig = std::map<std::string, std::string>;

// Returns the leaves of `config_toml` by dotted key: strings bare, floats in their shortest
// round-trip form (0.1, not 0.10000000000000001), everything else as TOML writes it ("8", "true",
// "[ 'naive' ]"). kDataLoss, naming `what` (e.g. "result db X: run 3"), when it does not parse.
StatusOr<FlatConfig> FlattenConfig(const std::string& config_toml, const std::string& what);

// The keys `[sweep] seeds` sets: runs whose configs differ only in these are repetitions (seeds)
// of one point, which `report` and `export --table points` average.
inline const std::set<std::string> kSeedKeys = {"seed", "workload.seed"};

// `config` without `modes` and the seed keys: what the runs of one seed point share.
FlatConfig SeedPointConfig(FlatConfig config);

// The seed points of `n` runs: run i's indexes grouped by (label(i), SeedPointConfig(config(i))),
// groups in the order of their first run. `label` tells apart what the config does not (the
// run's mode; `export` adds its sweep).
std::vector<std::vector<size_t>> GroupSeedPoints(
    size_t n, const std::function<const FlatConfig&(size_t)>& config,
    const std::function<std::string(size_t)>& label);

// Returns, sorted, the keys whose value is not the same in every config of `configs` (a key
// missing from a config counts as a value of its own), leaving out those in `ignore`.
std::vector<std::string> VaryingKeys(const std::vector<const FlatConfig*>& configs,
                                     const std::set<std::string>& ignore);

// VaryingKeys where `native[i]` says configs[i] is a native run's: it has no say on the keys it
// does not read (policy.*, reclaim.*), which it records not at all (or, in older databases, as
// they were).
std::vector<std::string> VaryingKeys(const std::vector<const FlatConfig*>& configs,
                                     const std::vector<bool>& native,
                                     const std::set<std::string>& ignore);

// `config` without the keys a native run does not read (policy.* and reclaim.*): a native run
// records none of them (older databases' native runs do), so runs compare against their native
// baseline through this view.
FlatConfig NativeView(const FlatConfig& config);
// Whether a native run does not read `key` (policy.* and reclaim.*).
bool NativeIgnores(const std::string& key);

// Returns the value of `key` in `config`, or `missing` when it has none.
std::string ConfigValue(const FlatConfig& config, const std::string& key,
                        const std::string& missing = "-");

}  // namespace vtoken::cli
