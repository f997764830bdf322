// `vtoken-cli fit-signals TRACE`: fits the parametric attention model of the sim backend
// (lib/sim/parametric_signals.h) to a signal trace recorded by `run --record-signals`, prints the
// parameters as a [sim.parametric] table and how well H2O's choices agree under the fit.
#include <cstdio>
#include <string>

#include "apps/vtoken-cli/commands/command.h"
#include "lib/sim/fit.h"

namespace vtoken::cli {
namespace {

struct FitArgs {
  std::string trace;
  std::string mode;
};

int RunFit(const FitArgs& a) {
  StatusOr<sim::SignalTrace> trace = sim::ReadSignalTrace(a.trace);
  if (!trace.ok()) {
    PrintError(trace.status());
    return 1;
  }
  StatusOr<sim::FitResult> fit = sim::FitParametric(*trace, a.mode);
  if (!fit.ok()) {
    std::fprintf(stderr, "vtoken-cli: error: %s: %s\n", a.trace.c_str(),
                 fit.status().message().c_str());
    return 1;
  }
  std::printf("# %s (model %s, %zu records)\n%s", a.trace.c_str(), trace->model.c_str(),
              trace->records.size(), fit->Report().c_str());
  return 0;
}

CLI::App* SetupFit(CLI::App& app) {
  auto a = std::make_shared<FitArgs>();
  CLI::App* cmd = app.add_subcommand(
      "fit-signals", "Fit the sim backend's parametric attention model to a signal trace");
  cmd->add_option("trace", a->trace, "Trace file written by run --record-signals")->required();
  cmd->add_option("--mode", a->mode, "Fit only the records of this mode (default: all)");
  cmd->callback([a] { SetExitCode(RunFit(*a)); });
  return cmd;
}

}  // namespace

VTOKEN_REGISTER_COMMAND("fit-signals", SetupFit);

}  // namespace vtoken::cli
