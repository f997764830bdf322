// `vtoken-cli runs`: lists the runs in a result database (newest last), with their status, so
// failed and interrupted runs are visible.
#include <cstdio>
#include <string>

#include "apps/vtoken-cli/commands/cli_checks.h"
#include "apps/vtoken-cli/commands/command.h"
#include "lib/engine/result_store.h"

namespace vtoken::cli {
namespace {

int RunRuns(const std::string& db, int64_t last, const std::string& sweep) {
  StatusOr<engine::ResultStore> store = engine::ResultStore::OpenReadOnly(db);
  if (!store.ok()) {
    PrintError(store.status());
    return 1;
  }
  StatusOr<std::vector<engine::RunRecord>> runs =
      store->ListRuns({.ids = {}, .sweep = sweep, .status = "", .last = last});
  if (!runs.ok()) {
    PrintError(runs.status());
    return 1;
  }
  std::printf("%5s  %-20s  %-11s  %-7s  %-14s  %-16s  %-15s  %s\n", "id", "created", "status",
              "mode", "policy", "model", "workload", "sweep / error");
  for (const engine::RunRecord& r : *runs) {
    std::string note = r.sweep;
    if (!r.error.empty()) note += (note.empty() ? "" : " / ") + r.error;
    std::printf("%5lld  %-20s  %-11s  %-7s  %-14s  %-16s  %-15s  %s\n",
                static_cast<long long>(r.id), r.created.c_str(), r.status.c_str(), r.mode.c_str(),
                r.policy.empty() ? "-" : r.policy.c_str(), r.model.c_str(), r.workload.c_str(),
                note.c_str());
  }
  return 0;
}

CLI::App* SetupRuns(CLI::App& app) {
  struct Args {
    std::string db = "results/vtoken.db";
    int64_t last = 0;
    std::string sweep;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("runs", "List the runs in a result database");
  cmd->add_option("--db", a->db, "Result database")->capture_default_str();
  cmd->add_option("--last", a->last, "Only the last N runs")->check(IntIn(1));
  cmd->add_option("--sweep", a->sweep, "Only the runs of this sweep");
  cmd->callback([a] { SetExitCode(RunRuns(a->db, a->last, a->sweep)); });
  return cmd;
}

}  // namespace

VTOKEN_REGISTER_COMMAND("runs", SetupRuns);

}  // namespace vtoken::cli
