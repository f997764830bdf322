#include "lib/model/cpu_threads.h"

#include <dlfcn.h>
#include <sched.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>

namespace vtoken::model {
namespace {

// Runs when the program (or library) that links this file is loaded, before main and so before
// any GEMM: MKL reads MKL_CBWR once, at its first use. Strict mode: MKL's ?gemm gives the same
// bits on any thread count (AVX2 and AVX-512 code branches; AUTO picks the CPU's).
const bool kMklCbwrSet = [] {
  setenv("MKL_CBWR", "AUTO,STRICT", /*overwrite=*/0);
  return true;
}();

}  // namespace

const char* MklCbwr() {
  (void)kMklCbwrSet;
  const char* value = std::getenv("MKL_CBWR");
  return value != nullptr ? value : "";
}

int CpuThreadsAvailable() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

StatusOr<int> SetCpuThreads(int threads) {
  if (threads < 0) {
    return InvalidArgumentError("threads " + std::to_string(threads) +
                                ": must be 0 (every available CPU) or more");
  }
  const int n = threads == 0 ? CpuThreadsAvailable() : threads;
  torch::set_num_threads(n);
  // OpenBLAS (prefill GEMMs) keeps a pool of its own that torch's setting does not size: left at
  // its default it spins on the CPUs a 1-thread step was meant to leave alone. Looked up at run
  // time: torch links whichever BLAS the system provides.
  using SetFn = void (*)(int);
  if (auto set = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) set(n);
  return torch::get_num_threads();
}

std::shared_ptr<CpuPool> TorchThreadsPool() {
  static std::mutex mutex;
  static std::shared_ptr<CpuPool> pool;
  const int threads = std::max(1, torch::get_num_threads());
  std::lock_guard<std::mutex> lock(mutex);
  if (pool == nullptr || pool->num_threads() != threads) pool = std::make_shared<CpuPool>(threads);
  return pool;
}

}  // namespace vtoken::model
