#include "lib/engine/rouge.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace vtoken::engine {
namespace {

using Tokens = std::vector<std::string>;

TEST(RougeTokenizeTest, LowercasesAndSplitsOnNonAlphanumerics) {
  EXPECT_EQ(RougeTokenize("Hello, WORLD!!! it's-me"), (Tokens{"hello", "world", "it", "s", "me"}));
  EXPECT_EQ(RougeTokenize("  Room 101b\tand\n\nthe_end  "),
            (Tokens{"room", "101b", "and", "the", "end"}));
  EXPECT_EQ(RougeTokenize(""), Tokens{});
  EXPECT_EQ(RougeTokenize("!?.,;: -"), Tokens{});
}

TEST(RougeTokenizeTest, NonAsciiIsASeparatorExceptWherePythonLowercasesToAscii) {
  // "naïve café": ï and é are not in [a-z0-9] after lowercasing.
  EXPECT_EQ(RougeTokenize("naïve café"), (Tokens{"na", "ve", "caf"}));
  // U+212A KELVIN SIGN lowercases to 'k'; U+0130 to 'i' + U+0307 (a separator).
  EXPECT_EQ(RougeTokenize("5\u212A run"), (Tokens{"5k", "run"}));
  EXPECT_EQ(RougeTokenize("\u0130stanbul"), (Tokens{"i", "stanbul"}));
}

TEST(RougeLTest, IdenticalTextsScoreOne) {
  const RougeLScore s = RougeL("The cat sat.", "the CAT sat");
  EXPECT_DOUBLE_EQ(s.precision, 1.0);
  EXPECT_DOUBLE_EQ(s.recall, 1.0);
  EXPECT_DOUBLE_EQ(s.f1, 1.0);
}

TEST(RougeLTest, RougeScoreReadmeExample) {
  // candidate: the quick brown dog jumps on the log (8 tokens)
  // reference: the quick brown fox jumps over the lazy dog (9 tokens)
  // LCS = the quick brown jumps the = 5; P = 5/8, R = 5/9, F = 2*5/(8+9) = 10/17.
  const RougeLScore s = RougeL("The quick brown dog jumps on the log.",
                               "The quick brown fox jumps over the lazy dog");
  EXPECT_DOUBLE_EQ(s.precision, 5.0 / 8.0);
  EXPECT_DOUBLE_EQ(s.recall, 5.0 / 9.0);
  EXPECT_NEAR(s.f1, 10.0 / 17.0, 1e-15);
}

TEST(RougeLTest, PunctuationAndCase) {
  // candidate tokens: hello world it s me (5); reference: hello world its me (4).
  // LCS = hello world me = 3; P = 3/5, R = 3/4, F = 2*3/(5+4) = 2/3.
  const RougeLScore s = RougeL("Hello, WORLD!!! it's-me", "hello world its me");
  EXPECT_DOUBLE_EQ(s.precision, 0.6);
  EXPECT_DOUBLE_EQ(s.recall, 0.75);
  EXPECT_NEAR(s.f1, 2.0 / 3.0, 1e-15);
}

TEST(RougeLTest, RepeatedWords) {
  // candidate a a a a (4), reference a b a (3): LCS = a a = 2; P = 1/2, R = 2/3, F = 4/7.
  const RougeLScore s = RougeL("a a a a", "a b a");
  EXPECT_DOUBLE_EQ(s.precision, 0.5);
  EXPECT_DOUBLE_EQ(s.recall, 2.0 / 3.0);
  EXPECT_NEAR(s.f1, 4.0 / 7.0, 1e-15);
}

TEST(RougeLTest, OrderMatters) {
  // a b c d vs d c b a: LCS = 1; P = R = 1/4, F = 1/4.
  EXPECT_DOUBLE_EQ(RougeLF1("a b c d", "d c b a"), 0.25);
}

TEST(RougeLTest, EmptyOrDisjointTextsScoreZero) {
  for (const auto& [cand, ref] : std::vector<std::pair<std::string, std::string>>{
           {"", "abc"}, {"abc", ""}, {"", ""}, {"!!!", "abc"}, {"x y", "z"}}) {
    const RougeLScore s = RougeL(cand, ref);
    EXPECT_EQ(s.precision, 0.0) << cand << " | " << ref;
    EXPECT_EQ(s.recall, 0.0) << cand << " | " << ref;
    EXPECT_EQ(s.f1, 0.0) << cand << " | " << ref;
  }
}

// Textbook full-table LCS, the reference for the two-row implementation.
int64_t NaiveLcs(const Tokens& a, const Tokens& b) {
  std::vector<std::vector<int64_t>> t(a.size() + 1, std::vector<int64_t>(b.size() + 1, 0));
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      t[i][j] = a[i - 1] == b[j - 1] ? t[i - 1][j - 1] + 1 : std::max(t[i - 1][j], t[i][j - 1]);
    }
  }
  return t[a.size()][b.size()];
}

TEST(RougeLTest, LcsMatchesNaiveReferenceOnRandomLists) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const int vocab = 1 + static_cast<int>(rng() % 8);
    auto random_list = [&] {
      Tokens t(rng() % 40);
      for (std::string& w : t) w = "w" + std::to_string(rng() % vocab);
      return t;
    };
    const Tokens a = random_list(), b = random_list();
    ASSERT_EQ(LongestCommonSubsequence(a, b), NaiveLcs(a, b)) << "trial " << trial;
    ASSERT_EQ(LongestCommonSubsequence(b, a), NaiveLcs(a, b)) << "trial " << trial;
  }
}

TEST(RougeLTest, LongOutputs) {
  // 512 tokens against the same 512 with every 4th token replaced: LCS = 384 of 512 each.
  std::string cand, ref;
  for (int i = 0; i < 512; ++i) {
    cand += "t" + std::to_string(i) + " ";
    ref += (i % 4 == 0 ? "x" : "t") + std::to_string(i) + " ";
  }
  EXPECT_DOUBLE_EQ(RougeLF1(cand, ref), 0.75);
}

}  // namespace
}  // namespace vtoken::engine
