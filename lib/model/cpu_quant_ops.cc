#include "lib/model/cpu_quant_ops.h"

#include <bit>
#include <cstring>
#include <type_traits>

#include "lib/model/cpu_bf16.h"
#include "lib/model/cpu_isa.h"
#include "lib/model/cpu_simd.h"

namespace vtoken::model {
namespace {

using simd::Lanes16;
using simd::V16;
using simd::V4;
using simd::V8;

constexpr int64_t kBlock = 32;  // Elements per block of Q8_0, Q4_0 and Q4_1.

// Block layouts (ggml-common.h; io/ggml_quants.cc), little-endian, f16 scales unaligned:
//   Q8_0 [d:f16][qs:32 x int8]   Q4_0 [d:f16][qs:16]   Q4_1 [d:f16][m:f16][qs:16]
// A Q4 block holds element j in the low nibble of qs[j] and element j + 16 in the high one, so
// the block's first 16 lanes are the low nibbles of qs and its last 16 the high ones.
template <GgmlType T>
struct Block;
template <>
struct Block<GgmlType::kQ8_0> {
  static constexpr int64_t kBytes = 34, kQs = 2;
};
template <>
struct Block<GgmlType::kQ4_0> {
  static constexpr int64_t kBytes = 18, kQs = 2;
};
template <>
struct Block<GgmlType::kQ4_1> {
  static constexpr int64_t kBytes = 20, kQs = 4;
};

// The shape of a tile for native vector N, kRows rows of x by kOutputs rows of W, and of the
// one-row (batch-1) tile: its kRows * kOutputs * Lanes16<N>::kParts accumulators, the x vectors
// it keeps, the weight vector being dequantized and that block's scales fit the registers with
// no spill in the inner loop (check with `objdump -d`: no load or store relative to %rsp or %rbp
// in a Tile*'s block loop). Dequantizing costs several instructions per weight vector, so the
// tiles favour rows, which share it, over outputs, which share x (read by the FMAs from L1). On
// SmolLM2's decode matrices, 8 rows, one thread, Q8_0 and Q4_1: AVX-512's 8 x 1 took 26-28 ms
// where 4 x 4 took 28-33; AVX2's 4 x 1 took 28-30 ms where 2 x 2 took 35-38.
template <typename N>
struct QuantTile;
template <>
struct QuantTile<V16> {  // AVX-512, 32 registers: 8 accumulators + w + scales.
  static constexpr int kRows = 8, kOutputs = 1, kOneRowOutputs = 2;
};
template <>
struct QuantTile<V8> {  // AVX2, 16 registers: 8 accumulators + w + scales.
  static constexpr int kRows = 4, kOutputs = 1, kOneRowOutputs = 2;
};
template <>
struct QuantTile<V4> {  // SSE2, 16 registers: 4 accumulators + w + scales (1 x 2 spilled).
  static constexpr int kRows = 1, kOutputs = 1, kOneRowOutputs = 1;
};

// The integer vector with as many lanes as N.
template <typename N>
struct Ints {
  static constexpr int kWidth = sizeof(N) / sizeof(float);
  typedef int32_t I32 __attribute__((vector_size(sizeof(N))));
};

// The kWidth bytes at `at`, sign- or zero-extended to int32 lanes: one vpmovsxbd / vpmovzxbd on
// AVX2 and AVX-512, four SSE2 instructions on the baseline. In asm because GCC 12 lowers
// __builtin_convertvector and byte shuffles element by element through general registers, and
// <immintrin.h>'s intrinsics cannot be inlined into these templates (they carry no target
// attribute; the Tile* functions below do).
template <typename N, bool kSigned>
VTOKEN_INLINE typename Ints<N>::I32 Widen(const uint8_t* at) {
  constexpr int kWidth = Ints<N>::kWidth;
  typename Ints<N>::I32 v;
  const auto& bytes = *reinterpret_cast<const uint8_t(*)[kWidth]>(at);
#if defined(__x86_64__)
  if constexpr (kWidth > 4 && kSigned) {
    asm("vpmovsxbd %1, %0" : "=v"(v) : "m"(bytes));
  } else if constexpr (kWidth > 4) {
    asm("vpmovzxbd %1, %0" : "=v"(v) : "m"(bytes));
  } else if constexpr (kSigned) {
    // Each byte to the top of its lane, then an arithmetic shift down.
    asm("movd %1, %0\n\tpunpcklbw %0, %0\n\tpunpcklwd %0, %0\n\tpsrad $24, %0"
        : "=x"(v)
        : "m"(bytes));
  } else {
    asm("movd %1, %0\n\tpunpcklbw %0, %0\n\tpunpcklwd %0, %0\n\tpsrld $24, %0"
        : "=x"(v)
        : "m"(bytes));
  }
#else
  for (int i = 0; i < kWidth; ++i) {
    v[i] = kSigned ? static_cast<int8_t>(bytes[i]) : bytes[i];
  }
#endif
  return v;
}

// A block's f16 scale as a float, exact as io/safetensors.cc's F16ToFloat (ggml_quants.cc's
// scales): on AVX2 and AVX-512 one F16C conversion (which quiets a signalling NaN, as the first
// arithmetic on it would anyway); on the baseline, F16ToFloat inline and without its loop, a
// subnormal being its mantissa times 2^-24 (exact in fp32).
template <typename N>
VTOKEN_INLINE float Half(const uint8_t* p) {
  if constexpr (!std::is_same_v<N, V4>) {
    _Float16 h;
    std::memcpy(&h, p, sizeof(h));
    return static_cast<float>(h);
  } else {
    uint16_t h;
    std::memcpy(&h, p, sizeof(h));
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
    const uint32_t exp = (h >> 10) & 0x1f;
    const uint32_t mant = h & 0x3ff;
    if (exp == 0) {
      return std::bit_cast<float>(sign |
                                  std::bit_cast<uint32_t>(static_cast<float>(mant) * 0x1p-24f));
    }
    const uint32_t biased = exp == 0x1f ? 0xff : exp + 127 - 15;
    return std::bit_cast<float>(sign | (biased << 23) | (mant << 13));
  }
}

// Lanes [16 c + p W, 16 c + p W + W) of the block at `b` (W = N's width), with ggml_quants.cc's
// DequantQ8_0 / DequantQ4_0 / DequantQ4_1 expressions: (float)q * d, (float)(q - 8) * d and
// (float)q * d + m. d and m are the block's scales. -ffp-contract=fast fuses Q4_1's multiply and
// add into one FMA where ggml rounds the product first, with the same result: q has at most 4
// significant bits and d 11, so q * d is exact in fp32 (and a normal number unless 0), and
// rounding q * d + m once is rounding it after the exact product. (A NaN scale aside, whose
// payload the two orders may carry differently.) The test checks the bits.
template <typename N, GgmlType T>
VTOKEN_INLINE N Dequant(const uint8_t* b, float d, float m, int c, int p) {
  constexpr int kWidth = Ints<N>::kWidth;
  const uint8_t* qs = b + Block<T>::kQs;
  if constexpr (T == GgmlType::kQ8_0) {
    return __builtin_convertvector(Widen<N, true>(qs + c * 16 + p * kWidth), N) * d;
  } else {
    const typename Ints<N>::I32 q = Widen<N, false>(qs + p * kWidth);
    const typename Ints<N>::I32 nibble = c == 0 ? q & 0x0F : q >> 4;
    if constexpr (T == GgmlType::kQ4_0) {
      return __builtin_convertvector(nibble - 8, N) * d;
    } else {
      return __builtin_convertvector(nibble, N) * d + m;
    }
  }
}

// CpuQuantLinearArgs with W's row stride in bytes.
struct View {
  const CpuQuantLinearArgs& a;
  const uint8_t* w;
  int64_t row_bytes;
};

// out[r][o] = x_r . w_o for a tile of R rows of x and O rows of W, k long, summed as cpu_ops.cc's
// DotTile sums (lane l of Lanes16 takes elements l, l + 16, ... in order, one multiply-add each;
// then Lanes16::Reduce; k is a multiple of 32, so no tail): an output depends neither on the tile
// nor on whether W was quantized. Each block of each weight row is dequantized once, for all R
// rows, and its scales are live only while it is: holding all O rows' scales across the block
// took the registers of four accumulators on AVX-512. Every loop over the tile is unrolled by
// pragma, early enough for GCC to keep acc in registers (unrolled later, it stores acc to the
// stack on every block).
template <typename N, GgmlType T, int R, int O>
VTOKEN_INLINE void DotTile(const float* x, const uint8_t* w, int64_t k, int64_t row_bytes,
                           float (&out)[R][O]) {
  using L = Lanes16<N>;
  N acc[R][O][L::kParts];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int o = 0; o < O; ++o) {
#pragma GCC unroll 16
      for (int p = 0; p < L::kParts; ++p) acc[r][o][p] = N{};
    }
  }
  const float* row[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) row[r] = x + r * k;
  for (int64_t i = 0; i < k; i += kBlock, w += Block<T>::kBytes) {
#pragma GCC unroll 16
    for (int o = 0; o < O; ++o) {
      const uint8_t* block = w + o * row_bytes;
      const float d = Half<N>(block);
      const float m = T == GgmlType::kQ4_1 ? Half<N>(block + 2) : 0.0f;
#pragma GCC unroll 16
      for (int c = 0; c < 2; ++c) {
#pragma GCC unroll 16
        for (int p = 0; p < L::kParts; ++p) {
          const N wv = Dequant<N, T>(block, d, m, c, p);
#pragma GCC unroll 16
          for (int r = 0; r < R; ++r) {
            N xv;
            std::memcpy(&xv, row[r] + i + c * 16 + p * L::kWidth, sizeof(N));
            acc[r][o][p] += xv * wv;
          }
        }
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int o = 0; o < O; ++o) {
      L lanes;
#pragma GCC unroll 16
      for (int p = 0; p < L::kParts; ++p) lanes.part[p] = acc[r][o][p];
      out[r][o] = lanes.Reduce();
    }
  }
}

// Rows [r0, r0 + R) x outputs [o0, o0 + O) of y, the bias and the residual added as CpuLinear
// adds them.
template <typename N, GgmlType T, int R, int O>
VTOKEN_INLINE void Tile(const View& v, int64_t r0, int64_t o0) {
  const CpuQuantLinearArgs& a = v.a;
  const int64_t k = a.in_features;
  float out[R][O];
  DotTile<N, T, R, O>(a.x + r0 * k, v.w + o0 * v.row_bytes, k, v.row_bytes, out);
  for (int r = 0; r < R; ++r) {
    float* y = a.y + (r0 + r) * a.out_features + o0;
    for (int o = 0; o < O; ++o) {
      const float sum = out[r][o] + (a.bias != nullptr ? a.bias[o0 + o] : 0.0f);
      y[o] = a.accumulate ? y[o] + sum : sum;
    }
  }
}

// Tile<N, ...> as a function of its own, compiled for N's instruction set. Inlined into the
// loops over tiles, it left GCC short of general registers: some tiles' block loops reloaded a
// pointer or their bound from the stack on every block.
#if defined(__x86_64__)
template <GgmlType T, int R, int O>
__attribute__((target("arch=x86-64-v4"), noinline)) void TileAvx512(const View& v, int64_t r0,
                                                                    int64_t o0) {
  Tile<V16, T, R, O>(v, r0, o0);
}
template <GgmlType T, int R, int O>
__attribute__((target("arch=x86-64-v3"), noinline)) void TileAvx2(const View& v, int64_t r0,
                                                                  int64_t o0) {
  Tile<V8, T, R, O>(v, r0, o0);
}
#endif
template <GgmlType T, int R, int O>
__attribute__((noinline)) void TileBaseline(const View& v, int64_t r0, int64_t o0) {
  Tile<V4, T, R, O>(v, r0, o0);
}

template <typename N, GgmlType T, int R, int O>
VTOKEN_INLINE void TileOn(const View& v, int64_t r0, int64_t o0) {
  if constexpr (std::is_same_v<N, V4>) {
    TileBaseline<T, R, O>(v, r0, o0);
#if defined(__x86_64__)
  } else if constexpr (std::is_same_v<N, V8>) {
    TileAvx2<T, R, O>(v, r0, o0);
  } else {
    TileAvx512<T, R, O>(v, r0, o0);
#endif
  }
}

// The last rows from r on, fewer than a tile's: one tile of exactly that many.
template <typename N, GgmlType T, int R, int O>
VTOKEN_INLINE void RowTail(const View& v, int64_t r, int64_t o0) {
  if constexpr (R >= 1) {
    if (v.a.rows - r == R) return TileOn<N, T, R, O>(v, r, o0);
    RowTail<N, T, R - 1, O>(v, r, o0);
  }
}

template <typename N, GgmlType T, int O>
VTOKEN_INLINE void OutputBlock(const View& v, int64_t o0) {
  constexpr int R = QuantTile<N>::kRows;
  int64_t r = 0;
  for (; r + R <= v.a.rows; r += R) TileOn<N, T, R, O>(v, r, o0);
  RowTail<N, T, R - 1, O>(v, r, o0);
}

// One row (batch-1 decode) streams W once: as CpuLinear's OneRow, tiles of 2 outputs, each
// prefetching all of the next tile's weight rows (contiguous in W). On SmolLM2's decode
// matrices, one thread, AVX-512 or AVX2: Q8_0 6.5-6.7 ms (17 GB/s of blocks, near fp32's 19-20),
// Q4_1 7.4 ms (9 GB/s: dequantizing bounds it), fp32 CpuLinear 21-22 ms. Tiles of 4 outputs
// took Q8_0 7.4 ms.
template <typename N, GgmlType T>
VTOKEN_INLINE void OneRow(const View& v, int64_t o_begin, int64_t o_end) {
  constexpr int O = QuantTile<N>::kOneRowOutputs;
  const uint8_t* end = v.w + o_end * v.row_bytes;
  int64_t o = o_begin;
  for (; o + O <= o_end; o += O) {
    const uint8_t* next = v.w + (o + O) * v.row_bytes;
    for (int64_t at = 0; at < O * v.row_bytes && next + at < end; at += 64) {
      __builtin_prefetch(next + at);
    }
    TileOn<N, T, 1, O>(v, 0, o);
  }
  for (; o < o_end; ++o) TileOn<N, T, 1, 1>(v, 0, o);
}

// Outputs in blocks of kOutputs; in each block, rows in tiles of kRows: a block's weight rows are
// read from memory once and from L1 for every row tile after the first.
template <typename N, GgmlType T>
VTOKEN_INLINE void Rows(const CpuQuantLinearArgs& a, int64_t o_begin, int64_t o_end) {
  const View v{a, reinterpret_cast<const uint8_t*>(a.w), a.in_features / kBlock * Block<T>::kBytes};
  if (a.rows == 1) return OneRow<N, T>(v, o_begin, o_end);
  constexpr int O = QuantTile<N>::kOutputs;
  int64_t o = o_begin;
  for (; o + O <= o_end; o += O) {
    if (o + O < o_end) __builtin_prefetch(v.w + (o + O) * v.row_bytes);
    OutputBlock<N, T, O>(v, o);
  }
  for (; o < o_end; ++o) OutputBlock<N, T, 1>(v, o);
}

template <typename N>
VTOKEN_INLINE void RowsOn(const CpuQuantLinearArgs& a, int64_t o_begin, int64_t o_end) {
  switch (a.type) {
    case GgmlType::kQ8_0:
      return Rows<N, GgmlType::kQ8_0>(a, o_begin, o_end);
    case GgmlType::kQ4_0:
      return Rows<N, GgmlType::kQ4_0>(a, o_begin, o_end);
    case GgmlType::kQ4_1:
      return Rows<N, GgmlType::kQ4_1>(a, o_begin, o_end);
    default:
      return;  // Excluded by CpuQuantLinearSupports (REQUIRES).
  }
}

#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"))) void RowsAvx512(const CpuQuantLinearArgs& a, int64_t b,
                                                          int64_t e) {
  RowsOn<V16>(a, b, e);
}
__attribute__((target("arch=x86-64-v3"))) void RowsAvx2(const CpuQuantLinearArgs& a, int64_t b,
                                                        int64_t e) {
  RowsOn<V8>(a, b, e);
}
#endif
void RowsBaseline(const CpuQuantLinearArgs& a, int64_t b, int64_t e) { RowsOn<V4>(a, b, e); }

}  // namespace

bool CpuQuantLinearSupports(GgmlType type) {
  return type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0 || type == GgmlType::kQ4_1;
}

void CpuQuantLinear(const CpuQuantLinearArgs& args, int64_t o_begin, int64_t o_end) {
  switch (ActiveCpuIsa()) {
#if defined(__x86_64__)
    case CpuIsa::kAvx512:
      return RowsAvx512(args, o_begin, o_end);
    case CpuIsa::kAvx2:
      return RowsAvx2(args, o_begin, o_end);
#endif
    default:
      return RowsBaseline(args, o_begin, o_end);
  }
}

CpuQuantLinearArgs StoredArgs(const CpuLinearArgs& args, const StoredWeight& stored) {
  return {.x = args.x,
          .w = stored.bytes.data(),
          .type = stored.type,
          .bias = args.bias,
          .y = args.y,
          .rows = args.rows,
          .in_features = args.in_features,
          .out_features = args.out_features,
          .accumulate = args.accumulate};
}

void CpuLinearOrStored(const CpuLinearArgs& args, const StoredWeight& stored, int64_t o_begin,
                       int64_t o_end) {
  if (!stored.defined()) return CpuLinear(args, o_begin, o_end);
  const CpuQuantLinearArgs q = StoredArgs(args, stored);
  if (stored.dot == StoredDot::kQ8) return CpuQ8Linear(q, o_begin, o_end);
  if (stored.dot == StoredDot::kBf16) return CpuBf16Linear(q, o_begin, o_end);
  CpuQuantLinear(q, o_begin, o_end);
}

}  // namespace vtoken::model
