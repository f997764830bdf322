// DESIGN.md §3's layering, enforced on the sources: lib/core includes only the standard library,
// xxhash and its own headers; only lib/model includes torch; only lib/cuda includes CUDA headers;
// only the result store includes SQLite; only apps/ parses TOML. And every source names the
// standard headers of the C library parts it uses (GCC 13's libstdc++ no longer includes
// <cstdint> and <cstdio> from its other headers: the GPU machine's compiler is GCC 13).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace fs = std::filesystem;

fs::path SourceDir() {
  const char* dir = std::getenv("VTOKEN_SOURCE_DIR");
  return dir != nullptr ? fs::path(dir) : fs::current_path();
}

// An `#include` line: [1] the delimiter (`<` or `"`), [2] the target.
const std::regex& IncludeLine() {
  static const std::regex include(R"(^\s*#\s*include\s*([<"])([^>"]+)[>"])");
  return include;
}

// The .h/.cc/.cu/.cuh files under `dir`.
std::vector<fs::path> SourceFiles(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    const std::string ext = entry.path().extension().string();
    if (ext == ".h" || ext == ".cc" || ext == ".cu" || ext == ".cuh") out.push_back(entry.path());
  }
  return out;
}

// Every `#include` target of the source files under `dir`, with its file.
std::vector<std::pair<std::string, std::string>> Includes(const fs::path& dir) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const fs::path& file : SourceFiles(dir)) {
    std::ifstream in(file);
    std::string line;
    std::smatch m;
    while (std::getline(in, line)) {
      if (std::regex_search(line, m, IncludeLine())) out.emplace_back(file.string(), m[2]);
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

// lib/runner: the model runner interface the engine and the simulator drive (and LlamaRunner
// implements) sits below all three, on the standard library and lib/core alone.
TEST(LayeringTest, RunnerInterfaceIncludesOnlyStdAndCore) {
  const auto includes = Includes(SourceDir() / "lib/runner");
  ASSERT_FALSE(includes.empty()) << "lib/runner not found under " << SourceDir();
  for (const auto& [file, header] : includes) {
    const bool core = header.rfind("lib/core/", 0) == 0;
    const bool std_header = header.find('.') == std::string::npos;
    EXPECT_TRUE(core || std_header) << file << " includes " << header;
  }
}

TEST(LayeringTest, FrameworkHeadersStayInTheirLayers) {
  const std::vector<std::string> torch = {"torch/", "ATen/", "c10/"};
  const std::vector<std::string> cuda = {"cuda", "cub/", "thrust/"};
  for (const char* dir :
       {"lib/core", "lib/runner", "lib/engine", "policies", "signals", "lib/model/io"}) {
    for (const auto& [file, header] : Includes(SourceDir() / dir)) {
      EXPECT_FALSE(Forbidden(header, torch)) << file << " includes " << header;
      EXPECT_FALSE(Forbidden(header, cuda)) << file << " includes " << header;
      EXPECT_FALSE(Forbidden(header, {"toml++/"})) << file << " includes " << header;
    }
  }
  for (const auto& [file, header] : Includes(SourceDir() / "lib")) {
    if (header == "sqlite3.h") {
      EXPECT_NE(file.find("lib/engine/sqlite_db.cc"), std::string::npos) << file;
    }
  }
}

// One source file: the standard headers it includes, the project headers it includes (resolved
// to paths) and its text without line comments and string literals.
struct SourceFile {
  std::set<std::string> std_headers;
  std::vector<fs::path> own_headers;
  std::string code;
};

SourceFile ReadSource(const fs::path& file) {
  SourceFile out;
  const std::regex literal(R"("(\\.|[^"\\])*")");
  std::ifstream in(file);
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, IncludeLine())) {
      const std::string header = m[2];
      fs::path own;
      for (const fs::path& base : {SourceDir(), file.parent_path()}) {
        if (fs::exists(base / header)) own = base / header;
      }
      if (m[1] == "\"" && !own.empty()) {
        out.own_headers.push_back(own.lexically_normal());
      } else {
        out.std_headers.insert(header);
      }
      continue;
    }
    const size_t comment = line.find("//");
    if (comment != std::string::npos) line.resize(comment);
    out.code += std::regex_replace(line, literal, "\"\"") + "\n";
  }
  return out;
}

TEST(LayeringTest, SourcesIncludeTheCHeadersTheyUse) {
  // A use, and the standard header that declares it (or its <name.h> form). Functions count with
  // their std:: prefix only, as the project writes them (a variable named `free` is no use).
  const std::vector<std::pair<std::string, std::regex>> uses = {
      {"cstdint", std::regex(R"(\bu?int(8|16|32|64)_t\b|\bu?intptr_t\b)")},
      {"cstdio", std::regex(R"(\bstd::(f?printf|snprintf|fopen|fclose|fputs|puts|fflush|fwrite|)"
                            R"(fread|fgets|FILE|perror)\b)")},
      {"cstring", std::regex(R"(\bstd::(memcpy|memset|memcmp|memmove|strlen|strcmp|strncmp|)"
                             R"(strerror)\b)")},
      {"cstdlib", std::regex(R"(\bstd::(getenv|setenv|exit|abort|strtol|strtoll|strtoull|)"
                             R"(strtod|atoi|malloc|free)\b)")},
  };
  std::map<fs::path, SourceFile> files;
  for (const char* dir : {"lib", "apps", "bench", "tests", "policies", "signals", "python"}) {
    if (!fs::exists(SourceDir() / dir)) continue;
    for (const fs::path& file : SourceFiles(SourceDir() / dir)) {
      files[file.lexically_normal()] = ReadSource(file);
    }
  }
  ASSERT_GT(files.size(), 200u) << "sources not found under " << SourceDir();
  // The standard headers a file sees through itself and the project's headers it includes.
  std::map<fs::path, std::set<std::string>> seen;
  const auto visible = [&](const fs::path& file, auto& self) -> const std::set<std::string>& {
    if (const auto it = seen.find(file); it != seen.end()) return it->second;
    std::set<std::string>& out = seen[file];  // Empty while in progress: include cycles end.
    const auto source = files.find(file);
    if (source == files.end()) return out;
    std::set<std::string> all = source->second.std_headers;
    for (const fs::path& header : source->second.own_headers) {
      const std::set<std::string>& more = self(header, self);
      all.insert(more.begin(), more.end());
    }
    return seen[file] = std::move(all);
  };
  int checked = 0;
  for (const auto& [file, source] : files) {
    for (const auto& [header, use] : uses) {
      if (!std::regex_search(source.code, use)) continue;
      ++checked;
      const std::set<std::string>& headers = visible(file, visible);
      const std::string c_form = header.substr(1) + ".h";  // cstdint -> stdint.h
      EXPECT_TRUE(headers.contains(header) || headers.contains(c_form))
          << file.string() << " uses " << header << " but neither it nor the project headers it "
          << "includes include <" << header << ">";
    }
  }
  EXPECT_GT(checked, 100);  // The patterns still find uses.
}

}  // namespace
