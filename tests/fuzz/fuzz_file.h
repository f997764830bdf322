// The readers under fuzz take a path: each input is written to one scratch file per process
// (in TMPDIR), which the target then opens.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace vtoken::fuzz {

// Writes `data` to this process's scratch file named `suffix` and returns its path.
inline std::string WriteInput(const uint8_t* data, size_t size, const char* suffix) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/vtoken_fuzz_" +
                           std::to_string(::getpid()) + suffix;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

// Aborts with a message: the fuzzer reports it as a crash with this input.
[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "property violated: %s\n", what.c_str());
  std::abort();
}

}  // namespace vtoken::fuzz
