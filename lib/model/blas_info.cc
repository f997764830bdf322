#include "lib/model/blas_info.h"

#include <dlfcn.h>

#include "lib/model/cpu_threads.h"

namespace vtoken::model {

std::string BlasDescription() {
  // Looked up at run time: torch links whichever libblas the system provides.
  using CharFn = char* (*)();
  using IntFn = int (*)();
  auto config = reinterpret_cast<CharFn>(dlsym(RTLD_DEFAULT, "openblas_get_config"));
  auto core = reinterpret_cast<CharFn>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  auto threads = reinterpret_cast<IntFn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (config == nullptr || core == nullptr) {
    // MKL, linked into PyPI's libtorch_cpu: its version and the reproducibility mode in effect.
    using VersionFn = void (*)(char*, int);
    if (auto version = reinterpret_cast<VersionFn>(dlsym(RTLD_DEFAULT, "MKL_Get_Version_String"))) {
      char buffer[256] = {};
      version(buffer, sizeof(buffer) - 1);
      return std::string(buffer) + " (MKL_CBWR=" + MklCbwr() + ")";
    }
    return "unknown BLAS (neither OpenBLAS nor MKL)";
  }
  std::string out = std::string(config()) + " (core " + core();
  if (threads != nullptr) out += ", " + std::to_string(threads()) + " threads";
  return out + ")";
}

}  // namespace vtoken::model
