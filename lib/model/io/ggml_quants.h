// Dequantization of ggml tensor types to float, bit-exact with ggml's reference
// dequantize_row_* functions (ggml-quants.c): F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (32
// elements per block) and the K-quants Q4_K, Q5_K, Q6_K (256 elements per super-block, with
// 6-bit packed sub-block scales and mins for Q4_K and Q5_K).
//
// All functions are pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "lib/core/status.h"
#include "lib/model/io/gguf.h"

namespace vtoken::model {

// True for the types DequantizeRow supports.
bool CanDequantize(GgmlType type);

// Dequantizes out.size() elements stored as `type` in `src` into `out`. REQUIRES nothing of the
// sizes: InvalidArgument when out.size() is not a multiple of the type's block size, when
// src.size() is not exactly the bytes that many elements take, or when the type is unsupported
// (naming it).
Status DequantizeRow(GgmlType type, std::span<const std::byte> src, std::span<float> out);

// Dequantizes a whole tensor (num_elements() floats). InvalidArgument naming the tensor and its
// type when the type is unsupported or out has the wrong size.
Status DequantizeTensor(const GgufTensor& tensor, std::span<float> out);

// Quantizes floats into `type`'s blocks, as ggml's reference quantize_row_*_ref does (for
// Q8_0, Q4_0, Q4_1, F16, BF16 and F32; others are InvalidArgument). Used by the tests' GGUF
// writer and by anyone who wants a small quantized file. in.size() must be a multiple of the
// block size (else InvalidArgument); returns the bytes. NaN and infinite inputs give the bytes
// ggml's reference gives on x86-64 (where its float -> int8 casts are defined by the CPU).
StatusOr<std::string> QuantizeRow(GgmlType type, std::span<const float> in);

}  // namespace vtoken::model
