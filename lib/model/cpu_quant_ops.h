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

// True for Q8_0, Q4_0 and Q4_1.
bool CpuQuantLinearSupports(GgmlType type);

// y[:, o_begin:o_end] = x W^T (+ bias) (+ y) for W dequantized.
// REQUIRES: CpuQuantLinearSupports(args.type), args.in_features % 32 == 0,
// 0 <= o_begin <= o_end <= args.out_features.
void CpuQuantLinear(const CpuQuantLinearArgs& args, int64_t o_begin, int64_t o_end);

// A linear weight [out_features, in_features] as a GGUF file stores it, rows in Hugging Face's
// order (GgufCheckpoint::ReadStored), kept beside the fp32 weight for the decode-sized
// projections of the fused CPU path (LlamaOptions::weights_as_stored). Undefined (no bytes) when
// the model holds the weight in fp32 only.
struct StoredWeight {
  GgmlType type = GgmlType::kF32;
  std::vector<std::byte> bytes;

  bool defined() const { return !bytes.empty(); }
};

// Outputs [o_begin, o_end) of CpuLinear's `args` (args.w the fp32 weight): from `stored`'s blocks
// by CpuQuantLinear when it is defined, else CpuLinear. The same bits either way.
void CpuLinearOrStored(const CpuLinearArgs& args, const StoredWeight& stored, int64_t o_begin,
                       int64_t o_end);

}  // namespace vtoken::model
