// `vtoken-cli merge A.db B.db ... --into C.db`: copies the completed runs of result databases
// (e.g. the shards of a sweep run on several machines) into one, skipping runs whose
// (config hash, sweep) C already has completed. Sources are not modified.
#include <cstdio>
#include <string>
#include <vector>

#include "apps/vtoken-cli/commands/command.h"
#include "lib/engine/result_store.h"

namespace vtoken::cli {
namespace {

struct MergeArgs {
  std::vector<std::string> sources;
  std::string into;
};

int RunMerge(const MergeArgs& a) {
  StatusOr<engine::ResultStore> target = engine::ResultStore::Open(a.into);
  if (!target.ok()) {
    PrintError(target.status());
    return 1;
  }
  engine::MergeStats stats;
  Status s = target->MergeInto(a.sources, &stats);
  if (!s.ok()) {
    PrintError(s);
    return 1;
  }
  std::printf("merged %zu database%s into %s: %lld runs copied, %lld skipped (already there)\n",
              a.sources.size(), a.sources.size() == 1 ? "" : "s", a.into.c_str(),
              static_cast<long long>(stats.runs_copied),
              static_cast<long long>(stats.runs_skipped));
  return 0;
}

CLI::App* SetupMerge(CLI::App& app) {
  auto a = std::make_shared<MergeArgs>();
  CLI::App* cmd =
      app.add_subcommand("merge", "Copy the completed runs of result databases into one");
  cmd->add_option("sources", a->sources, "Source databases")->required();
  cmd->add_option("--into", a->into, "Target database (created if missing)")->required();
  cmd->callback([a] { SetExitCode(RunMerge(*a)); });
  return cmd;
}

}  // namespace

VTOKEN_REGISTER_COMMAND("merge", SetupMerge);

}  // namespace vtoken::cli
