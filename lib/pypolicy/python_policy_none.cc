// RegisterPythonPolicy in a build without Python (CMake found no python3-dev or pybind11-dev).
#include <cstdlib>
#include <string>

#include "lib/pypolicy/python_policy.h"

namespace vtoken {

bool PythonPoliciesAvailable() { return false; }

StatusOr<std::string> RegisterPythonPolicy(std::string_view spec) {
  return FailedPreconditionError("python policy '" + std::string(spec) +
                                 "': this build has no Python (install python3-dev and "
                                 "pybind11-dev, scripts/setup.sh does, and configure again)");
}

Status RegisterPythonPoliciesFromEnvironment() {
  const char* env = std::getenv("VTOKEN_PYTHON_POLICIES");
  if (env == nullptr || *env == 0) return Status::Ok();
  const Status refused = RegisterPythonPolicy(env).status();
  return Status(refused.code(), "VTOKEN_PYTHON_POLICIES: " + refused.message());
}

}  // namespace vtoken
