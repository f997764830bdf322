// CpuQuantLinear on Q8_0, Q4_0 and Q4_1 weights made by QuantizeRow, on every instruction-set
// level this CPU has (cpu_isa.h): the same bits as CpuLinear on the weights DequantizeRow makes
// of the same bytes, at the same level; the same bits whichever output ranges the work is split
// into; close to a double-precision reference. Shapes leave partial tiles; some blocks are
// scaled down so that their f16 scales are subnormal or zero.
#include "lib/model/cpu_quant_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "lib/model/cpu_isa.h"
#include "lib/model/cpu_ops.h"
#include "lib/model/io/ggml_quants.h"
#include "lib/model/io/safetensors.h"

namespace vtoken::model {
namespace {

// Bit patterns, so that a comparison tells -0 from 0 and sees NaN equal to itself.
std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> bits(v.size());
  std::transform(v.begin(), v.end(), bits.begin(),
                 [](float f) { return std::bit_cast<uint32_t>(f); });
  return bits;
}

struct QuantLinear {
  GgmlType type;
  int64_t rows, in, out;
  bool bias, accumulate;
  std::vector<float> x, b, y0;
  std::string w;             // [out] rows of in / 32 blocks
  std::vector<float> w_f32;  // DequantizeRow(w)

  // y, computed over the output ranges [0, cut[0]), [cut[0], cut[1]), ..., [cut.back(), out).
  std::vector<float> Run(const std::vector<int64_t>& cuts) const {
    std::vector<float> y = y0;
    CpuQuantLinearArgs a{.x = x.data(),
                         .w = reinterpret_cast<const std::byte*>(w.data()),
                         .type = type,
                         .bias = bias ? b.data() : nullptr,
                         .y = y.data(),
                         .rows = rows,
                         .in_features = in,
                         .out_features = out,
                         .accumulate = accumulate};
    int64_t begin = 0;
    for (int64_t end : cuts) {
      CpuQuantLinear(a, begin, end);
      begin = end;
    }
    CpuQuantLinear(a, begin, out);
    return y;
  }

  // CpuLinear on the dequantized weights.
  std::vector<float> RunFp32() const {
    std::vector<float> y = y0;
    CpuLinear({.x = x.data(),
               .w = w_f32.data(),
               .bias = bias ? b.data() : nullptr,
               .y = y.data(),
               .rows = rows,
               .in_features = in,
               .out_features = out,
               .accumulate = accumulate},
              0, out);
    return y;
  }

  double Want(int64_t r, int64_t o) const {
    double s = bias ? b[o] : 0.0;
    for (int64_t i = 0; i < in; ++i) s += static_cast<double>(x[r * in + i]) * w_f32[o * in + i];
    return accumulate ? s + y0[r * out + o] : s;
  }
};

QuantLinear RandomQuantLinear(GgmlType type, std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> rows(1, 11), blocks(1, 48), out(1, 23);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  QuantLinear l{.type = type,
                .rows = rows(rng),
                .in = 32 * blocks(rng),
                .out = out(rng),
                .bias = rng() % 2 == 0,
                .accumulate = rng() % 2 == 0};
  if (rng() % 4 == 0) l.in = 576;  // SmolLM2's hidden size.
  l.x.resize(l.rows * l.in);
  l.b.resize(l.out);
  l.y0.resize(l.rows * l.out);
  for (auto* v : {&l.x, &l.b, &l.y0}) {
    for (float& f : *v) f = normal(rng);
  }
  // One block in eight scaled so far down that its scale is an f16 subnormal, or to zero.
  std::vector<float> w(l.out * l.in);
  constexpr float kScales[] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1e-4f, 0.0f};
  for (size_t block = 0; block < w.size(); block += 32) {
    const float scale = kScales[rng() % 8];
    for (size_t i = block; i < block + 32; ++i) w[i] = scale * normal(rng);
  }
  StatusOr<std::string> bytes = QuantizeRow(type, w);
  if (!bytes.ok()) {
    ADD_FAILURE() << bytes.status().message();
    return l;
  }
  l.w = *bytes;
  l.w_f32.resize(w.size());
  const Status dequantized =
      DequantizeRow(type, std::as_bytes(std::span(l.w.data(), l.w.size())), l.w_f32);
  EXPECT_TRUE(dequantized.ok()) << dequantized.message();
  return l;
}

TEST(CpuQuantLinearTest, SameBitsAsCpuLinearOnDequantizedWeightsOnEveryIsa) {
  const uint64_t base = std::random_device{}();
  constexpr uint64_t kCases = 450;
  constexpr GgmlType kTypes[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1};
  std::printf("seeds %llu..%llu (a failure names its seed); ISAs up to %s\n",
              static_cast<unsigned long long>(base),
              static_cast<unsigned long long>(base + kCases - 1),
              std::string(CpuIsaName(HostCpuIsa())).c_str());
  for (uint64_t seed = base; seed < base + kCases; ++seed) {
    const GgmlType type = kTypes[seed % 3];
    SCOPED_TRACE("seed " + std::to_string(seed) + ", " +
                 GgmlTypeInfo(static_cast<uint32_t>(type))->name);
    std::mt19937_64 rng(seed);
    const QuantLinear l = RandomQuantLinear(type, rng);
    ASSERT_FALSE(HasFailure());
    std::uniform_int_distribution<int64_t> cut(0, l.out);
    std::vector<int64_t> cuts = {cut(rng), cut(rng)};
    std::sort(cuts.begin(), cuts.end());
    std::vector<uint32_t> fma;
    for (CpuIsa isa : HostCpuIsas()) {
      SCOPED_TRACE(std::string(CpuIsaName(isa)));
      ASSERT_TRUE(SetCpuIsa(isa).ok());
      const std::vector<float> whole = l.Run({});
      ASSERT_EQ(Bits(whole), Bits(l.RunFp32()))
          << l.rows << "x" << l.in << " -> " << l.out << ": not CpuLinear's bits";
      ASSERT_EQ(Bits(l.Run(cuts)), Bits(whole)) << "cuts " << cuts[0] << ", " << cuts[1];
      for (int64_t r = 0; r < l.rows; ++r) {
        for (int64_t o = 0; o < l.out; ++o) {
          const double want = l.Want(r, o);
          ASSERT_NEAR(whole[r * l.out + o], want, 1e-5 * (std::sqrt(l.in) + std::abs(want)))
              << "row " << r << " output " << o << " of " << l.rows << "x" << l.in << " -> "
              << l.out;
        }
      }
      if (isa == CpuIsa::kBaseline) continue;
      if (fma.empty()) {
        fma = Bits(whole);
        continue;
      }
      ASSERT_EQ(Bits(whole), fma) << "AVX2 and AVX-512 differ";
    }
  }
  ASSERT_TRUE(SetCpuIsa(HostCpuIsa()).ok());
}

// CpuQ8Linear's contract computed here from the GGUF blocks, not the packed ones: x quantized as
// ggml's x86 quantize_row_q8_0 / q8_1 (d = amax / 127 and s = d * sum q rounded to f16, q = x *
// 127 / amax rounded to nearest even; q = 0 where amax <= 2^-100, whose d is an f16 zero), each
// block's integer dot product, then per block
// acc = fma(d_w * d_x, isum, acc) and macc = fma(m_w, s_x, macc) in block order.
std::vector<float> Q8Reference(const QuantLinear& l) {
  const int64_t blocks = l.in / 32;
  const int64_t block_bytes = l.type == GgmlType::kQ8_0 ? 34 : l.type == GgmlType::kQ4_0 ? 18 : 20;
  std::vector<float> y = l.y0;
  for (int64_t r = 0; r < l.rows; ++r) {
    for (int64_t o = 0; o < l.out; ++o) {
      float acc = 0.0f, macc = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        const float* v = l.x.data() + r * l.in + b * 32;
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
        const float id = amax > 0x1p-100f ? 127.0f / amax : 0.0f;
        int32_t q[32], qsum = 0;
        for (int i = 0; i < 32; ++i) qsum += q[i] = static_cast<int32_t>(std::nearbyint(v[i] * id));
        const float dx = F16ToFloat(FloatToF16(amax / 127.0f));
        const float sx = F16ToFloat(FloatToF16(amax / 127.0f * static_cast<float>(qsum)));
        const auto* blk =
            reinterpret_cast<const uint8_t*>(l.w.data()) + (o * blocks + b) * block_bytes;
        const float dw = F16ToFloat(static_cast<uint16_t>(blk[0] | blk[1] << 8));
        int32_t isum = 0;
        for (int i = 0; i < 32; ++i) {
          int32_t w;
          if (l.type == GgmlType::kQ8_0) {
            w = static_cast<int8_t>(blk[2 + i]);
          } else {
            const uint8_t byte = blk[(l.type == GgmlType::kQ4_1 ? 4 : 2) + i % 16];
            w = (i < 16 ? byte & 0x0F : byte >> 4) - (l.type == GgmlType::kQ4_0 ? 8 : 0);
          }
          isum += w * q[i];
        }
        acc = std::fma(dw * dx, static_cast<float>(isum), acc);
        if (l.type == GgmlType::kQ4_1) {
          macc = std::fma(F16ToFloat(static_cast<uint16_t>(blk[2] | blk[3] << 8)), sx, macc);
        }
      }
      const float sum = acc + macc + (l.bias ? l.b[o] : 0.0f);
      float& out = y[r * l.out + o];
      out = l.accumulate ? out + sum : sum;
    }
  }
  return y;
}

// CpuQ8Linear on the packed weights over the output ranges split at `cuts`.
std::vector<float> RunQ8(const QuantLinear& l, const std::vector<std::byte>& packed,
                         const std::vector<int64_t>& cuts) {
  std::vector<float> y = l.y0;
  const CpuQuantLinearArgs a{.x = l.x.data(),
                             .w = packed.data(),
                             .type = l.type,
                             .bias = l.bias ? l.b.data() : nullptr,
                             .y = y.data(),
                             .rows = l.rows,
                             .in_features = l.in,
                             .out_features = l.out,
                             .accumulate = l.accumulate};
  int64_t begin = 0;
  for (int64_t end : cuts) {
    CpuQ8Linear(a, begin, end);
    begin = end;
  }
  CpuQ8Linear(a, begin, l.out);
  return y;
}

TEST(CpuQ8LinearTest, ContractBitsOnEveryKernelAndSplit) {
  const uint64_t base = std::random_device{}();
  constexpr uint64_t kCases = 300;
  constexpr GgmlType kTypes[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1};
  std::printf("seeds %llu..%llu (a failure names its seed); kernels up to %s\n",
              static_cast<unsigned long long>(base),
              static_cast<unsigned long long>(base + kCases - 1),
              std::string(CpuQ8KernelName(ActiveCpuQ8Kernel())).c_str());
  for (uint64_t seed = base; seed < base + kCases; ++seed) {
    const GgmlType type = kTypes[seed % 3];
    SCOPED_TRACE("seed " + std::to_string(seed) + ", " +
                 GgmlTypeInfo(static_cast<uint32_t>(type))->name);
    std::mt19937_64 rng(seed);
    QuantLinear l = RandomQuantLinear(type, rng);
    ASSERT_FALSE(HasFailure());
    // More rows and outputs than CpuQuantLinear's cases: partial row tiles of 8 and groups of 16.
    if (seed % 2 == 0) {
      l.rows = 1 + static_cast<int64_t>(rng() % 20);
      l.x.resize(l.rows * l.in);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (float& f : l.x) f = normal(rng);
      l.y0.assign(l.rows * l.out, 0.5f);
    }
    // Blocks of x that are all zero, and one of very different magnitude.
    if (seed % 5 == 0) std::fill_n(l.x.begin(), std::min<int64_t>(32, l.in), 0.0f);
    if (seed % 7 == 0) l.x[rng() % l.x.size()] *= 1e4f;
    // A block below 2^-100 (q = 0) or just above it (an f16 scale of zero, q not zero).
    for (const float tiny : {1e-33f, 1e-29f}) {
      if (rng() % 6 == 0) {
        for (int64_t i = 0; i < std::min<int64_t>(32, l.in); ++i)
          l.x[l.in * (l.rows - 1) + i] *= tiny;
      }
    }
    const std::vector<std::byte> packed =
        PackStoredQ8(type, std::as_bytes(std::span(l.w.data(), l.w.size())), l.out, l.in);
    ASSERT_EQ(packed.size(), static_cast<size_t>((l.out + 15) / 16 * 16 * (l.w.size() / l.out)));
    const std::vector<uint32_t> want = Bits(Q8Reference(l));
    std::uniform_int_distribution<int64_t> cut(0, l.out);
    std::vector<int64_t> cuts = {cut(rng), cut(rng)};
    std::sort(cuts.begin(), cuts.end());
    for (CpuIsa isa : HostCpuIsas()) {
      ASSERT_TRUE(SetCpuIsa(isa).ok());
      SCOPED_TRACE(std::string(CpuQ8KernelName(ActiveCpuQ8Kernel())));
      ASSERT_EQ(Bits(RunQ8(l, packed, {})), want)
          << l.rows << "x" << l.in << " -> " << l.out << ": not the contract's bits";
      ASSERT_EQ(Bits(RunQ8(l, packed, cuts)), want) << "cuts " << cuts[0] << ", " << cuts[1];
      // Rows quantized beforehand (prefill chunks), in two row ranges, then the outputs in two.
      CpuQ8Activations x;
      CpuQ8Prepare(l.rows, l.in, x);
      const int64_t mid = static_cast<int64_t>(seed % static_cast<uint64_t>(l.rows + 1));
      CpuQ8Quantize(l.x.data(), mid, l.rows, x);
      CpuQ8Quantize(l.x.data(), 0, mid, x);
      std::vector<float> y = l.y0;
      const CpuQuantLinearArgs a{.w = packed.data(),
                                 .type = l.type,
                                 .bias = l.bias ? l.b.data() : nullptr,
                                 .y = y.data(),
                                 .rows = l.rows,
                                 .in_features = l.in,
                                 .out_features = l.out,
                                 .accumulate = l.accumulate};
      CpuQ8Linear(a, x, 0, cuts[0]);
      CpuQ8Linear(a, x, cuts[0], l.out);
      ASSERT_EQ(Bits(y), want) << "quantized beforehand, rows split at " << mid;
    }
  }
  ASSERT_TRUE(SetCpuIsa(HostCpuIsa()).ok());
}

// Against the fp32 product on the dequantized weights: within the error that quantizing x adds,
// |x - d q| <= d / 2 from rounding q plus |x| 2^-11 from rounding d to f16, for each element,
// times |w|, plus float rounding; and that error is really there (not the exact path's bits).
TEST(CpuQ8LinearTest, WithinTheActivationQuantizationError) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  int64_t differ = 0, total = 0;
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1}) {
    for (int c = 0; c < 20; ++c) {
      const QuantLinear l = RandomQuantLinear(type, rng);
      ASSERT_FALSE(HasFailure());
      const std::vector<std::byte> packed =
          PackStoredQ8(type, std::as_bytes(std::span(l.w.data(), l.w.size())), l.out, l.in);
      const std::vector<float> got = RunQ8(l, packed, {});
      const std::vector<float> exact = l.RunFp32();
      for (int64_t r = 0; r < l.rows; ++r) {
        for (int64_t o = 0; o < l.out; ++o) {
          double bound = 0.0;
          for (int64_t b = 0; b < l.in; b += 32) {
            double amax = 0.0, wsum = 0.0;
            for (int64_t i = b; i < b + 32; ++i) {
              amax = std::max(amax, std::fabs(static_cast<double>(l.x[r * l.in + i])));
              wsum += std::fabs(static_cast<double>(l.w_f32[o * l.in + i]));
            }
            bound += wsum * amax * (0.5 / 127.0 + std::ldexp(1.0, -11)) * 1.01;
          }
          const double want = l.Want(r, o);
          const double err = std::fabs(got[r * l.out + o] - want);
          ASSERT_LE(err, bound + 1e-5 * (std::sqrt(l.in) + std::fabs(want)))
              << GgmlTypeInfo(static_cast<uint32_t>(type))->name << " row " << r << " output " << o
              << " of " << l.rows << "x" << l.in << " -> " << l.out;
          differ += got[r * l.out + o] != exact[r * l.out + o];
          ++total;
        }
      }
    }
  }
  std::printf("%lld of %lld outputs differ from the exact path's\n", static_cast<long long>(differ),
              static_cast<long long>(total));
  EXPECT_GT(differ, total / 2);
}

TEST(CpuQuantLinearTest, SupportsOnlyTheQ8_0AndQ4Family) {
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1}) {
    EXPECT_TRUE(CpuQuantLinearSupports(type)) << static_cast<int>(type);
  }
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ5_0,
                        GgmlType::kQ5_1, GgmlType::kQ8_1, GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    EXPECT_FALSE(CpuQuantLinearSupports(type)) << static_cast<int>(type);
  }
}

}  // namespace
}  // namespace vtoken::model
