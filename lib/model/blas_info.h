// Which BLAS the process runs and which kernels it picked: "OpenBLAS 0.3.21 ... (core Haswell,
// 2 threads)", "Intel(R) oneAPI Math Kernel Library Version ... (MKL_CBWR=AUTO,STRICT)" (PyPI's
// torch) or "unknown BLAS ...". Debian's OpenBLAS picks its kernels from the CPU model; on some
// CPUs it falls back to generic ones (e.g. "Prescott") that make prefill several times slower,
// so `run` prints this line in its header and the benchmarks record it in their context.
#pragma once

#include <string>

namespace vtoken::model {

std::string BlasDescription();

}  // namespace vtoken::model
