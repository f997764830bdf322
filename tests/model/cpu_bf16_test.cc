// CpuBf16Linear (cpu_bf16.h) against a reference written from its contract (vdpbf16ps's
// rounding and order, from Intel's definition), on every kernel this CPU runs and whatever output
// and row ranges the work is split into; within bf16's rounding error of the fp32 product; and
// RoundBf16 on the cases its rule names (the AVX-512 BF16 kernel rounds with vcvtne2ps2bf16, so
// the equal words on every kernel check the hardware against it).
#include "lib/model/cpu_bf16.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "lib/model/cpu_isa.h"

namespace vtoken::model {
namespace {

std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> bits(v.size());
  std::transform(v.begin(), v.end(), bits.begin(),
                 [](float f) { return std::bit_cast<uint32_t>(f); });
  return bits;
}

TEST(RoundBf16Test, NearestEvenSubnormalsToZeroNanQuiet) {
  auto bits = [](uint32_t u) { return RoundBf16(std::bit_cast<float>(u)); };
  EXPECT_EQ(RoundBf16(1.0f), 0x3F80);
  EXPECT_EQ(RoundBf16(-2.0f), 0xC000);
  EXPECT_EQ(bits(0x3F808000), 0x3F80);  // halfway, to the even 0x3F80
  EXPECT_EQ(bits(0x3F818000), 0x3F82);  // halfway, to the even 0x3F82
  EXPECT_EQ(bits(0x3F808001), 0x3F81);  // above halfway
  EXPECT_EQ(bits(0x3F807FFF), 0x3F80);  // below halfway
  EXPECT_EQ(bits(0x00000001), 0x0000);  // subnormal: zero of its sign
  EXPECT_EQ(bits(0x807FFFFF), 0x8000);
  EXPECT_EQ(bits(0x00800000), 0x0080);  // the smallest normal stays
  EXPECT_EQ(RoundBf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(RoundBf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to infinity
  EXPECT_EQ(bits(0x7F800001) & 0x7FC0, 0x7FC0);                     // signalling NaN: quiet
  EXPECT_EQ(WidenBf16(0x3FC0), 1.5f);
  EXPECT_EQ(WidenBf16(RoundBf16(0.1f)), std::bit_cast<float>(0x3DCD0000u));
}

struct Case {
  int64_t rows, in, out;
  bool bias, accumulate;
  std::vector<float> x, w, b, y0;
};

// Magnitudes 2^-8..2^8 with either sign: no product or partial sum is subnormal.
Case RandomCase(std::mt19937_64& rng, int64_t max_rows) {
  Case c;
  c.rows = 1 + static_cast<int64_t>(rng() % max_rows);
  c.in = 2 * (1 + static_cast<int64_t>(rng() % 160));
  c.out = 1 + static_cast<int64_t>(rng() % 120);
  c.bias = rng() % 2 == 0;
  c.accumulate = rng() % 3 == 0;
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-8, 8);
  auto value = [&] {
    const float v = std::ldexp(mantissa(rng), exponent(rng));
    return rng() % 2 == 0 ? v : -v;
  };
  for (auto [v, n] : {std::pair{&c.x, c.rows * c.in}, std::pair{&c.w, c.out * c.in},
                      std::pair{&c.b, c.out}, std::pair{&c.y0, c.rows * c.out}}) {
    v->resize(n);
    for (float& f : *v) f = value();
  }
  if (rng() % 4 == 0) std::fill_n(c.x.begin(), c.in, 0.0f);  // a row of zeros
  return c;
}

// The contract, element by element: odd then even product of each pair, each step one fma.
std::vector<float> Reference(const Case& c) {
  auto r = [](float v) { return WidenBf16(RoundBf16(v)); };
  std::vector<float> y = c.y0;
  for (int64_t i = 0; i < c.rows; ++i) {
    for (int64_t o = 0; o < c.out; ++o) {
      const float* x = c.x.data() + i * c.in;
      const float* w = c.w.data() + o * c.in;
      float acc = 0.0f;
      for (int64_t p = 0; p < c.in / 2; ++p) {
        acc = std::fma(r(x[2 * p + 1]), r(w[2 * p + 1]), acc);
        acc = std::fma(r(x[2 * p]), r(w[2 * p]), acc);
      }
      if (c.bias) acc += c.b[o];
      float& out = y[i * c.out + o];
      out = c.accumulate ? acc + out : acc;
    }
  }
  return y;
}

CpuQuantLinearArgs Args(const Case& c, const std::vector<std::byte>& packed,
                        std::vector<float>& y) {
  return {.x = c.x.data(),
          .w = packed.data(),
          .type = GgmlType::kBF16,
          .bias = c.bias ? c.b.data() : nullptr,
          .y = y.data(),
          .rows = c.rows,
          .in_features = c.in,
          .out_features = c.out,
          .accumulate = c.accumulate};
}

TEST(CpuBf16LinearTest, ContractBitsOnEveryKernelAndSplit) {
  const uint64_t base = std::random_device{}();
  constexpr uint64_t kCases = 200;
  std::printf("seeds %llu..%llu (a failure names its seed); kernels up to %s\n",
              static_cast<unsigned long long>(base),
              static_cast<unsigned long long>(base + kCases - 1),
              std::string(CpuBf16KernelName(ActiveCpuBf16Kernel())).c_str());
  for (uint64_t seed = base; seed < base + kCases; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    // Every tenth case has more rows than a block of 192 (prefill chunks).
    const Case c = RandomCase(rng, seed % 10 == 0 ? 260 : 20);
    const std::vector<std::byte> packed = PackBf16(c.w.data(), c.out, c.in);
    ASSERT_EQ(packed.size(), static_cast<size_t>((c.out + 15) / 16 * 16 * c.in * 2));
    const std::vector<uint32_t> want = Bits(Reference(c));
    std::uniform_int_distribution<int64_t> cut(0, c.out);
    std::vector<int64_t> cuts = {cut(rng), cut(rng)};
    std::sort(cuts.begin(), cuts.end());
    std::vector<uint32_t> words;
    for (CpuIsa isa : HostCpuIsas()) {
      ASSERT_TRUE(SetCpuIsa(isa).ok());
      SCOPED_TRACE(std::string(CpuBf16KernelName(ActiveCpuBf16Kernel())));
      std::vector<float> y = c.y0;
      CpuBf16Linear(Args(c, packed, y), 0, c.out);
      ASSERT_EQ(Bits(y), want) << c.rows << "x" << c.in << " -> " << c.out
                               << ": not the contract's bits";
      y = c.y0;
      for (auto [b, e] : {std::pair{cuts[1], c.out}, {0, cuts[0]}, {cuts[0], cuts[1]}}) {
        CpuBf16Linear(Args(c, packed, y), b, e);
      }
      ASSERT_EQ(Bits(y), want) << "cuts " << cuts[0] << ", " << cuts[1];
      // Rows rounded beforehand (prefill chunks), in two row ranges: the same words on every
      // kernel, then the same outputs.
      CpuBf16Activations x;
      CpuBf16Prepare(c.rows, c.in, x);
      const int64_t mid = static_cast<int64_t>(seed % static_cast<uint64_t>(c.rows + 1));
      CpuBf16Round(c.x.data(), mid, c.rows, x);
      CpuBf16Round(c.x.data(), 0, mid, x);
      if (words.empty()) words = x.x;
      ASSERT_EQ(x.x, words) << "rounded rows differ from the first kernel's";
      y = c.y0;
      CpuBf16Linear(Args(c, packed, y), x, 0, cuts[0]);
      CpuBf16Linear(Args(c, packed, y), x, cuts[0], c.out);
      ASSERT_EQ(Bits(y), want) << "rounded beforehand, rows split at " << mid;
    }
  }
  ASSERT_TRUE(SetCpuIsa(HostCpuIsa()).ok());
}

// Rounding on every kernel, special values included: each word is RoundBf16's.
TEST(CpuBf16LinearTest, RoundsAsRoundBf16OnEveryKernel) {
  std::vector<float> in = {0.0f,
                           -0.0f,
                           1e-40f,
                           -1e-40f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::quiet_NaN(),
                           std::bit_cast<float>(0x3F808000u),
                           std::bit_cast<float>(0x3F818000u)};
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  while (in.size() < 3 * 64) in.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  for (CpuIsa isa : HostCpuIsas()) {
    ASSERT_TRUE(SetCpuIsa(isa).ok());
    SCOPED_TRACE(std::string(CpuBf16KernelName(ActiveCpuBf16Kernel())));
    CpuBf16Activations x;
    CpuBf16Prepare(3, 64, x);
    CpuBf16Round(in.data(), 0, 3, x);
    for (size_t i = 0; i < in.size(); ++i) {
      const uint16_t got = static_cast<uint16_t>(x.x[i / 2] >> (16 * (i % 2)));
      const uint16_t want = RoundBf16(in[i]);
      if (std::isnan(in[i])) {
        // The quiet bit set; which payload a NaN keeps is not part of the contract.
        EXPECT_EQ(got & 0x7FC0, 0x7FC0) << i;
      } else {
        EXPECT_EQ(got, want) << "element " << i << " = " << in[i];
      }
    }
  }
  ASSERT_TRUE(SetCpuIsa(HostCpuIsa()).ok());
}

// Against the fp32 product of the unrounded values: each product's two roundings to bf16 (8
// significant bits: a relative 2^-8 each) bound the error by about 2^-7 of sum |x w|, plus float
// rounding; and the error is there (the kernel really rounds).
TEST(CpuBf16LinearTest, WithinBf16RoundingOfTheFp32Product) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  int differ = 0, outputs = 0;
  for (int t = 0; t < 20; ++t) {
    Case c = RandomCase(rng, 12);
    c.bias = c.accumulate = false;
    const std::vector<std::byte> packed = PackBf16(c.w.data(), c.out, c.in);
    std::vector<float> y(c.rows * c.out);
    CpuBf16Linear(Args(c, packed, y), 0, c.out);
    for (int64_t i = 0; i < c.rows; ++i) {
      for (int64_t o = 0; o < c.out; ++o) {
        double exact = 0, magnitude = 0;
        for (int64_t k = 0; k < c.in; ++k) {
          const double p = static_cast<double>(c.x[i * c.in + k]) * c.w[o * c.in + k];
          exact += p;
          magnitude += std::abs(p);
        }
        const double got = y[i * c.out + o];
        EXPECT_LE(std::abs(got - exact), magnitude * (0x1p-7 + 0x1p-16 + c.in * 0x1p-24))
            << "row " << i << " output " << o;
        differ += static_cast<float>(exact) != static_cast<float>(got);
        ++outputs;
      }
    }
  }
  EXPECT_GT(differ, outputs / 2) << "bf16 rounding left most outputs at fp32's";
}

}  // namespace
}  // namespace vtoken::model
