#include "apps/vtoken-cli/commands/command.h"

#include <algorithm>
#include <cstdio>

#include "apps/vtoken-cli/commands/model_check.h"

namespace vtoken::cli {
namespace {
int g_exit_code = 0;
}  // namespace

std::vector<CommandEntry>& Commands() {
  static std::vector<CommandEntry> commands;
  return commands;
}

bool RegisterCommand(std::string name, CommandSetup setup) {
  auto& commands = Commands();
  commands.push_back({std::move(name), std::move(setup)});
  std::sort(commands.begin(), commands.end(),
            [](const CommandEntry& a, const CommandEntry& b) { return a.name < b.name; });
  return true;
}

void SetExitCode(int code) { g_exit_code = code; }

void PrintError(const Status& status) {
  std::fprintf(stderr, "vtoken-cli: error: %s\n", status.message().c_str());
}

void FinishWith(const Status& status) {
  if (!status.ok()) PrintError(status);
  SetExitCode(status.ok() ? 0 : 1);
}

ModelCheckFn& ModelCheckHook() {
  static ModelCheckFn hook = nullptr;
  return hook;
}
int ExitCode() { return g_exit_code; }

}  // namespace vtoken::cli
