// CPU fp32 building blocks of the fused paged step (llama_paged_cpu.cc), on raw memory.
//
// CpuLinear: y = x W^T (+ bias) (+ y) for the rows of a decode batch, on raw fp32 memory, with W
// row-major [out_features, in_features] as checkpoints store it. It computes tiles of rows x
// outputs in vector registers, shaped for the instruction set it runs on (cpu_isa.h; AVX-512:
// 4 x 4, AVX2: 2 x 3, SSE2: 1 x 2): a block of weight rows is read from memory once and from L1
// for every further row tile, where a BLAS GEMM spends most of its time packing W for a matrix it
// multiplies only a few times (measured in docs/PERFORMANCE.md). Each output is summed in one
// fixed order whatever tile and instruction set compute it, so splitting the outputs over
// threads changes no bit, nor does AVX2 against AVX-512 (the baseline has no FMA).
// Prefill chunks (more than kCpuLinearMaxRows rows) belong to BLAS.
//
// Each call computes output features [o_begin, o_end); calls on disjoint ranges may run in
// parallel (the fused step splits them over its CpuPool). CpuLinear runs on ActiveCpuIsa();
// the other functions here are vectorized by function multiversioning (x86-64-v4 / v3 /
// baseline).
#pragma once

#include <cstdint>

namespace vtoken::model {

struct CpuLinearArgs {
  const float* x = nullptr;     // [rows, in_features]
  const float* w = nullptr;     // [out_features, in_features]
  const float* bias = nullptr;  // [out_features] or null
  float* y = nullptr;           // [rows, out_features]
  int64_t rows = 0, in_features = 0, out_features = 0;
  bool accumulate = false;  // y += x W^T (a residual add) instead of y = x W^T.
};

void CpuLinear(const CpuLinearArgs& args, int64_t o_begin, int64_t o_end);

// The most rows CpuLinear takes; more go to BLAS. On one thread its tiles match OpenBLAS at 8 and
// 32 rows (vt-tiny's decode step, BM_DecodeThreads), and on more they keep decode on the step's
// own threads instead of OpenBLAS's pool, which spins against them. 33 to 64 rows (short
// prefill chunks) were not measured separately.
inline constexpr int64_t kCpuLinearMaxRows = 64;

// HF LlamaRMSNorm in fp32 over `rows` rows of `width`: y = w * (x / sqrt(mean(x^2) + eps)).
void CpuRmsNorm(const float* x, const float* weight, float* y, int64_t rows, int64_t width,
                float eps);

// SwiGLU's gating in place: gate[i] = silu(gate[i]) * up[i] = gate / (1 + exp(-gate)) * up.
void CpuSiluMul(float* gate, const float* up, int64_t n);

// The index of the first largest of x[0..n), NaN ignored (std::max_element's answer for values
// without NaN; 0 when all are NaN), vectorized: greedy sampling over a 128K vocabulary.
// REQUIRES: n >= 1.
int64_t CpuArgMax(const float* x, int64_t n);

}  // namespace vtoken::model
