// CpuGemm: y = x W^T (+ bias) (+ y) for prefill chunks of the fused CPU step, with W row-major
// [out_features, in_features] as checkpoints store it: the GEMM-shaped counterpart of CpuLinear
// (cpu_ops.h), in kernels of this library per instruction set (cpu_isa.h) instead of the BLAS's.
//
// Why not the BLAS: which kernels OpenBLAS runs is decided by its CPU table or by
// OPENBLAS_CORETYPE, not by the instruction sets the CPU has: Debian's OpenBLAS 0.3.21 does not
// know AMD's Zen 5, and a machine that sets OPENBLAS_CORETYPE=Haswell (rather than let it fall
// back to generic code) runs 256-bit kernels on a CPU whose AVX-512 units are 512 bits wide. On
// such a host (docs/PERFORMANCE.md) SmolLM2's 512-token prefill ran at 1,280 tokens/s with these
// kernels against 919 with OpenBLAS's Haswell ones; at the AVX2 level OpenBLAS's Haswell kernels
// were the faster (834 against 754), so the fused step uses CpuGemm where UseCpuGemm() says.
//
// How: for each panel of kPanel outputs, W's panel is packed k-major ([in][kPanel], a few hundred
// KB at most, reused by every row tile), then tiles of kRows rows x kPanel outputs are computed
// with every accumulator in a register: per input feature, kPanel / lanes loads of the packed
// panel, kRows broadcasts of x, kRows * kPanel / lanes FMAs (AVX-512: 8 x 48 with 24
// accumulators, which on SmolLM2's prefill beat 12 x 32, 6 x 64 and 4 x 64; AVX2: 6 x 16 with 12,
// which beat 4 x 24 and 3 x 32; SSE2: 4 x 8). Rows go in blocks of kGemmBlockRows so that x's
// block stays in L2 while the panels pass over it.
//
// Bits: each output is one chain of multiply-adds over the input features in order, from zero,
// then + bias, then + y: the same whatever tile, panel, block or thread computes it, and the same
// on AVX2 as on AVX-512 (vectors run across outputs, never across a sum). The SSE2 baseline has no
// FMA: its products round before the add.
//
// Calls on disjoint output ranges may run in parallel (the fused step splits them over its
// CpuPool).
#pragma once

#include <cstdint>

#include "lib/model/cpu_ops.h"

namespace vtoken::model {

inline constexpr int64_t kGemmBlockRows = 192;

// Outputs per packed panel on the widest level (AVX-512: 48); a split of the outputs into
// multiples of it packs no panel twice. Any split gives the same bits.
inline constexpr int64_t kGemmPanel = 48;

// Whether the fused step's prefill projections use CpuGemm: at the AVX-512 level (ActiveCpuIsa())
// only; below it the BLAS (PoolSgemm under OpenBLAS, torch's addmm under MKL).
bool UseCpuGemm();

// Outputs [o_begin, o_end) of every row.
void CpuGemm(const CpuLinearArgs& args, int64_t o_begin, int64_t o_end);

}  // namespace vtoken::model
