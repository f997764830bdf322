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
