// Helpers of the GoogleTest drivers of the vtoken-cli binary (tests/cli/*_test.cc): a scratch
// directory per test, result databases written through the ResultStore API (no model, no
// libtorch), and running the binary (VTOKEN_CLI_PATH, set by tests/CMakeLists.txt) with its exit
// code, stdout and stderr captured.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "lib/engine/result_store.h"

namespace vtoken::cli {

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// The source tree (VTOKEN_SOURCE_DIR, set by tests/CMakeLists.txt; "." when unset).
inline std::string SourceDir() {
  const char* dir = std::getenv("VTOKEN_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

inline std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("vtoken_cli_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // Runs `vtoken-cli ARGS...` (arguments single-quoted for the shell).
  CliResult Cli(const std::vector<std::string>& args) const {
    std::string command = Quote(VTOKEN_CLI_PATH);
    for (const std::string& a : args) command += " " + Quote(a);
    const std::string out = Path("cli.out"), err = Path("cli.err");
    command += " >" + Quote(out) + " 2>" + Quote(err);
    const int status = std::system(command.c_str());
    CliResult r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = ReadFile(out);
    r.err = ReadFile(err);
    return r;
  }

  // Begins a run as `vtoken-cli run` records it (resolved config and record fields); the test
  // appends its rows and finishes it.
  static int64_t BeginRun(engine::ResultStore& store, const std::string& config_toml,
                          const std::string& mode, const std::string& policy,
                          const std::string& sweep) {
    engine::RunRecord r;
    r.config_toml = config_toml;
    r.config_hash = std::to_string(std::hash<std::string>{}(config_toml));
    r.sweep = sweep;
    r.model = "models/vt-tiny";
    r.mode = mode;
    r.policy = policy;
    r.block_size = 16;
    r.num_blocks = 384;
    r.workload = "longbench_like";
    StatusOr<int64_t> id = store.BeginRun(r);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return id.ok() ? *id : 0;
  }

  std::filesystem::path dir_;

 private:
  static std::string Quote(const std::string& s) {
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
  }
};

}  // namespace vtoken::cli
