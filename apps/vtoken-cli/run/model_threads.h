// The thread count `run`, `sweep` and `generate` give the model's step (model::SetCpuThreads,
// lib/model/cpu_threads.h). Torch-free.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

namespace vtoken::cli {

// model.threads / --threads when not 0; else OMP_NUM_THREADS when it is a positive integer
// (`sweep --jobs N` sets it to CPUs / N for each run it starts, so that N runs share the
// machine instead of each taking all of it); else 0, every CPU this process may use.
inline int64_t ModelThreads(int64_t configured) {
  if (configured != 0) return configured;
  const char* env = std::getenv("OMP_NUM_THREADS");
  if (env == nullptr) return 0;
  char* end = nullptr;
  const long n = std::strtol(env, &end, 10);
  return end != env && *end == '\0' && n > 0 && n <= 1024 ? n : 0;
}

}  // namespace vtoken::cli
