// CpuQuantLinear: CpuLinear (cpu_ops.h) on weights kept as a GGUF file stores them, in ggml's
// 32-element blocks (Q8_0, Q4_0, Q4_1), dequantized inside the kernel as llama.cpp does, so that
// a model can hold 4-bit weights in memory and read from a seventh (Q4_0) to about a quarter
// (Q8_0) of fp32's bytes per decode step.
//
// Each output is, bit for bit, what CpuLinear gives at the same instruction-set level (every
// one, the baseline included) on the weights DequantizeRow (io/ggml_quants.h) makes of the same
// bytes: a weight is dequantized with ggml's own fp32 expression and rounding, then
// multiply-added in CpuLinear's 16-lane order. So splitting the outputs over threads changes no
// bit, nor does AVX2 against AVX-512. Tiles are shaped per instruction set (cpu_isa.h) and a
// block is dequantized once per tile, for all of the tile's rows.
//
// Each call computes output features [o_begin, o_end); calls on disjoint ranges may run in
// parallel. It runs on ActiveCpuIsa(). Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "lib/model/cpu_ops.h"
#include "lib/model/io/gguf.h"

namespace vtoken::model {

struct CpuQuantLinearArgs {
  const float* x = nullptr;  // [rows, in_features]
  // [out_features] rows of in_features / 32 blocks each, in ggml's block layout for `type`
  // (the bytes of a GGUF tensor [in_features, out_features] in GGUF's order of dimensions).
  const std::byte* w = nullptr;
  GgmlType type = GgmlType::kQ8_0;  // One of those CpuQuantLinearSupports.
  const float* bias = nullptr;      // [out_features] or null
  float* y = nullptr;               // [rows, out_features]
  int64_t rows = 0, in_features = 0, out_features = 0;
  bool accumulate = false;  // y += x W^T (a residual add) instead of y = x W^T.
};

// How a projection multiplies the weights a model keeps beside (or instead of) fp32 ones.
enum class StoredDot : uint8_t {
  kExact,  // CpuQuantLinear: dequantized in the kernel, CpuLinear's bits.
  kQ8,     // CpuQ8Linear: activations quantized to 8 bits as llama.cpp does, integer products.
  kBf16,   // CpuBf16Linear (cpu_bf16.h): weights and activations rounded to bf16.
};

// True for Q8_0, Q4_0 and Q4_1.
bool CpuQuantLinearSupports(GgmlType type);

// y[:, o_begin:o_end] = x W^T (+ bias) (+ y) for W dequantized.
// REQUIRES: CpuQuantLinearSupports(args.type), args.in_features % 32 == 0,
// 0 <= o_begin <= o_end <= args.out_features.
void CpuQuantLinear(const CpuQuantLinearArgs& args, int64_t o_begin, int64_t o_end);

// CpuQ8Linear: y[:, o_begin:o_end] = x W^T (+ bias) (+ y) as llama.cpp's CPU backend computes it
// for these types: each row of x quantized per 32-element block as ggml's x86 quantize_row_q8_0
// does (Q8_1, which adds the block's scaled sum, for Q4_1 weights: d = amax / 127 rounded to f16,
// q = x * 127 / amax rounded to nearest even), each block's integer dot product with the weight
// block exact in int32, then scaled and summed in fp32: y = sum over blocks of (d_w d_x) * isum
// (+ sum of m_w s_x for Q4_1). Not CpuQuantLinear's bits: the activations carry 8-bit rounding
// (about 0.4% of each block's largest element), which llama.cpp's own greedy choices carry too.
// The same bits on every kernel (CpuQ8Kernel) and whatever output ranges the work is split into.
// `args.w` holds the weight as PackStoredQ8 packs it; args.x is quantized on each call (rows x
// in_features, small beside the product).
// REQUIRES: CpuQuantLinearSupports(args.type), args.in_features % 32 == 0,
// 0 <= o_begin <= o_end <= args.out_features.
void CpuQ8Linear(const CpuQuantLinearArgs& args, int64_t o_begin, int64_t o_end);

// Rows of x quantized for CpuQ8Linear: per 32-element block, ggml's q (int8), d and Q8_1's s
// (f16 values held as float) and the sum of q. A prefill chunk's rows are quantized once, on the
// pool, for every projection that reads them, instead of by every thread in every call.
struct CpuQ8Activations {
  int64_t rows = 0, blocks = 0;
  std::vector<int8_t> q;     // [rows][blocks][32]
  std::vector<float> d, s;   // [rows][blocks]
  std::vector<int32_t> sum;  // [rows][blocks]
};

// Sizes `x` for `rows` rows of in_features (a multiple of 32).
void CpuQ8Prepare(int64_t rows, int64_t in_features, CpuQ8Activations& x);

// Quantizes rows [r_begin, r_end) of `in` ([x.rows, x.blocks * 32] fp32) into x, prepared by
// CpuQ8Prepare; calls on disjoint row ranges may run in parallel.
void CpuQ8Quantize(const float* in, int64_t r_begin, int64_t r_end, CpuQ8Activations& x);

// CpuQ8Linear on rows quantized already (args.x unused; x.rows == args.rows): the same bits.
void CpuQ8Linear(const CpuQuantLinearArgs& args, const CpuQ8Activations& x, int64_t o_begin,
                 int64_t o_end);

// The weight rows CpuQ8Linear computes together, in the lanes of one vector.
inline constexpr int64_t kQ8GroupRows = 16;

// A stored weight [out_features] rows of blocks of `type` in the layout CpuQ8Linear reads:
// records of one block of 16 rows each, their scales side by side and their quants in 4-byte
// groups row by row (cpu_quant_q8.cc); the size of the blocks, rows padded to a multiple of 16.
// REQUIRES: CpuQuantLinearSupports(type), in_features % 32 == 0, blocks holds out_features rows.
std::vector<std::byte> PackStoredQ8(GgmlType type, std::span<const std::byte> blocks,
                                    int64_t out_features, int64_t in_features);

// The kernel CpuQ8Linear runs on ActiveCpuIsa(): at the AVX-512 level, vpdpbusd where the CPU has
// AVX-512 VNNI (else the AVX2 kernel); at the AVX2 level, vpmaddubsw + vpmaddwd; below, scalar.
enum class CpuQ8Kernel : uint8_t { kScalar, kAvx2, kAvx512Vnni };
CpuQ8Kernel ActiveCpuQ8Kernel();
// "scalar", "avx2", "avx512-vnni".
std::string_view CpuQ8KernelName(CpuQ8Kernel kernel);

// A linear weight [out_features, in_features] as a GGUF file stores it, rows in Hugging Face's
// order (GgufCheckpoint::ReadStored; LlamaOptions::weights_as_stored), or rounded to bf16
// (type kBF16, dot kBf16; LlamaOptions::bf16_weights), kept beside the fp32 weight for the
// projections of the fused CPU path. Undefined (no bytes) when the model holds the weight in
// fp32 only.
struct StoredWeight {
  GgmlType type = GgmlType::kF32;
  // The file's blocks (kExact), PackStoredQ8's layout (kQ8) or PackBf16's (kBf16).
  std::vector<std::byte> bytes;
  StoredDot dot = StoredDot::kExact;

  bool defined() const { return !bytes.empty(); }
};

// CpuLinear's `args` on `stored`'s blocks: w, type and dot from `stored`, the rest from args.
CpuQuantLinearArgs StoredArgs(const CpuLinearArgs& args, const StoredWeight& stored);

// Outputs [o_begin, o_end) of CpuLinear's `args` (args.w the fp32 weight): from `stored`'s bytes
// by CpuQuantLinear (the same bits), CpuQ8Linear or CpuBf16Linear (stored.dot) when it is
// defined, else CpuLinear.
void CpuLinearOrStored(const CpuLinearArgs& args, const StoredWeight& stored, int64_t o_begin,
                       int64_t o_end);

}  // namespace vtoken::model
