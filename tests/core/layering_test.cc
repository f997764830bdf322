// DESIGN.md §3's layering, enforced on the sources: lib/core includes only the standard library,
// xxhash and its own headers; only lib/model includes torch; only lib/cuda includes CUDA headers;
// only the result store includes SQLite; only apps/ parses TOML.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

fs::path SourceDir() {
  const char* dir = std::getenv("VTOKEN_SOURCE_DIR");
  return dir != nullptr ? fs::path(dir) : fs::current_path();
}

// Every `#include` target of the .h/.cc/.cu/.cuh files under `dir`, with its file.
std::vector<std::pair<std::string, std::string>> Includes(const fs::path& dir) {
  std::vector<std::pair<std::string, std::string>> out;
  const std::regex include(R"(^\s*#\s*include\s*[<"]([^>"]+)[>"])");
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".h" && ext != ".cc" && ext != ".cu" && ext != ".cuh") continue;
    std::ifstream in(entry.path());
    std::string line;
    std::smatch m;
    while (std::getline(in, line)) {
      if (std::regex_search(line, m, include)) out.emplace_back(entry.path().string(), m[1]);
    }
  }
  return out;
}

bool Forbidden(const std::string& header, const std::vector<std::string>& prefixes) {
  for (const std::string& p : prefixes) {
    if (header.rfind(p, 0) == 0) return true;
  }
  return false;
}

TEST(LayeringTest, CoreIncludesOnlyStdXxhashAndItself) {
  const auto includes = Includes(SourceDir() / "lib/core");
  ASSERT_GT(includes.size(), 50u) << "lib/core not found under " << SourceDir();
  for (const auto& [file, header] : includes) {
    const bool own = header.rfind("lib/core/", 0) == 0;
    const bool std_header = header.find('.') == std::string::npos;  // <vector>, <span>, ...
    EXPECT_TRUE(own || std_header || header == "xxhash.h") << file << " includes " << header;
  }
}

TEST(LayeringTest, FrameworkHeadersStayInTheirLayers) {
  const std::vector<std::string> torch = {"torch/", "ATen/", "c10/"};
  const std::vector<std::string> cuda = {"cuda", "cub/", "thrust/"};
  for (const char* dir : {"lib/core", "lib/engine", "policies", "lib/model/io"}) {
    for (const auto& [file, header] : Includes(SourceDir() / dir)) {
      EXPECT_FALSE(Forbidden(header, torch)) << file << " includes " << header;
      EXPECT_FALSE(Forbidden(header, cuda)) << file << " includes " << header;
      EXPECT_FALSE(Forbidden(header, {"toml++/"})) << file << " includes " << header;
    }
  }
  for (const auto& [file, header] : Includes(SourceDir() / "lib")) {
    if (header == "sqlite3.h") {
      EXPECT_NE(file.find("lib/engine/result_store.cc"), std::string::npos) << file;
    }
  }
}

}  // namespace
