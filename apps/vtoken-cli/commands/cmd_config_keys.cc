// `vtoken-cli config-keys`: the experiment config's key reference, generated from the key table
// (config_keys.h); docs/EXPERIMENTS.md holds its output between the markers a test checks.
#include <cstdio>

#include "apps/vtoken-cli/commands/command.h"
#include "apps/vtoken-cli/config/config_keys.h"

namespace vtoken::cli {
namespace {

CLI::App* SetupConfigKeys(CLI::App& app) {
  CLI::App* cmd =
      app.add_subcommand("config-keys",
                         "Print the experiment config's keys as a Markdown table (name, type, "
                         "default, unit, range, when recorded, meaning)");
  cmd->callback([] {
    std::fputs(ConfigKeysMarkdown().c_str(), stdout);
    SetExitCode(0);
  });
  return cmd;
}

}  // namespace

VTOKEN_REGISTER_COMMAND("config-keys", SetupConfigKeys);

}  // namespace vtoken::cli
