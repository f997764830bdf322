// Inline fp32 helpers shared by the CPU kernels (cpu_paged_attention.cc, cpu_ops.cc). They are
// always inlined, so each instruction-set version of a kernel (cpu_isa.h) compiles them for its
// own instruction set;
// reductions vectorize through `omp simd` (the kernels' files are built with -fopenmp-simd, no
// OpenMP runtime), the rest as plain loops. Internal to lib/model.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

#include "lib/core/fast_exp.h"

#define VTOKEN_INLINE inline __attribute__((always_inline))

namespace vtoken::model::simd {

// 16 floats: one AVX-512 register, two AVX2 ones, four SSE ones (GCC splits the operations).
// Files that use it compile with -Wno-psabi (the warning is about passing such vectors between
// functions built for different instruction sets, which inlined helpers never do).
typedef float V16 __attribute__((vector_size(64)));
typedef float V8 __attribute__((vector_size(32)));
typedef float V4 __attribute__((vector_size(16)));
inline constexpr int64_t kLanes = 16;

VTOKEN_INLINE V16 Load16(const float* p) {
  V16 v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

VTOKEN_INLINE void Store16(float* p, V16 v) { __builtin_memcpy(p, &v, sizeof(v)); }

// The 16 lanes' sum as a tree: halves, then quarters, then pairs (a few vector adds instead of a
// chain of 15 dependent scalar ones). Reduce8 and Reduce4 are its last steps.
VTOKEN_INLINE float Reduce4(V4 c) { return (c[0] + c[2]) + (c[1] + c[3]); }

VTOKEN_INLINE float Reduce8(V8 b) {
  return Reduce4(__builtin_shufflevector(b, b, 0, 1, 2, 3) +
                 __builtin_shufflevector(b, b, 4, 5, 6, 7));
}

VTOKEN_INLINE float Reduce16(V16 a) {
  return Reduce8(__builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) +
                 __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15));
}

// Sixteen lanes in the registers of one instruction set: N is the native vector (V16 on AVX-512,
// V8 on AVX2, V4 on SSE2) and a Lanes16<N> is kParts of them, lane l in part l / kWidth. Its
// operations are V16's lane for lane and its Reduce is Reduce16's tree, so a kernel written on
// Lanes16<N> sums in the same order for every N. (GCC lowers V16 arithmetic on AVX2 through
// the stack: a store and a load around every operation, docs/PERFORMANCE.md.)
template <typename N>
struct Lanes16 {
  static constexpr int kParts = static_cast<int>(sizeof(V16) / sizeof(N));
  static constexpr int kWidth = 16 / kParts;
  N part[kParts];

  VTOKEN_INLINE static Lanes16 Zero() {
    Lanes16 v;
    for (int p = 0; p < kParts; ++p) v.part[p] = N{};
    return v;
  }
  VTOKEN_INLINE static Lanes16 Load(const float* at) {
    Lanes16 v;
    for (int p = 0; p < kParts; ++p) __builtin_memcpy(&v.part[p], at + p * kWidth, sizeof(N));
    return v;
  }
  VTOKEN_INLINE void Store(float* at) const {
    for (int p = 0; p < kParts; ++p) __builtin_memcpy(at + p * kWidth, &part[p], sizeof(N));
  }
  VTOKEN_INLINE void Add(const Lanes16& a) {
    for (int p = 0; p < kParts; ++p) part[p] += a.part[p];
  }
  // this += a * b, lane by lane (one FMA per part where the target has FMA).
  VTOKEN_INLINE void MulAdd(const Lanes16& a, const Lanes16& b) {
    for (int p = 0; p < kParts; ++p) part[p] += a.part[p] * b.part[p];
  }
  VTOKEN_INLINE void MulAdd(float a, const Lanes16& b) {
    for (int p = 0; p < kParts; ++p) part[p] += a * b.part[p];
  }
  // sum + a * b for the scalar tails past the last 16 lanes, as one fused multiply-add on the
  // levels with FMA: left to itself, GCC turns an AVX-512 tail loop into a vector multiply and
  // an in-order sum, which rounds differently from AVX2's scalar FMAs.
  VTOKEN_INLINE static float TailMulAdd(float sum, float a, float b) {
    if constexpr (kParts == 4) {
      return sum + a * b;  // SSE2: no FMA.
    } else {
      return __builtin_fmaf(a, b, sum);
    }
  }
  // Reduce16's sum of the 16 lanes.
  VTOKEN_INLINE float Reduce() const {
    if constexpr (kParts == 1) {
      return Reduce16(part[0]);
    } else if constexpr (kParts == 2) {
      return Reduce8(part[0] + part[1]);
    } else {
      static_assert(kParts == 4, "Lanes16 holds 1, 2 or 4 parts");
      return Reduce4((part[0] + part[2]) + (part[1] + part[3]));
    }
  }
};

// IEEE binary16 <-> binary32 for the CPU KV cache in fp16 (CpuKvElement::kFloat16): the widening
// is exact; the narrowing rounds to nearest even, as torch's `.to(torch::kHalf)` does.
VTOKEN_INLINE float WidenF16(uint16_t bits) {
  return static_cast<float>(std::bit_cast<_Float16>(bits));
}
VTOKEN_INLINE uint16_t NarrowF16(float x) {
  return std::bit_cast<uint16_t>(static_cast<_Float16>(x));
}

// 16 binary16 values at `at` widened into Lanes16<N>: one F16C `vcvtph2ps` per part on AVX2 and
// AVX-512 (in asm: <immintrin.h>'s intrinsics cannot be inlined into these templates, which carry
// no target attribute, and GCC 12 converts a vector of _Float16 element by element); WidenF16
// lane by lane on the baseline, which has no conversion instruction. Exact either way.
template <typename N>
VTOKEN_INLINE Lanes16<N> LoadF16(const uint16_t* at) {
  using L = Lanes16<N>;
  L v;
#if defined(__x86_64__)
  if constexpr (L::kParts < 4) {
    for (int p = 0; p < L::kParts; ++p) {
      const auto& h = *reinterpret_cast<const uint16_t(*)[L::kWidth]>(at + p * L::kWidth);
      asm("vcvtph2ps %1, %0" : "=v"(v.part[p]) : "m"(h));
    }
    return v;
  }
#endif
  for (int p = 0; p < L::kParts; ++p) {
    for (int l = 0; l < L::kWidth; ++l) v.part[p][l] = WidenF16(at[p * L::kWidth + l]);
  }
  return v;
}

// v's 16 lanes rounded to binary16 (to nearest, ties to even: NarrowF16's rounding) at `at`: one
// F16C `vcvtps2ph` per part on AVX2 and AVX-512 (asm, as above), NarrowF16 lane by lane on the
// baseline.
template <typename N>
VTOKEN_INLINE void StoreF16(const Lanes16<N>& v, uint16_t* at) {
  using L = Lanes16<N>;
#if defined(__x86_64__)
  if constexpr (L::kParts < 4) {
    for (int p = 0; p < L::kParts; ++p) {
      auto& h = *reinterpret_cast<uint16_t(*)[L::kWidth]>(at + p * L::kWidth);
      asm("vcvtps2ph $0, %1, %0" : "=m"(h) : "v"(v.part[p]));
    }
    return;
  }
#endif
  for (int p = 0; p < L::kParts; ++p) {
    for (int l = 0; l < L::kWidth; ++l) at[p * L::kWidth + l] = NarrowF16(v.part[p][l]);
  }
}

// Lanes16<N> of a KV row's elements (fp32 or binary16) at `at`.
template <typename N>
VTOKEN_INLINE Lanes16<N> LoadKv(const float* at) {
  return Lanes16<N>::Load(at);
}
template <typename N>
VTOKEN_INLINE Lanes16<N> LoadKv(const uint16_t* at) {
  return LoadF16<N>(at);
}
VTOKEN_INLINE float KvValue(float x) { return x; }
VTOKEN_INLINE float KvValue(uint16_t bits) { return WidenF16(bits); }

VTOKEN_INLINE float Dot(const float* a, const float* b, int64_t n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

VTOKEN_INLINE float Sum(const float* a, int64_t n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i];
  return s;
}

VTOKEN_INLINE float Max(const float* a, int64_t n) {
  float m = a[0];
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = std::max(m, a[i]);
  return m;
}

// exp(x) for x clamped to [-87, 88], vectorisable: lib/core/fast_exp.h.
VTOKEN_INLINE float Exp(float x) { return FastExp(x); }

}  // namespace vtoken::model::simd
