// The [sweep] table of an experiment config: its name, the [sweep.grid] axes, `seeds`, and the
// [[sweep.exclude]] / [[sweep.add]] points (docs/SWEEPS.md). Not part of the resolved config:
// editing the grid leaves the config hashes of existing points unchanged.
#pragma once

#include <toml++/toml.h>

#include <array>
#include <string_view>

#include "apps/vtoken-cli/config/config_source.h"
#include "apps/vtoken-cli/config/experiment_config.h"

namespace vtoken::cli {

// The keys of [sweep] (docs/SWEEPS.md documents each).
inline constexpr std::array<std::string_view, 5> kSweepKeys = {"name", "grid", "seeds", "exclude",
                                                               "add"};

// Reads [sweep] (`t`, nullptr when the file has none) into config.sweep_name (default: the
// experiment's name), config.sweep_grid, sweep_exclude and sweep_add. Errors name the file and
// the key. With `check_points`, also that every exclusion names grid axes and their values, that
// no added point sets a seed key or repeats a point, and that a point is left (a grid expansion).
Status ParseSweep(const toml::table* t, const ConfigSource& source, bool check_points,
                  ExperimentConfig& config);

}  // namespace vtoken::cli
