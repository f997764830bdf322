// The [sweep] table of an experiment config: its name, the [sweep.grid] axes and `seeds`
// (docs/SWEEPS.md). Not part of the resolved config: editing the grid leaves the config hashes
// of existing points unchanged.
#pragma once

#include <toml++/toml.h>

#include "apps/vtoken-cli/config_source.h"
#include "apps/vtoken-cli/experiment_config.h"

namespace vtoken::cli {

// Reads [sweep] (`t`, nullptr when the file has none) into config.sweep_name (default: the
// experiment's name) and config.sweep_grid. Errors name the file and the key.
Status ParseSweep(const toml::table* t, const ConfigSource& source, ExperimentConfig& config);

}  // namespace vtoken::cli
