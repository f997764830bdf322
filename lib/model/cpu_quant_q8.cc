// CpuQ8Linear (cpu_quant_ops.h): stored Q8_0 / Q4_0 / Q4_1 weights times activations quantized
// as ggml quantizes them, in integer dot products, with the outputs of a 16-row group in the
// lanes of one vector so that a block's float work (scale, convert, accumulate) is done once per
// block for 16 outputs instead of once per element.
//
// A packed record holds one block of each of 16 weight rows (PackStoredQ8):
//   [d: 16 x f16] ([m: 16 x f16], Q4_1) [quants: 4-byte groups, output by output]
// Q8_0's quants are 8 vectors of 64 bytes, vector g holding elements 4g..4g+3 of each of the 16
// rows, biased by 128 (w ^ 0x80, unsigned); Q4's are 4 vectors of 64 bytes, vector j holding
// each row's qs[4j..4j+3] unchanged, whose low nibbles are elements 4j..4j+3 and high nibbles
// elements 16+4j..16+4j+3 (ggml's nibble order). A record has the bytes of the 16 blocks it
// holds, so a packed weight is the size of the stored one (rows padded to a multiple of 16).
//
// Per output o, row r and block b, exactly: isum = sum_i w_i q_i (int32), then in fp32
// acc_o = fma(d_w * d_x, (float)isum, acc_o) block after block, Q4_1's offset term in a second
// accumulator macc_o = fma(m_w, s_x, macc_o), and y = acc_o + macc_o. Integer sums are exact and
// each float step is one IEEE operation on one lane, so every kernel (AVX-512 VNNI, AVX2, the
// scalar baseline with fmaf) gives the same bits.
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "lib/model/cpu_isa.h"
#include "lib/model/cpu_quant_ops.h"
#include "lib/model/cpu_simd.h"

#if defined(__x86_64__)
// GCC 12 warns that the intrinsics' own _mm512_undefined_ps() "may be used uninitialized".
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

namespace vtoken::model {
namespace {

constexpr int64_t kBlock = 32;
constexpr int64_t kGroup = kQ8GroupRows;

// A packed record's layout for weight type T.
struct Layout {
  int64_t bytes;   // per record
  int64_t quants;  // offset of the quants
  int32_t bias;    // the c of isum = dot(u, q) - c * sum(q) for the unsigned quants u
};
constexpr Layout LayoutOf(GgmlType t) {
  return t == GgmlType::kQ8_0   ? Layout{32 + 512, 32, 128}
         : t == GgmlType::kQ4_0 ? Layout{32 + 256, 32, 8}
                                : Layout{64 + 256, 64, 0};  // Q4_1
}

using Q8Rows = CpuQ8Activations;

VTOKEN_INLINE float Widen(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return simd::WidenF16(h);
}
VTOKEN_INLINE float RoundF16(float x) { return simd::WidenF16(simd::NarrowF16(x)); }

void Prepare(int64_t rows, int64_t in_features, Q8Rows& x) {
  const int64_t blocks = in_features / kBlock, n = rows * blocks;
  x.rows = rows;
  x.blocks = blocks;
  x.q.resize(n * kBlock);
  x.d.resize(n);
  x.s.resize(n);
  x.sum.resize(n);
}

// Rows [r_begin, r_end) of `in`. Inlined into each instruction set's entry point, so that its
// loops vectorize for it; every step is exact or one IEEE operation, so the bytes are the same on
// every level.
VTOKEN_INLINE void Quantize(const float* in, int64_t in_features, int64_t r_begin, int64_t r_end,
                            Q8Rows& x) {
  const int64_t blocks = x.blocks;
  for (int64_t i = r_begin * blocks; i < r_end * blocks; ++i) {
    const float* v = in + (i / blocks) * in_features + (i % blocks) * kBlock;
    float amax = 0.0f;
#pragma omp simd reduction(max : amax)
    for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(v[j]));
    const float d = amax / 127.0f;
    // ggml's `amax != 0`, except that a block whose amax is below 2^-100 (so small that d rounds
    // to an f16 zero, and the block counts for nothing either way) gets q = 0 instead of an
    // infinite 127 / amax. The clamp keeps the conversion defined for NaN (to 127).
    const float id = amax > 0x1p-100f ? 127.0f / amax : 0.0f;
    int8_t* q = x.q.data() + i * kBlock;
    int32_t sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < kBlock; ++j) {
      const float scaled = std::fmax(-127.0f, std::fmin(127.0f, v[j] * id));
      const int32_t qj = static_cast<int32_t>(__builtin_rintf(scaled));
      q[j] = static_cast<int8_t>(qj);
      sum += qj;
    }
    x.d[i] = RoundF16(d);
    x.s[i] = RoundF16(d * static_cast<float>(sum));
    x.sum[i] = sum;
  }
}

VTOKEN_INLINE int32_t Quads(const Q8Rows& x, int64_t at, int g) {
  int32_t v;
  std::memcpy(&v, x.q.data() + at * kBlock + 4 * g, sizeof(v));
  return v;
}

// The scalar reference (and the kernel on CPUs below AVX2): out[r][o] for rows [r0, r0 + R) of
// group `rec`'s 16 outputs.
template <GgmlType T, int R>
void GroupScalar(const uint8_t* rec, int64_t blocks, const Q8Rows& x, int64_t r0,
                 float (*out)[kGroup]) {
  constexpr Layout L = LayoutOf(T);
  for (int r = 0; r < R; ++r) {
    for (int o = 0; o < kGroup; ++o) {
      float acc = 0.0f, macc = 0.0f;
      const uint8_t* p = rec;
      for (int64_t b = 0; b < blocks; ++b, p += L.bytes) {
        const int64_t at = (r0 + r) * blocks + b;
        const int8_t* q = x.q.data() + at * kBlock;
        const uint8_t* u = p + L.quants + 4 * o;
        int32_t isum = 0;
        for (int i = 0; i < 4; ++i) {
          if constexpr (T == GgmlType::kQ8_0) {
            for (int g = 0; g < 8; ++g) {
              isum += static_cast<int8_t>(u[64 * g + i] ^ 0x80) * q[4 * g + i];
            }
          } else {
            for (int j = 0; j < 4; ++j) {
              const int32_t lo = u[64 * j + i] & 0x0F, hi = u[64 * j + i] >> 4;
              const int32_t c = T == GgmlType::kQ4_0 ? 8 : 0;
              isum += (lo - c) * q[4 * j + i] + (hi - c) * q[16 + 4 * j + i];
            }
          }
        }
        const float dd = Widen(p + 2 * o) * x.d[at];
        acc = __builtin_fmaf(dd, static_cast<float>(isum), acc);
        if constexpr (T == GgmlType::kQ4_1) {
          macc = __builtin_fmaf(Widen(p + 32 + 2 * o), x.s[at], macc);
        }
      }
      out[r][o] = acc + macc;
    }
  }
}

#if defined(__x86_64__)
#define VTOKEN_TARGET_VNNI __attribute__((target("arch=x86-64-v4,avx512vnni"), noinline))
#define VTOKEN_TARGET_AVX2 __attribute__((target("arch=x86-64-v3"), noinline))

// AVX-512 VNNI: one vpdpbusd per 4-element group of the block for all 16 outputs (weights
// unsigned, activations signed), the block's q sum times L.bias subtracted up front.
template <GgmlType T, int R>
VTOKEN_TARGET_VNNI void GroupVnni(const uint8_t* rec, int64_t blocks, const Q8Rows& x, int64_t r0,
                                  float (*out)[kGroup]) {
  constexpr Layout L = LayoutOf(T);
  __m512 acc[R], macc[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r] = macc[r] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < blocks; ++b, rec += L.bytes) {
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec)));
    __m512 mw = _mm512_setzero_ps();
    if constexpr (T == GgmlType::kQ4_1) {
      mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 32)));
    }
    __m512i w[8];
    const uint8_t* u = rec + L.quants;
    if constexpr (T == GgmlType::kQ8_0) {
#pragma GCC unroll 16
      for (int g = 0; g < 8; ++g) w[g] = _mm512_loadu_si512(u + 64 * g);
    } else {
#pragma GCC unroll 16
      for (int j = 0; j < 4; ++j) {
        const __m512i v = _mm512_loadu_si512(u + 64 * j);
        w[j] = _mm512_and_si512(v, low);
        w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const int64_t at = (r0 + r) * blocks + b;
      __m512i isum = _mm512_set1_epi32(-L.bias * x.sum[at]);
#pragma GCC unroll 16
      for (int g = 0; g < 8; ++g) {
        isum = _mm512_dpbusd_epi32(isum, w[g], _mm512_set1_epi32(Quads(x, at, g)));
      }
      const __m512 dd = _mm512_mul_ps(dw, _mm512_set1_ps(x.d[at]));
      acc[r] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(isum), acc[r]);
      if constexpr (T == GgmlType::kQ4_1) {
        macc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(x.s[at]), macc[r]);
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out[r], _mm512_add_ps(acc[r], macc[r]));
}

VTOKEN_INLINE __attribute__((target("arch=x86-64-v3"))) __m256i Load256(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
VTOKEN_INLINE __attribute__((target("arch=x86-64-v3"))) __m128i Load128(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// AVX2: vpmaddubsw + vpmaddwd per 4-element group, 8 outputs per register. Q8_0's products of
// two signed bytes take ggml's sign trick (|w| times q with w's sign), since u * q of an
// unsigned u up to 255 would saturate vpmaddubsw's 16-bit pair sums.
template <GgmlType T, int R>
VTOKEN_TARGET_AVX2 void GroupAvx2(const uint8_t* rec, int64_t blocks, const Q8Rows& x, int64_t r0,
                                  float (*out)[kGroup]) {
  constexpr Layout L = LayoutOf(T);
  __m256 acc[R][2], macc[R][2];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int h = 0; h < 2; ++h) acc[r][h] = macc[r][h] = _mm256_setzero_ps();
  }
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < blocks; ++b, rec += L.bytes) {
    const uint8_t* u = rec + L.quants;
    // Outputs 8h..8h+7: one row's integer sums live at a time per row, not both halves'.
#pragma GCC unroll 16
    for (int h = 0; h < 2; ++h) {
      __m256i isum[R];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const int32_t c = T == GgmlType::kQ4_0 ? 8 : 0;
        isum[r] = _mm256_set1_epi32(-c * x.sum[(r0 + r) * blocks + b]);
      }
      // A loop, not unrolled: unrolled, GCC reassociates the integer sums into trees whose
      // partial sums spill.
      constexpr int kVectors = T == GgmlType::kQ8_0 ? 8 : 4;
#pragma GCC unroll 1
      for (int j = 0; j < kVectors; ++j) {
        const __m256i v = Load256(u + 64 * j + 32 * h);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          const int64_t at = (r0 + r) * blocks + b;
          const __m256i q = _mm256_set1_epi32(Quads(x, at, j));
          if constexpr (T == GgmlType::kQ8_0) {
            const __m256i w = _mm256_xor_si256(v, flip);
            const __m256i pairs =
                _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(q, w));
            isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(pairs, ones));
          } else {
            const __m256i q_hi = _mm256_set1_epi32(Quads(x, at, j + 4));
            const __m256i lo = _mm256_maddubs_epi16(_mm256_and_si256(v, low), q);
            const __m256i hi =
                _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), low), q_hi);
            isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(lo, ones));
            isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(hi, ones));
          }
        }
      }
      const __m256 dw = _mm256_cvtph_ps(Load128(rec + 16 * h));
      __m256 mw = _mm256_setzero_ps();
      if constexpr (T == GgmlType::kQ4_1) mw = _mm256_cvtph_ps(Load128(rec + 32 + 16 * h));
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const int64_t at = (r0 + r) * blocks + b;
        const __m256 dd = _mm256_mul_ps(dw, _mm256_set1_ps(x.d[at]));
        acc[r][h] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(isum[r]), acc[r][h]);
        if constexpr (T == GgmlType::kQ4_1) {
          macc[r][h] = _mm256_fmadd_ps(mw, _mm256_set1_ps(x.s[at]), macc[r][h]);
        }
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int h = 0; h < 2; ++h)
      _mm256_storeu_ps(out[r] + 8 * h, _mm256_add_ps(acc[r][h], macc[r][h]));
  }
}
#endif

// The kernels of one instruction set: Group<T, R> and the rows per tile, chosen so that the
// accumulators, the block's weight vectors and scales fit the registers (AVX-512: 32, AVX2: 16;
// Q4_1's second accumulator halves AVX2's rows).
struct Scalar {
  template <GgmlType T>
  static constexpr int kRows = 1;
  template <GgmlType T, int R>
  static void Group(const uint8_t* rec, int64_t blocks, const Q8Rows& x, int64_t r0,
                    float (*out)[kGroup]) {
    GroupScalar<T, R>(rec, blocks, x, r0, out);
  }
};
#if defined(__x86_64__)
struct Vnni {
  template <GgmlType T>
  static constexpr int kRows = 8;
  template <GgmlType T, int R>
  static void Group(const uint8_t* rec, int64_t blocks, const Q8Rows& x, int64_t r0,
                    float (*out)[kGroup]) {
    GroupVnni<T, R>(rec, blocks, x, r0, out);
  }
};
struct Avx2 {
  template <GgmlType T>
  static constexpr int kRows = T == GgmlType::kQ4_1 ? 1 : 2;
  template <GgmlType T, int R>
  static void Group(const uint8_t* rec, int64_t blocks, const Q8Rows& x, int64_t r0,
                    float (*out)[kGroup]) {
    GroupAvx2<T, R>(rec, blocks, x, r0, out);
  }
};
#endif

// Rows [r0, r0 + R) of group g, outputs [o_begin, o_end) of it written to y.
template <typename K, GgmlType T, int R>
VTOKEN_INLINE void Tile(const CpuQuantLinearArgs& a, const Q8Rows& x, int64_t g, int64_t r0,
                        int64_t o_begin, int64_t o_end) {
  const int64_t blocks = a.in_features / kBlock;
  const uint8_t* rec = reinterpret_cast<const uint8_t*>(a.w) + g * blocks * LayoutOf(T).bytes;
  float out[R][kGroup];
  K::template Group<T, R>(rec, blocks, x, r0, out);
  const int64_t lo = std::max(o_begin, g * kGroup), hi = std::min(o_end, (g + 1) * kGroup);
  for (int r = 0; r < R; ++r) {
    float* y = a.y + (r0 + r) * a.out_features;
    for (int64_t o = lo; o < hi; ++o) {
      const float sum = out[r][o - g * kGroup] + (a.bias != nullptr ? a.bias[o] : 0.0f);
      y[o] = a.accumulate ? y[o] + sum : sum;
    }
  }
}

template <typename K, GgmlType T, int R>
VTOKEN_INLINE void RowTail(const CpuQuantLinearArgs& a, const Q8Rows& x, int64_t g, int64_t r,
                           int64_t o_begin, int64_t o_end) {
  if constexpr (R >= 1) {
    if (a.rows - r == R) return Tile<K, T, R>(a, x, g, r, o_begin, o_end);
    RowTail<K, T, R - 1>(a, x, g, r, o_begin, o_end);
  }
}

template <typename K, GgmlType T>
VTOKEN_INLINE void Groups(const CpuQuantLinearArgs& a, const Q8Rows& x, int64_t o_begin,
                          int64_t o_end) {
  constexpr int R = K::template kRows<T>;
  for (int64_t g = o_begin / kGroup; g * kGroup < o_end; ++g) {
    int64_t r = 0;
    for (; r + R <= a.rows; r += R) Tile<K, T, R>(a, x, g, r, o_begin, o_end);
    RowTail<K, T, R - 1>(a, x, g, r, o_begin, o_end);
  }
}

Q8Rows& Buffer() {
  thread_local Q8Rows x;
  return x;
}

template <typename K>
VTOKEN_INLINE void RunQuantized(const CpuQuantLinearArgs& a, const Q8Rows& x, int64_t o_begin,
                                int64_t o_end) {
  switch (a.type) {
    case GgmlType::kQ8_0:
      return Groups<K, GgmlType::kQ8_0>(a, x, o_begin, o_end);
    case GgmlType::kQ4_0:
      return Groups<K, GgmlType::kQ4_0>(a, x, o_begin, o_end);
    case GgmlType::kQ4_1:
      return Groups<K, GgmlType::kQ4_1>(a, x, o_begin, o_end);
    default:
      return;  // Excluded by CpuQuantLinearSupports (REQUIRES).
  }
}

// x == nullptr: quantize args.x into this thread's buffer first.
template <typename K>
VTOKEN_INLINE void Run(const CpuQuantLinearArgs& a, const Q8Rows* x, int64_t o_begin,
                       int64_t o_end) {
  if (x == nullptr) {
    Q8Rows& own = Buffer();
    Prepare(a.rows, a.in_features, own);
    Quantize(a.x, a.in_features, 0, a.rows, own);
    x = &own;
  }
  RunQuantized<K>(a, *x, o_begin, o_end);
}

#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4,avx512vnni"))) void RunVnni(const CpuQuantLinearArgs& a,
                                                                  const Q8Rows* x, int64_t b,
                                                                  int64_t e) {
  Run<Vnni>(a, x, b, e);
}
__attribute__((target("arch=x86-64-v3"))) void RunAvx2(const CpuQuantLinearArgs& a, const Q8Rows* x,
                                                       int64_t b, int64_t e) {
  Run<Avx2>(a, x, b, e);
}
__attribute__((target("arch=x86-64-v4"))) void QuantizeAvx512(const float* in, int64_t k, int64_t b,
                                                              int64_t e, Q8Rows& x) {
  Quantize(in, k, b, e, x);
}
__attribute__((target("arch=x86-64-v3"))) void QuantizeAvx2(const float* in, int64_t k, int64_t b,
                                                            int64_t e, Q8Rows& x) {
  Quantize(in, k, b, e, x);
}
#endif
void RunScalar(const CpuQuantLinearArgs& a, const Q8Rows* x, int64_t b, int64_t e) {
  Run<Scalar>(a, x, b, e);
}

void Dispatch(const CpuQuantLinearArgs& args, const Q8Rows* x, int64_t o_begin, int64_t o_end) {
  if (o_begin >= o_end) return;
  switch (ActiveCpuQ8Kernel()) {
#if defined(__x86_64__)
    case CpuQ8Kernel::kAvx512Vnni:
      return RunVnni(args, x, o_begin, o_end);
    case CpuQ8Kernel::kAvx2:
      return RunAvx2(args, x, o_begin, o_end);
#endif
    default:
      return RunScalar(args, x, o_begin, o_end);
  }
}

}  // namespace

CpuQ8Kernel ActiveCpuQ8Kernel() {
#if defined(__x86_64__)
  switch (ActiveCpuIsa()) {
    case CpuIsa::kAvx512:
      if (__builtin_cpu_supports("avx512vnni")) return CpuQ8Kernel::kAvx512Vnni;
      return CpuQ8Kernel::kAvx2;
    case CpuIsa::kAvx2:
      return CpuQ8Kernel::kAvx2;
    default:
      break;
  }
#endif
  return CpuQ8Kernel::kScalar;
}

std::string_view CpuQ8KernelName(CpuQ8Kernel kernel) {
  switch (kernel) {
    case CpuQ8Kernel::kAvx512Vnni:
      return "avx512-vnni";
    case CpuQ8Kernel::kAvx2:
      return "avx2";
    case CpuQ8Kernel::kScalar:
      break;
  }
  return "scalar";
}

void CpuQ8Linear(const CpuQuantLinearArgs& args, int64_t o_begin, int64_t o_end) {
  Dispatch(args, nullptr, o_begin, o_end);
}

void CpuQ8Linear(const CpuQuantLinearArgs& args, const CpuQ8Activations& x, int64_t o_begin,
                 int64_t o_end) {
  Dispatch(args, &x, o_begin, o_end);
}

void CpuQ8Prepare(int64_t rows, int64_t in_features, CpuQ8Activations& x) {
  Prepare(rows, in_features, x);
}

void CpuQ8Quantize(const float* in, int64_t r_begin, int64_t r_end, CpuQ8Activations& x) {
  const int64_t k = x.blocks * kBlock;
  switch (ActiveCpuIsa()) {
#if defined(__x86_64__)
    case CpuIsa::kAvx512:
      return QuantizeAvx512(in, k, r_begin, r_end, x);
    case CpuIsa::kAvx2:
      return QuantizeAvx2(in, k, r_begin, r_end, x);
#endif
    default:
      return Quantize(in, k, r_begin, r_end, x);
  }
}

std::vector<std::byte> PackStoredQ8(GgmlType type, std::span<const std::byte> blocks,
                                    int64_t out_features, int64_t in_features) {
  const Layout L = LayoutOf(type);
  const int64_t n = in_features / kBlock, groups = (out_features + kGroup - 1) / kGroup;
  // A GGUF block: its f16 scales (a record's 16 rows' side by side), then its quants.
  const int64_t block_bytes = GgmlTypeInfo(static_cast<uint32_t>(type))->type_size;
  const int64_t qs_at = L.quants / kGroup;
  std::vector<std::byte> packed(groups * n * L.bytes);
  for (int64_t o = 0; o < out_features; ++o) {
    const int64_t l = o % kGroup;
    for (int64_t b = 0; b < n; ++b) {
      const std::byte* src = blocks.data() + (o * n + b) * block_bytes;
      std::byte* rec = packed.data() + ((o / kGroup) * n + b) * L.bytes;
      std::memcpy(rec + 2 * l, src, 2);
      if (type == GgmlType::kQ4_1) std::memcpy(rec + 32 + 2 * l, src + 2, 2);
      const std::byte* qs = src + qs_at;
      std::byte* u = rec + L.quants + 4 * l;
      if (type == GgmlType::kQ8_0) {
        for (int g = 0; g < 8; ++g) {
          for (int i = 0; i < 4; ++i) u[64 * g + i] = qs[4 * g + i] ^ std::byte{0x80};
        }
      } else {
        for (int j = 0; j < 4; ++j) std::memcpy(u + 64 * j, qs + 4 * j, 4);
      }
    }
  }
  return packed;
}

}  // namespace vtoken::model
