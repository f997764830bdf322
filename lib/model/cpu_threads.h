// How many threads the model runtime computes with on the CPU. torch's intra-op pool is process
// wide, and libtorch 1.13 sizes it from the cores it can see through cpuinfo, which on some
// virtual machines is one although two CPUs are usable: the fused CPU step then runs on one
// core. The runtime therefore sets it explicitly, from `[model] threads` / `--threads`.
#pragma once

#include <memory>

#include "lib/core/status.h"
#include "lib/model/cpu_pool.h"

namespace vtoken::model {

// A step's bits do not depend on the thread count (docs/ARCHITECTURE.md). The fused step's own
// kernels sum in a fixed order; prefill chunks go through the BLAS. Under OpenBLAS (Debian's
// libtorch) the step makes one-thread calls cut by a fixed row count (cpu_blas_gemm.h): OpenBLAS's
// own split over threads would change the bits. MKL (PyPI's torch wheels) takes whole GEMMs and
// splits them otherwise unless its strict reproducibility mode is on. Loading this library
// therefore sets MKL_CBWR=AUTO,STRICT in the environment, before MKL reads it, unless MKL_CBWR is
// already set (a user's own setting wins); nothing else reads the variable. The value in effect:
const char* MklCbwr();

// The CPUs this process may run on (its affinity mask), at least 1.
int CpuThreadsAvailable();

// Sets torch's intra-op threads and OpenBLAS's (when torch runs on OpenBLAS): `threads` > 0 as
// given, 0 for CpuThreadsAvailable(). Returns the count now in effect; InvalidArgument
// `threads -1: must be 0 (every available CPU) or more`.
StatusOr<int> SetCpuThreads(int threads);

// The process's pool for the fused CPU step, with as many threads as torch's intra-op pool, so
// that SetCpuThreads (or torch::set_num_threads) sizes both; made again when that count changes.
// The caller keeps the pointer for the step: a resize never pulls a pool from under a running one.
std::shared_ptr<CpuPool> TorchThreadsPool();

}  // namespace vtoken::model
