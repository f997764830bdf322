// CpuGemm, the fused CPU step's prefill projections at the AVX-512 level (torch-free, so also
// under ASan), on every instruction-set level this CPU has (cpu_isa.h): against a double-precision
// reference over shapes that span several row blocks and leave partial row tiles and panels; the
// same bits whichever output ranges the work is split into; the same bits on AVX2 as on AVX-512.
#include "lib/model/cpu_gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "lib/model/cpu_isa.h"

namespace vtoken::model {
namespace {

struct Gemm {
  int64_t rows, in, out;
  bool bias, accumulate;
  std::vector<float> x, w, b, y0;

  // y, computed over the output ranges [0, cut[0]), [cut[0], cut[1]), ..., [cut.back(), out).
  std::vector<float> Run(const std::vector<int64_t>& cuts) const {
    std::vector<float> y = y0;
    const CpuLinearArgs a{.x = x.data(),
                          .w = w.data(),
                          .bias = bias ? b.data() : nullptr,
                          .y = y.data(),
                          .rows = rows,
                          .in_features = in,
                          .out_features = out,
                          .accumulate = accumulate};
    int64_t begin = 0;
    for (int64_t end : cuts) {
      CpuGemm(a, begin, end);
      begin = end;
    }
    CpuGemm(a, begin, out);
    return y;
  }

  double Want(int64_t r, int64_t o) const {
    double s = bias ? b[o] : 0.0;
    for (int64_t i = 0; i < in; ++i) s += static_cast<double>(x[r * in + i]) * w[o * in + i];
    return accumulate ? s + y0[r * out + o] : s;
  }
};

Gemm RandomGemm(std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> rows(65, 2 * kGemmBlockRows + 30), in(1, 100),
      out(1, 3 * kGemmPanel + 20);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Gemm g{rows(rng), in(rng), out(rng), rng() % 2 == 0, rng() % 2 == 0, {}, {}, {}, {}};
  if (rng() % 3 == 0) g.in = 576;  // SmolLM2's hidden size.
  g.x.resize(g.rows * g.in);
  g.w.resize(g.out * g.in);
  g.b.resize(g.out);
  g.y0.resize(g.rows * g.out);
  for (auto* v : {&g.x, &g.w, &g.b, &g.y0}) {
    for (float& f : *v) f = normal(rng);
  }
  return g;
}

TEST(CpuGemmTest, EveryIsaMatchesADoubleReferenceAndSplitsChangeNoBit) {
  const uint64_t base = std::random_device{}();
  constexpr uint64_t kCases = 30;
  std::printf("seeds %llu..%llu (a failure names its seed); ISAs up to %s\n",
              static_cast<unsigned long long>(base),
              static_cast<unsigned long long>(base + kCases - 1),
              std::string(CpuIsaName(HostCpuIsa())).c_str());
  int64_t partial_panels = 0, blocks = 0;
  for (uint64_t seed = base; seed < base + kCases; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const Gemm g = RandomGemm(rng);
    partial_panels += g.out % kGemmPanel != 0 ? 1 : 0;
    blocks += g.rows > kGemmBlockRows ? 1 : 0;
    std::uniform_int_distribution<int64_t> cut(0, g.out);
    std::vector<int64_t> cuts = {cut(rng), cut(rng)};
    std::sort(cuts.begin(), cuts.end());
    std::optional<std::vector<float>> fma;
    for (CpuIsa isa : HostCpuIsas()) {
      SCOPED_TRACE(std::string(CpuIsaName(isa)));
      ASSERT_TRUE(SetCpuIsa(isa).ok());
      const std::vector<float> whole = g.Run({});
      ASSERT_EQ(g.Run(cuts), whole);
      for (int64_t r = 0; r < g.rows; ++r) {
        for (int64_t o = 0; o < g.out; ++o) {
          const double want = g.Want(r, o);
          ASSERT_NEAR(whole[r * g.out + o], want, 1e-5 * (std::sqrt(g.in) + std::abs(want)))
              << "row " << r << " output " << o << " of " << g.rows << "x" << g.in << " -> "
              << g.out;
        }
      }
      if (isa == CpuIsa::kBaseline) continue;
      if (!fma) {
        fma = whole;
        continue;
      }
      ASSERT_EQ(whole, *fma) << "AVX2 and AVX-512 differ";
    }
  }
  ASSERT_TRUE(SetCpuIsa(HostCpuIsa()).ok());
  EXPECT_GT(partial_panels, 10);
  EXPECT_GT(blocks, 10);
}

// The fused step takes CpuGemm at the AVX-512 level only (cpu_gemm.h).
TEST(CpuGemmTest, UsedAtTheAvx512LevelOnly) {
  for (CpuIsa isa : HostCpuIsas()) {
    ASSERT_TRUE(SetCpuIsa(isa).ok());
    EXPECT_EQ(UseCpuGemm(), isa == CpuIsa::kAvx512) << CpuIsaName(isa);
  }
  ASSERT_TRUE(SetCpuIsa(HostCpuIsa()).ok());
}

}  // namespace
}  // namespace vtoken::model
