// CpuLinear, the fused CPU step's matrix tiles (torch-free, so also under ASan), on every
// instruction-set level this CPU has (cpu_isa.h): against a double-precision reference over
// shapes that leave partial tiles and a tail of k; the same bits whichever output ranges the
// work is split into; the same bits on AVX2 as on AVX-512. And cpu_isa.h's names and refusals.
#include "lib/model/cpu_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "lib/model/cpu_isa.h"

namespace vtoken::model {
namespace {

struct Linear {
  int64_t rows, in, out;
  bool bias, accumulate;
  std::vector<float> x, w, b, y0;

  // y, computed over the output ranges [0, cut[0]), [cut[0], cut[1]), ..., [cut.back(), out).
  std::vector<float> Run(const std::vector<int64_t>& cuts) const {
    std::vector<float> y = y0;
    CpuLinearArgs a{.x = x.data(),
                    .w = w.data(),
                    .bias = bias ? b.data() : nullptr,
                    .y = y.data(),
                    .rows = rows,
                    .in_features = in,
                    .out_features = out,
                    .accumulate = accumulate};
    int64_t begin = 0;
    for (int64_t end : cuts) {
      CpuLinear(a, begin, end);
      begin = end;
    }
    CpuLinear(a, begin, out);
    return y;
  }

  double Want(int64_t r, int64_t o) const {
    double s = bias ? b[o] : 0.0;
    for (int64_t i = 0; i < in; ++i) s += static_cast<double>(x[r * in + i]) * w[o * in + i];
    return accumulate ? s + y0[r * out + o] : s;
  }
};

Linear RandomLinear(std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> rows(1, 11), in(1, 100), out(1, 23);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Linear l{rows(rng), in(rng), out(rng), rng() % 2 == 0, rng() % 2 == 0, {}, {}, {}, {}};
  if (rng() % 4 == 0) l.in = 576;  // SmolLM2's hidden size: whole 16-float chunks only.
  l.x.resize(l.rows * l.in);
  l.w.resize(l.out * l.in);
  l.b.resize(l.out);
  l.y0.resize(l.rows * l.out);
  for (auto* v : {&l.x, &l.w, &l.b, &l.y0}) {
    for (float& f : *v) f = normal(rng);
  }
  return l;
}

TEST(CpuLinearTest, EveryIsaMatchesADoubleReferenceAndSplitsChangeNoBit) {
  const uint64_t base = std::random_device{}();
  constexpr uint64_t kCases = 200;
  std::printf("seeds %llu..%llu (a failure names its seed); ISAs up to %s\n",
              static_cast<unsigned long long>(base),
              static_cast<unsigned long long>(base + kCases - 1),
              std::string(CpuIsaName(HostCpuIsa())).c_str());
  for (uint64_t seed = base; seed < base + kCases; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const Linear l = RandomLinear(rng);
    std::uniform_int_distribution<int64_t> cut(0, l.out);
    std::vector<int64_t> cuts = {cut(rng), cut(rng)};
    std::sort(cuts.begin(), cuts.end());
    std::optional<std::vector<float>> fma;
    for (CpuIsa isa : HostCpuIsas()) {
      SCOPED_TRACE(std::string(CpuIsaName(isa)));
      ASSERT_TRUE(SetCpuIsa(isa).ok());
      const std::vector<float> whole = l.Run({});
      ASSERT_EQ(l.Run(cuts), whole);
      for (int64_t r = 0; r < l.rows; ++r) {
        for (int64_t o = 0; o < l.out; ++o) {
          const double want = l.Want(r, o);
          ASSERT_NEAR(whole[r * l.out + o], want, 1e-5 * (std::sqrt(l.in) + std::abs(want)))
              << "row " << r << " output " << o << " of " << l.rows << "x" << l.in << " -> "
              << l.out;
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
}

TEST(CpuIsaTest, NamesRoundTripAndBadNamesAreOneLineErrors) {
  for (CpuIsa isa : {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    StatusOr<CpuIsa> parsed = ParseCpuIsa(CpuIsaName(isa));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, isa);
  }
  StatusOr<CpuIsa> bad = ParseCpuIsa("sse9");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "CPU ISA 'sse9': must be one of baseline, avx2, avx512");
}

TEST(CpuIsaTest, ALevelAboveTheHostsIsRefusedAndTheEnvironmentIsApplied) {
  EXPECT_EQ(ActiveCpuIsa(), HostCpuIsa());
  if (HostCpuIsa() != CpuIsa::kAvx512) {
    const Status refused = SetCpuIsa(CpuIsa::kAvx512);
    EXPECT_EQ(refused.message(),
              "CPU ISA avx512: this CPU has " + std::string(CpuIsaName(HostCpuIsa())) + " at most");
    EXPECT_EQ(ActiveCpuIsa(), HostCpuIsa());
  }
  ASSERT_EQ(setenv("VTOKEN_CPU_ISA", "baseline", 1), 0);
  ASSERT_TRUE(ApplyCpuIsaEnvironment().ok());
  EXPECT_EQ(ActiveCpuIsa(), CpuIsa::kBaseline);
  ASSERT_EQ(setenv("VTOKEN_CPU_ISA", "avx1024", 1), 0);
  EXPECT_EQ(ApplyCpuIsaEnvironment().message(),
            "VTOKEN_CPU_ISA: CPU ISA 'avx1024': must be one of baseline, avx2, avx512");
  EXPECT_EQ(ActiveCpuIsa(), CpuIsa::kBaseline);
  ASSERT_EQ(unsetenv("VTOKEN_CPU_ISA"), 0);
  ASSERT_TRUE(ApplyCpuIsaEnvironment().ok());
  EXPECT_EQ(ActiveCpuIsa(), CpuIsa::kBaseline);  // Unset: nothing changes.
  ASSERT_TRUE(SetCpuIsa(HostCpuIsa()).ok());
}

}  // namespace
}  // namespace vtoken::model
