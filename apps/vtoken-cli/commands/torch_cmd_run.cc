// `vtoken-cli run CONFIG.toml`: one experiment, one run per mode, recorded in SQLite.
#include <cstdio>
#include <string>
#include <vector>

#include "apps/vtoken-cli/commands/command.h"
#include "apps/vtoken-cli/commands/memo_flags.h"
#include "apps/vtoken-cli/config/experiment_config.h"
#include "apps/vtoken-cli/run/interrupt.h"
#include "apps/vtoken-cli/run/run_experiment.h"

namespace vtoken::cli {
namespace {

struct RunArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string db;
  std::string sweep;  // Set by `sweep --jobs` for the runs of its child processes.
  std::string record_signals;
  bool dry_run = false;
  MemoArgs memo;
};

int RunRun(const RunArgs& a) {
  StatusOr<ExperimentConfig> config = LoadExperimentConfig(a.config, a.sets);
  if (!config.ok()) {
    PrintError(config.status());
    return 2;
  }
  const std::string db = a.db.empty() ? config->db : a.db;
  StatusOr<std::unique_ptr<engine::PrefillMemo>> memo = MakeMemo(a.memo);
  if (!memo.ok()) {
    PrintError(memo.status());
    return 2;
  }
  StatusOr<RunOutcome> outcome =
      RunExperiment(*config, db, a.sweep, a.dry_run, a.record_signals,
                    MemoServes(a.memo, config->workload.kind) ? memo->get() : nullptr);
  if (!outcome.ok()) {
    PrintError(outcome.status());
    // 130 / 143 after SIGINT / SIGTERM, as a shell reports a process the signal ended.
    return InterruptSignal() != 0 ? InterruptExitCode() : 1;
  }
  if (a.dry_run) return 0;
  std::printf("\n%s: runs", config->name.c_str());
  for (int64_t id : outcome->run_ids) std::printf(" %lld", static_cast<long long>(id));
  std::printf(" in %s\n\n", db.c_str());
  Status s = PrintComparison(db, outcome->run_ids);
  if (!s.ok()) {
    PrintError(s);
    return 1;
  }
  return 0;
}

CLI::App* SetupRun(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand("run", "Run an experiment config (one run per mode)");
  cmd->add_option("config", a->config, "Experiment TOML file")->required();
  cmd->add_option("--set", a->sets, "Override a config key: section.key=value (repeatable)");
  cmd->add_option("--db", a->db, "Result database (default: the config's db, results/vtoken.db)");
  // Hidden (empty group): only `sweep --jobs N` passes it, to tag its child processes' runs.
  cmd->add_option("--sweep", a->sweep, "Sweep name to tag the runs with")->group("");
  cmd->add_option("--record-signals", a->record_signals,
                  "Write every mode's policy signals to this trace file (replay: [sim] attention "
                  "= \"trace:FILE\")");
  cmd->add_flag("--dry-run", a->dry_run, "Validate and print the resolved config; run nothing");
  AddMemoFlags(*cmd, a->memo);
  cmd->callback([a] { SetExitCode(RunRun(*a)); });
  return cmd;
}

}  // namespace

VTOKEN_REGISTER_COMMAND("run", SetupRun);

}  // namespace vtoken::cli
