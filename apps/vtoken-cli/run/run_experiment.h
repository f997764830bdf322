// Running one experiment config (all its modes) into the result store; shared by `run` and
// `sweep`. Prints a live progress line on stderr.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "apps/vtoken-cli/config/experiment_config.h"
#include "lib/core/status.h"
#include "lib/engine/prefill_memo.h"

namespace vtoken::cli {

struct RunOutcome {
  std::vector<int64_t> run_ids;  // One per mode, in config.modes order.
};

// Validates everything (model, tokenizer, workload, engine options for every mode) before it
// opens the database; then runs each mode as one run. `sweep` tags the runs. A failing mode is
// marked failed in the database and its error returned.
// `record_signals` (non-empty): every mode's policy signals are written to that trace file
// (lib/sim/signal_trace.h), for replay by a sim: model.
// `memo` (optional, lib/engine/prefill_memo.h): prompt prefills computed by an earlier run that
// used it (an earlier mode, or an earlier point of a sweep) are restored instead of computed; the
// run records how many tokens were (summary prefill_restored_tokens) and, when any were, no
// request times (engine::DropRequestTimes): they would not time the model.
StatusOr<RunOutcome> RunExperiment(const ExperimentConfig& config, const std::string& db_path,
                                   const std::string& sweep, bool dry_run,
                                   const std::string& record_signals = "",
                                   engine::PrefillMemo* memo = nullptr);

// Prints the summary table of `run_ids` (ratios against the first) from the database.
Status PrintComparison(const std::string& db_path, const std::vector<int64_t>& run_ids);

}  // namespace vtoken::cli
