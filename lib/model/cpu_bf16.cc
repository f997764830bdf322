// CpuBf16Linear (cpu_bf16.h): bf16 weights packed 16 output rows to a group, an input pair of
// each row in one 32-bit word, so that one vdpbf16ps multiplies a pair of one row of x (broadcast)
// by the pair of 16 outputs. Tiles of R rows x G groups keep R * G accumulators in registers; the
// weights of a panel of G groups are read from memory once per block of rows and from cache for
// every further row tile (decode batches, prefill chunks alike). AVX2 has no bf16 instructions:
// it widens each half of a word to fp32 by a mask or a shift (a bf16 value is the top half of its
// float) and multiply-adds the odd element, then the even one, as vdpbf16ps does.
#include "lib/model/cpu_bf16.h"

#include <array>
#include <bit>
#include <cstring>
#include <utility>

#include "lib/model/cpu_isa.h"
#include "lib/model/cpu_simd.h"

#if defined(__x86_64__)
// GCC 12 warns that the intrinsics' own _mm512_undefined_ps() "may be used uninitialized".
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

namespace vtoken::model {
namespace {

constexpr int64_t kGroup = kBf16GroupRows;
constexpr int64_t kPanel = 4 * kGroup;  // outputs of a tile at most (AVX2's one row: 4 groups)
// Rows per block: x's block (192 rows of SmolLM2's 1,536 inputs: 576 KB) stays in L2 while the
// panels pass over it.
constexpr int64_t kBlockRows = 192;

using Acts = CpuBf16Activations;
using Out = float[kPanel];

VTOKEN_INLINE uint32_t RoundBits(uint32_t u) {
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  const uint32_t zero = (u >> 16) & 0x8000u;
  return (u & 0x7F800000u) == 0 ? zero : (u & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded;
}

// The word holding a pair: element 2p (`even`, fp32 bits) in the low half, 2p + 1 in the high.
VTOKEN_INLINE uint32_t PairWord(uint32_t even, uint32_t odd) {
  return RoundBits(even) | RoundBits(odd) << 16;
}

VTOKEN_INLINE float Hi(uint32_t word) { return std::bit_cast<float>(word & 0xFFFF0000u); }
VTOKEN_INLINE float Lo(uint32_t word) { return std::bit_cast<float>(word << 16); }

void Prepare(int64_t rows, int64_t in_features, Acts& x) {
  x.rows = rows;
  x.pairs = in_features / 2;
  x.x.resize(rows * x.pairs);
}

// Rows [r_begin, r_end); inlined into each instruction set's entry point so that it vectorizes
// for it (integer steps only: the same words on every level).
VTOKEN_INLINE void Round(const float* in, int64_t r_begin, int64_t r_end, Acts& x) {
  const int64_t n = (r_end - r_begin) * x.pairs;
  const uint32_t* u = reinterpret_cast<const uint32_t*>(in) + 2 * r_begin * x.pairs;
  uint32_t* out = x.x.data() + r_begin * x.pairs;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = PairWord(u[2 * i], u[2 * i + 1]);
}

// A tile: R rows of x (x, row stride `pairs` words) times G groups of the packed weight (w, group
// stride pairs * 16 words) into out[r][16 g + l].
using TileFn = void (*)(const uint32_t* w, const uint32_t* x, int64_t pairs, Out* out);

template <int R, int G>
void TileScalar(const uint32_t* w, const uint32_t* x, int64_t pairs, Out* out) {
  for (int r = 0; r < R; ++r) {
    for (int64_t o = 0; o < G * kGroup; ++o) {
      const uint32_t* wo = w + (o / kGroup) * pairs * kGroup + o % kGroup;
      float acc = 0.0f;
      for (int64_t p = 0; p < pairs; ++p) {
        // Each product is exact, so a multiply and an add round as one fma.
        acc += Hi(x[r * pairs + p]) * Hi(wo[p * kGroup]);
        acc += Lo(x[r * pairs + p]) * Lo(wo[p * kGroup]);
      }
      out[r][o] = acc;
    }
  }
}

#if defined(__x86_64__)
#define VTOKEN_TARGET_BF16 __attribute__((target("arch=x86-64-v4,avx512bf16"), noinline))
#define VTOKEN_TARGET_AVX2 __attribute__((target("arch=x86-64-v3"), noinline))

// AVX-512 BF16: R * G vdpbf16ps per input pair, x's word broadcast.
template <int R, int G>
VTOKEN_TARGET_BF16 void TileBf16(const uint32_t* w, const uint32_t* x, int64_t pairs, Out* out) {
  __m512 acc[R][G];
#pragma GCC unroll 32
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) acc[r][g] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh wv[G];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      wv[g] = (__m512bh)_mm512_loadu_si512(w + (g * pairs + p) * kGroup);
    }
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[r * pairs + p]));
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) acc[r][g] = _mm512_dpbf16_ps(acc[r][g], wv[g], xv);
    }
  }
#pragma GCC unroll 32
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) _mm512_storeu_ps(out[r] + kGroup * g, acc[r][g]);
  }
}

VTOKEN_INLINE __attribute__((target("arch=x86-64-v3"))) __m256i Words256(const uint32_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// AVX2: each half of a word widened (mask, shift), the odd element's product added first.
template <int R, int G>
VTOKEN_TARGET_AVX2 void TileAvx2(const uint32_t* w, const uint32_t* x, int64_t pairs, Out* out) {
  constexpr int V = 2 * G;  // 8-float vectors per row
  __m256 acc[R][V];
#pragma GCC unroll 32
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_ps();
  }
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  if constexpr (R == 1) {
    // One row: each vector widened as it is used, so that 2 G accumulators (chains of two FMAs
    // per pair) keep the FMA units busy without holding 4 G widened vectors.
    for (int64_t p = 0; p < pairs; ++p) {
      const __m256 xh = _mm256_set1_ps(Hi(x[p])), xl = _mm256_set1_ps(Lo(x[p]));
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) {
        const __m256i u = Words256(w + ((v / 2) * pairs + p) * kGroup + 8 * (v % 2));
        acc[0][v] = _mm256_fmadd_ps(xh, _mm256_castsi256_ps(_mm256_and_si256(u, high)), acc[0][v]);
        acc[0][v] = _mm256_fmadd_ps(xl, _mm256_castsi256_ps(_mm256_slli_epi32(u, 16)), acc[0][v]);
      }
    }
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(out[0] + 8 * v, acc[0][v]);
    return;
  }
  for (int64_t p = 0; p < pairs; ++p) {
    __m256 wh[V], wl[V];
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      const __m256i u = Words256(w + ((v / 2) * pairs + p) * kGroup + 8 * (v % 2));
      wh[v] = _mm256_castsi256_ps(_mm256_and_si256(u, high));
      wl[v] = _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
    }
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r) {
      const uint32_t word = x[r * pairs + p];
      const __m256 xh = _mm256_set1_ps(Hi(word)), xl = _mm256_set1_ps(Lo(word));
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) {
        acc[r][v] = _mm256_fmadd_ps(xh, wh[v], acc[r][v]);
        acc[r][v] = _mm256_fmadd_ps(xl, wl[v], acc[r][v]);
      }
    }
  }
#pragma GCC unroll 32
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(out[r] + 8 * v, acc[r][v]);
  }
}
#endif

// The tiles of one kernel, [G - 1][R - 1], R up to kRows and G up to kGroups: the accumulators,
// a pair's weight vectors and x's broadcasts fit the registers (AVX-512: 8 x 3 groups, 24
// accumulators of 32 registers; AVX2: 4 rows x 1 group, 8 of 16, or 1 row x 4 groups, whose 8
// accumulators keep a batch-1 step's FMA chains apart).
template <int G, int... R, typename F>
constexpr std::array<TileFn, sizeof...(R)> RowTiles(std::integer_sequence<int, R...>, F f) {
  return {f.template operator()<R + 1, G>()...};
}

struct Scalar {
  static constexpr int kRows = 1;
  static int Groups(int64_t /*rows*/) { return 1; }
  static TileFn Tile(int /*r*/, int /*g*/) { return &TileScalar<1, 1>; }
  static void Round(const float* in, int64_t b, int64_t e, Acts& x) {
    ::vtoken::model::Round(in, b, e, x);
  }
};
#if defined(__x86_64__)
struct Bf16 {
  static constexpr int kRows = 8;
  static int Groups(int64_t /*rows*/) { return 3; }
  static TileFn Tile(int r, int g) {
    constexpr auto f = []<int RR, int GG>() -> TileFn { return &TileBf16<RR, GG>; };
    constexpr auto rows = std::make_integer_sequence<int, kRows>();
    static constexpr std::array<TileFn, kRows> kTiles[3] = {
        RowTiles<1>(rows, f), RowTiles<2>(rows, f), RowTiles<3>(rows, f)};
    return kTiles[g - 1][r - 1];
  }
  static void Round(const float* in, int64_t b, int64_t e, Acts& x);
};
struct Avx2 {
  static constexpr int kRows = 4;
  static int Groups(int64_t rows) { return rows == 1 ? 4 : 1; }
  static TileFn Tile(int r, int g) {
    constexpr auto f = []<int RR, int GG>() -> TileFn { return &TileAvx2<RR, GG>; };
    static constexpr std::array<TileFn, kRows> kTiles =
        RowTiles<1>(std::make_integer_sequence<int, kRows>(), f);
    static constexpr std::array<TileFn, 4> kOneRow = {&TileAvx2<1, 1>, &TileAvx2<1, 2>,
                                                      &TileAvx2<1, 3>, &TileAvx2<1, 4>};
    return r == 1 ? kOneRow[g - 1] : kTiles[r - 1];
  }
  static void Round(const float* in, int64_t b, int64_t e, Acts& x);
};

// AVX-512 BF16's rounding: vcvtne2ps2bf16 on 32 floats at a time, the rest as the others.
__attribute__((target("arch=x86-64-v4,avx512bf16"))) void Bf16::Round(const float* in, int64_t b,
                                                                      int64_t e, Acts& x) {
  const int64_t n = (e - b) * x.pairs;  // words
  const float* src = in + 2 * b * x.pairs;
  uint32_t* out = x.x.data() + b * x.pairs;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512bh v =
        _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 2 * i + 16), _mm512_loadu_ps(src + 2 * i));
    _mm512_storeu_si512(out + i, (__m512i)v);
  }
  for (; i < n; ++i) {
    out[i] = PairWord(std::bit_cast<uint32_t>(src[2 * i]), std::bit_cast<uint32_t>(src[2 * i + 1]));
  }
}
__attribute__((target("arch=x86-64-v3"))) void Avx2::Round(const float* in, int64_t b, int64_t e,
                                                           Acts& x) {
  ::vtoken::model::Round(in, b, e, x);
}
#endif

Acts& Buffer() {
  thread_local Acts x;
  return x;
}

// Outputs [o_begin, o_end) of every row: panels of K's groups over blocks of rows, tiles of up to
// K::kRows rows, then bias and y added to the outputs in range.
template <typename K>
void Run(const CpuQuantLinearArgs& a, const Acts& x, int64_t o_begin, int64_t o_end) {
  const int64_t pairs = x.pairs, rows = a.rows;
  const uint32_t* w = reinterpret_cast<const uint32_t*>(a.w);
  const int64_t g_end = (o_end + kGroup - 1) / kGroup;
  const int groups = K::Groups(rows);
  Out out[K::kRows];
  for (int64_t rb = 0; rb < rows; rb += kBlockRows) {
    const int64_t re = std::min(rows, rb + kBlockRows);
    for (int64_t g0 = o_begin / kGroup; g0 < g_end; g0 += groups) {
      const int g = static_cast<int>(std::min<int64_t>(groups, g_end - g0));
      const int64_t lo = std::max(o_begin, g0 * kGroup), hi = std::min(o_end, (g0 + g) * kGroup);
      for (int64_t r0 = rb; r0 < re; r0 += K::kRows) {
        const int r = static_cast<int>(std::min<int64_t>(K::kRows, re - r0));
        K::Tile(r, g)(w + g0 * pairs * kGroup, x.x.data() + r0 * pairs, pairs, out);
        for (int i = 0; i < r; ++i) {
          float* y = a.y + (r0 + i) * a.out_features;
          for (int64_t o = lo; o < hi; ++o) {
            float v = out[i][o - g0 * kGroup];
            if (a.bias != nullptr) v += a.bias[o];
            y[o] = a.accumulate ? v + y[o] : v;
          }
        }
      }
    }
  }
}

template <typename K>
void RunOwn(const CpuQuantLinearArgs& a, const Acts* x, int64_t o_begin, int64_t o_end) {
  if (x == nullptr) {
    Acts& own = Buffer();
    Prepare(a.rows, a.in_features, own);
    K::Round(a.x, 0, a.rows, own);
    x = &own;
  }
  Run<K>(a, *x, o_begin, o_end);
}

void Dispatch(const CpuQuantLinearArgs& args, const Acts* x, int64_t o_begin, int64_t o_end) {
  if (o_begin >= o_end) return;
  switch (ActiveCpuBf16Kernel()) {
#if defined(__x86_64__)
    case CpuBf16Kernel::kAvx512Bf16:
      return RunOwn<Bf16>(args, x, o_begin, o_end);
    case CpuBf16Kernel::kAvx2:
      return RunOwn<Avx2>(args, x, o_begin, o_end);
#endif
    default:
      return RunOwn<Scalar>(args, x, o_begin, o_end);
  }
}

}  // namespace

uint16_t RoundBf16(float x) { return static_cast<uint16_t>(RoundBits(std::bit_cast<uint32_t>(x))); }

float WidenBf16(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

std::vector<std::byte> PackBf16(const float* w, int64_t out_features, int64_t in_features) {
  const int64_t pairs = in_features / 2, groups = (out_features + kGroup - 1) / kGroup;
  std::vector<uint32_t> words(groups * pairs * kGroup, 0);
  for (int64_t o = 0; o < out_features; ++o) {
    const uint32_t* row = reinterpret_cast<const uint32_t*>(w + o * in_features);
    uint32_t* dst = words.data() + (o / kGroup) * pairs * kGroup + o % kGroup;
    for (int64_t p = 0; p < pairs; ++p) {
      dst[p * kGroup] = PairWord(row[2 * p], row[2 * p + 1]);
    }
  }
  std::vector<std::byte> packed(words.size() * sizeof(uint32_t));
  std::memcpy(packed.data(), words.data(), packed.size());
  return packed;
}

void CpuBf16Prepare(int64_t rows, int64_t in_features, CpuBf16Activations& x) {
  Prepare(rows, in_features, x);
}

void CpuBf16Round(const float* in, int64_t r_begin, int64_t r_end, CpuBf16Activations& x) {
  switch (ActiveCpuBf16Kernel()) {
#if defined(__x86_64__)
    case CpuBf16Kernel::kAvx512Bf16:
      return Bf16::Round(in, r_begin, r_end, x);
    case CpuBf16Kernel::kAvx2:
      return Avx2::Round(in, r_begin, r_end, x);
#endif
    default:
      return Round(in, r_begin, r_end, x);
  }
}

void CpuBf16Linear(const CpuQuantLinearArgs& args, int64_t o_begin, int64_t o_end) {
  Dispatch(args, nullptr, o_begin, o_end);
}

void CpuBf16Linear(const CpuQuantLinearArgs& args, const CpuBf16Activations& x, int64_t o_begin,
                   int64_t o_end) {
  Dispatch(args, &x, o_begin, o_end);
}

CpuBf16Kernel ActiveCpuBf16Kernel() {
#if defined(__x86_64__)
  switch (ActiveCpuIsa()) {
    case CpuIsa::kAvx512:
      if (__builtin_cpu_supports("avx512bf16")) return CpuBf16Kernel::kAvx512Bf16;
      return CpuBf16Kernel::kAvx2;
    case CpuIsa::kAvx2:
      return CpuBf16Kernel::kAvx2;
    default:
      break;
  }
#endif
  return CpuBf16Kernel::kScalar;
}

std::string_view CpuBf16KernelName(CpuBf16Kernel kernel) {
  switch (kernel) {
    case CpuBf16Kernel::kAvx512Bf16:
      return "avx512-bf16";
    case CpuBf16Kernel::kAvx2:
      return "avx2";
    case CpuBf16Kernel::kScalar:
      break;
  }
  return "scalar";
}

}  // namespace vtoken::model
