// vtoken-cli: the workbench's command-line front end. Subcommands live in cmd_*.cc files.
#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "apps/vtoken-cli/commands/command.h"
#include "lib/pypolicy/python_policy.h"

int main(int argc, char** argv) {
  // glibc returning large buffers to the OS after every torch op causes page-fault storms on
  // these machines (training step 11 s -> 1.5 s); keep freed memory in the process instead.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // torch's OpenMP pool and OpenBLAS's pool spin against each other on small machines. The
  // OpenMP runtime reads its environment when it is loaded, before main(), so re-exec once.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    setenv("OMP_WAIT_POLICY", "PASSIVE", /*overwrite=*/1);
    execv("/proc/self/exe", argv);  // Only returns on failure; then run with the default policy.
  }

  // Python policies (lib/pypolicy/python_policy.h) join the registry before any command reads
  // it: VTOKEN_PYTHON_POLICIES, then each --python-policy FILE.py:CLASS before the command.
  if (vtoken::Status env = vtoken::RegisterPythonPoliciesFromEnvironment(); !env.ok()) {
    std::fprintf(stderr, "vtoken-cli: error: %s\n", env.message().c_str());
    return 2;
  }
  std::vector<std::string> python_policies;
  for (int i = 1; i < argc && argv[i][0] == '-'; ++i) {
    const std::string arg = argv[i];
    std::string spec;
    if (arg == "--python-policy" && i + 1 < argc) {
      spec = argv[++i];
    } else if (arg.rfind("--python-policy=", 0) == 0) {
      spec = arg.substr(std::string("--python-policy=").size());
    } else {
      continue;
    }
    vtoken::StatusOr<std::string> name = vtoken::RegisterPythonPolicy(spec);
    if (!name.ok()) {
      std::fprintf(stderr, "vtoken-cli: error: %s\n", name.status().message().c_str());
      return 2;
    }
  }

  CLI::App app{"vtoken-cli: token-level KV-cache virtualization workbench"};
  app.require_subcommand(1);
  app.add_option("--python-policy", python_policies,
                 "Register the policy class CLASS of FILE.py (before the command; repeatable; "
                 "also VTOKEN_PYTHON_POLICIES=SPEC,SPEC): docs/WRITING_A_POLICY.md");
  for (const auto& entry : vtoken::cli::Commands()) entry.setup(app);
  // CLI11 would take an empty --db as "not given" (the default database) or SQLite as a
  // temporary one; an unknown first word as "A subcommand is required".
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--db" && i + 1 < argc && argv[i + 1][0] == 0) || arg == "--db=") {
      std::fprintf(stderr, "vtoken-cli: error: --db must name a database file, got ''\n");
      return 2;
    }
  }
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const auto& entry : vtoken::cli::Commands()) {
      known = known || entry.name == argv[1];
      names += (names.empty() ? "" : ", ") + entry.name;
    }
    if (!known) {
      std::fprintf(stderr, "vtoken-cli: error: unknown command '%s' (commands: %s)\n", argv[1],
                   names.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "vtoken-cli: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vtoken-cli: error: %s\n", e.what());
    return 1;
  }
  return vtoken::cli::ExitCode();
}
