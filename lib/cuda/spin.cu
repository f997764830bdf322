// A kernel that keeps a stream busy for a given time: tests and benchmarks delay a stream with it
// to widen a race window (a copy still running when its consumer is queued).
#include "lib/cuda/kernels.h"

namespace vtoken::cuda::internal {
namespace {

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void SpinKernel(uint64_t nanoseconds) {
  const uint64_t start = GlobalTimerNs();
  while (GlobalTimerNs() - start < nanoseconds) __nanosleep(1000);
}

}  // namespace

cudaError_t LaunchSpin(int64_t microseconds, cudaStream_t stream) {
  SpinKernel<<<1, 1, 0, stream>>>(static_cast<uint64_t>(microseconds) * 1000);
  return cudaGetLastError();
}

}  // namespace vtoken::cuda::internal
