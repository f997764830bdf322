// Which instruction set the CPU kernels (cpu_ops.cc's matrix tiles, cpu_paged_attention.cc) run
// on. Each kernel is compiled once per level below, with tile shapes whose accumulators fit that
// level's vector registers (AVX-512: 32 of 16 floats; AVX2 + FMA: 16 of 8; SSE2: 16 of 4), and
// chosen at run time: the best level the CPU has, or a lower one asked for (tests, benchmarks,
// VTOKEN_CPU_ISA). Both kernels sum in one order on every level, the 16-lane order of
// cpu_simd.h's Lanes16, so AVX-512 and AVX2 give the same bits; the baseline (no FMA) rounds its
// multiply-adds separately. (The step's other loops, RMSNorm's sum of squares for one, vectorize
// through `omp simd` and sum in the order of the vector width.) Torch-free.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "lib/core/status.h"

namespace vtoken::model {

enum class CpuIsa {
  kBaseline,  // x86-64 (SSE2), or any non-x86 CPU: the compiler's own vectorization.
  kAvx2,      // x86-64-v3: AVX2, FMA, BMI2.
  kAvx512,    // x86-64-v4: AVX-512 F/BW/CD/DQ/VL.
};

// "baseline", "avx2", "avx512".
std::string_view CpuIsaName(CpuIsa isa);

// A name as CpuIsaName writes it; InvalidArgument `CPU ISA 'x': must be one of baseline, avx2,
// avx512` otherwise.
StatusOr<CpuIsa> ParseCpuIsa(std::string_view name);

// The best level this CPU has.
CpuIsa HostCpuIsa();

// Every level this CPU runs, lowest first (kBaseline up to HostCpuIsa()).
std::vector<CpuIsa> HostCpuIsas();

// The level the kernels run on now: HostCpuIsa() unless SetCpuIsa chose another.
CpuIsa ActiveCpuIsa();

// Runs the kernels on `isa` from now on (process wide; not while a kernel runs). InvalidArgument
// when the CPU lacks it: `CPU ISA avx512: this CPU has avx2 at most`.
Status SetCpuIsa(CpuIsa isa);

// The CPU's model name as the kernel reports it (/proc/cpuinfo's first "model name"), e.g.
// "AMD EPYC 7B13"; "unknown" where there is none. For run records and benchmark contexts.
std::string CpuModelName();

// Applies VTOKEN_CPU_ISA when it is set (ParseCpuIsa, then SetCpuIsa; the error names the
// variable); OK and nothing changed when it is unset or empty.
Status ApplyCpuIsaEnvironment();

}  // namespace vtoken::model
