// CpuBf16Linear: y = x W^T (+ bias) (+ y) with W held in bfloat16 and x rounded to bfloat16 as
// it is read, summed as AVX-512 BF16's vdpbf16ps sums: half of fp32's weight bytes per decode
// step, and twice fp32's multiply-adds per instruction in prefill chunks.
//
// Bits: W and x are rounded from fp32 to nearest even, a value below the smallest normal float
// to zero (vcvtne2ps2bf16's rule, RoundBf16). Each output o, from zero, over the input pairs
// (2p, 2p + 1) in order: acc = fma(x[2p+1], w[o][2p+1], acc), then acc = fma(x[2p], w[o][2p],
// acc) (vdpbf16ps's order: odd element first, each step rounded), then + bias, then + y. A
// product of two bf16 values is exact in fp32, so every kernel below (AVX-512 BF16's
// vdpbf16ps, AVX2's widen-and-fma, the scalar baseline's separate multiply and add) gives the
// same bits, whatever row tile or output range computes an output, as long as no product or
// partial sum is subnormal (vdpbf16ps flushes those to zero; the others keep them).
//
// Calls on disjoint output ranges may run in parallel (the fused step splits them over its
// CpuPool). Runs on ActiveCpuIsa(). Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "lib/model/cpu_quant_ops.h"

namespace vtoken::model {

// x rounded to bfloat16 as vcvtne2ps2bf16 rounds it: to nearest even, |x| below 2^-126 to a zero
// of x's sign, NaN to a quiet NaN.
uint16_t RoundBf16(float x);
// The float a bfloat16 value stands for (its 16 bits above 16 zero bits).
float WidenBf16(uint16_t h);

// The outputs CpuBf16Linear computes together, in the lanes of one AVX-512 vector.
inline constexpr int64_t kBf16GroupRows = 16;
// The outputs of its widest tile (3 groups): a split of the outputs into multiples of it computes
// no panel in two parts. Any split gives the same bits.
inline constexpr int64_t kBf16PanelRows = 3 * kBf16GroupRows;

// W [out_features, in_features] (row-major fp32) rounded to bf16 in the layout CpuBf16Linear
// reads: per group of 16 output rows (rows padded with zeros to a multiple of 16), per input
// pair p, 16 32-bit words, word l holding row 16g + l's elements 2p (low half) and 2p + 1 (high
// half): 2 bytes per weight, padding aside.
// REQUIRES: in_features % 2 == 0.
std::vector<std::byte> PackBf16(const float* w, int64_t out_features, int64_t in_features);

// Rows of x rounded to bf16, two elements per 32-bit word ([rows][in_features / 2]): a prefill
// chunk's rows are rounded once, on the pool, for every projection that reads them.
struct CpuBf16Activations {
  int64_t rows = 0, pairs = 0;
  std::vector<uint32_t> x;
};

// Sizes `x` for `rows` rows of in_features (even).
void CpuBf16Prepare(int64_t rows, int64_t in_features, CpuBf16Activations& x);

// Rounds rows [r_begin, r_end) of `in` ([x.rows, 2 * x.pairs] fp32) into x, prepared by
// CpuBf16Prepare; calls on disjoint row ranges may run in parallel.
void CpuBf16Round(const float* in, int64_t r_begin, int64_t r_end, CpuBf16Activations& x);

// y[:, o_begin:o_end] as above, args.w holding PackBf16's layout (args.type unused), args.x
// rounded on each call (rows x in_features, small beside the product).
// REQUIRES: args.in_features % 2 == 0, 0 <= o_begin <= o_end <= args.out_features.
void CpuBf16Linear(const CpuQuantLinearArgs& args, int64_t o_begin, int64_t o_end);

// CpuBf16Linear on rows rounded already (args.x unused; x.rows == args.rows): the same bits.
void CpuBf16Linear(const CpuQuantLinearArgs& args, const CpuBf16Activations& x, int64_t o_begin,
                   int64_t o_end);

// The kernel CpuBf16Linear runs on ActiveCpuIsa(): at the AVX-512 level, vdpbf16ps where the CPU
// has AVX-512 BF16 (else the AVX2 kernel); at the AVX2 level, bf16 widened to fp32 by shifts and
// multiplied with FMA; below, scalar.
enum class CpuBf16Kernel : uint8_t { kScalar, kAvx2, kAvx512Bf16 };
CpuBf16Kernel ActiveCpuBf16Kernel();
// "scalar", "avx2", "avx512-bf16".
std::string_view CpuBf16KernelName(CpuBf16Kernel kernel);

}  // namespace vtoken::model
