// `vtoken-cli policies`: lists the registered eviction policies with their rule, the lines of
// code of their source file and their parameters; with --token-signals, the registered token
// signals (signals/*.cc, lib/core/token_signal.h) instead.
#include <cstdio>
#include <string>

#include "apps/vtoken-cli/commands/command.h"
#include "lib/core/policy_registry.h"
#include "lib/core/token_signal.h"

namespace vtoken::cli {
namespace {

int RunTokenSignals() {
  std::printf("%-20s %-8s %-14s %5s  %s\n", "token signal", "kind", "reads", "lines", "doc");
  for (const TokenSignalInfo* info : RegisteredTokenSignals()) {
    StatusOr<int64_t> lines = CountCodeLines(info->source_file);
    const std::string count = lines.ok() ? std::to_string(*lines) : "?";
    std::string reads = info->reads_keys() ? "k" : "";
    if (info->reads_values()) reads += reads.empty() ? "v" : ",v";
    if (info->queries) reads += ",queries";
    std::printf("%-20s %-8s %-14s %5s  %s\n", info->name.c_str(),
                info->relative() ? "relative" : "absolute", reads.c_str(), count.c_str(),
                info->doc.c_str());
  }
  return 0;
}

int RunPolicies(bool show_params) {
  std::printf("%-20s %5s  %s\n", "policy", "lines", "rule");
  for (const PolicyInfo* info : RegisteredPolicies()) {
    // A binary run away from its source tree cannot count lines; it still lists the policy.
    StatusOr<int64_t> lines = CountCodeLines(info->source_file);
    const std::string count = lines.ok() ? std::to_string(*lines) : "?";
    std::printf("%-20s %5s  %s\n", info->name.c_str(), count.c_str(), info->rule.c_str());
    if (!show_params) continue;
    for (const ParamSpec& spec : info->params) {
      std::printf("%28s%s = %s (%s): %s\n", "", spec.name.c_str(),
                  ParamValueToString(spec.default_value).c_str(),
                  ParamTypeName(TypeOf(spec.default_value)), spec.help.c_str());
    }
  }
  return 0;
}

CLI::App* SetupPolicies(CLI::App& app) {
  auto show_params = std::make_shared<bool>(false);
  auto token_signals = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand(
      "policies", "List the registered eviction policies: name, lines of code, rule");
  cmd->add_flag("--params", *show_params, "Also list each policy's parameters and defaults");
  cmd->add_flag("--token-signals", *token_signals,
                "List the registered token signals (signals/*.cc) instead: name, lines, doc");
  cmd->callback([show_params, token_signals] {
    SetExitCode(*token_signals ? RunTokenSignals() : RunPolicies(*show_params));
  });
  return cmd;
}

}  // namespace

VTOKEN_REGISTER_COMMAND("policies", SetupPolicies);

}  // namespace vtoken::cli
