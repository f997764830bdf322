// Subcommand registry for vtoken-cli. Each cmd_*.cc file defines one subcommand and registers
// it at static-initialization time with VTOKEN_REGISTER_COMMAND; main() attaches them all to
// the CLI11 app. Executables link every object file, so static registration is safe here.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "lib/core/status.h"

namespace vtoken::cli {

// Adds a subcommand to `app` and returns it; the subcommand's callback runs the command and
// stores its exit code with SetExitCode.
using CommandSetup = std::function<CLI::App*(CLI::App& app)>;

struct CommandEntry {
  std::string name;
  CommandSetup setup;
};

// Returns all registered commands sorted by name.
std::vector<CommandEntry>& Commands();

bool RegisterCommand(std::string name, CommandSetup setup);

// Prints "vtoken-cli: error: MESSAGE" (the status's message, one line) on stderr.
void PrintError(const Status& status);

// A command's end: PrintError when `status` is not OK, and exit code 0 or 1.
void FinishWith(const Status& status);

// The exit code main() returns after the selected subcommand ran.
void SetExitCode(int code);
int ExitCode();

}  // namespace vtoken::cli

#define VTOKEN_REGISTER_COMMAND(name, fn) \
  static const bool vtoken_command_registered_##fn = ::vtoken::cli::RegisterCommand(name, fn)
