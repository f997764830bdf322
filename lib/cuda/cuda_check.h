// Internal to lib/cuda: turns CUDA runtime error codes into vtoken::Status. Includes the CUDA
// runtime headers, so only lib/cuda's own .cc files include it.
#pragma once

#include <cuda_runtime_api.h>

#include "lib/core/status.h"

namespace vtoken::cuda {

// OK for cudaSuccess; otherwise ResourceExhausted for out-of-memory, Internal for anything else,
// with the message "<what>: <cudaGetErrorName>: <cudaGetErrorString>".
Status CudaStatus(cudaError_t error, const char* what);

}  // namespace vtoken::cuda

// Evaluates a CUDA runtime call and returns its error as a Status naming the call.
#define VTOKEN_CUDA_RETURN_IF_ERROR(call) \
  VTOKEN_RETURN_IF_ERROR(::vtoken::cuda::CudaStatus((call), #call))
