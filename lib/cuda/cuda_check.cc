// CudaStatus, apart from device.cc so that the CPU emulation of the kernels (tests/cuda_emu), which
// has no device plumbing, links the same error conversion as the real build.
#include "lib/cuda/cuda_check.h"

#include <string>
#include <utility>

namespace vtoken::cuda {

Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return Status::Ok();
  std::string message =
      std::string(what) + ": " + cudaGetErrorName(error) + ": " + cudaGetErrorString(error);
  if (error == cudaErrorMemoryAllocation) return ResourceExhaustedError(std::move(message));
  return InternalError(std::move(message));
}

}  // namespace vtoken::cuda
