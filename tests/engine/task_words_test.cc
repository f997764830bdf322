#include "lib/engine/task_words.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <set>
#include <string>
#include <vector>

#include "lib/engine/rng.h"

namespace vtoken::engine {
namespace {

TEST(TaskWordsTest, RandomNumbersHaveExactlyTheirDigits) {
  Rng rng(7, 1);
  for (int digits : {1, 5, 7}) {
    for (int i = 0; i < 200; ++i) {
      const std::string n = RandomNumber(rng, digits);
      ASSERT_EQ(n.size(), static_cast<size_t>(digits)) << n;
      EXPECT_NE(n.front(), '0') << n;  // no leading zero
      EXPECT_TRUE(std::all_of(n.begin(), n.end(), [](char c) { return std::isdigit(c) != 0; }));
    }
  }
}

TEST(TaskWordsTest, KeysAreDistinctAdjectiveNounPairs) {
  Rng rng(7, 2);
  KeyDrawer keys(rng);
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    const std::string key = keys.Next();
    const size_t dash = key.find('-');
    ASSERT_NE(dash, std::string::npos) << key;
    EXPECT_GT(dash, 0u);
    EXPECT_LT(dash + 1, key.size());
    EXPECT_TRUE(seen.insert(key).second) << key;
  }
}

TEST(TaskWordsTest, PseudoWordsAreDistinctConsonantVowelSyllables) {
  Rng rng(7, 3);
  const std::vector<std::string> words = PseudoWords(rng, 300);
  ASSERT_EQ(words.size(), 300u);
  EXPECT_EQ(std::set<std::string>(words.begin(), words.end()).size(), words.size());
  const std::string consonants = "bdfgklmnprstvz", vowels = "aeiou";
  for (const std::string& w : words) {
    ASSERT_TRUE(w.size() == 4 || w.size() == 6) << w;
    for (size_t i = 0; i < w.size(); ++i) {
      EXPECT_NE((i % 2 == 0 ? consonants : vowels).find(w[i]), std::string::npos) << w;
    }
  }
}

TEST(TaskWordsTest, ShuffleIsAPermutationDeterminedByTheSeed) {
  std::vector<int> a(50), b;
  for (int i = 0; i < 50; ++i) a[i] = i;
  b = a;
  Rng ra(7, 4), rb(7, 4);
  Shuffle(ra, a);
  Shuffle(rb, b);
  EXPECT_EQ(a, b);
  std::vector<int> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 50; ++i) EXPECT_EQ(sorted[i], i);
  EXPECT_NE(a, sorted);
}

}  // namespace
}  // namespace vtoken::engine
