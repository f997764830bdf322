#include "lib/model/blas_info.h"

#include <dlfcn.h>

namespace vtoken::model {

std::string BlasDescription() {
  // Looked up at run time: torch links whichever libblas the system provides.
  using CharFn = char* (*)();
  using IntFn = int (*)();
  auto config = reinterpret_cast<CharFn>(dlsym(RTLD_DEFAULT, "openblas_get_config"));
  auto core = reinterpret_cast<CharFn>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  auto threads = reinterpret_cast<IntFn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (config == nullptr || core == nullptr) return "unknown BLAS (not OpenBLAS)";
  std::string out = std::string(config()) + " (core " + core();
  if (threads != nullptr) out += ", " + std::to_string(threads()) + " threads";
  return out + ")";
}

}  // namespace vtoken::model
