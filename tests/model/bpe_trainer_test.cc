#include "lib/model/io/bpe_trainer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <random>

#include "lib/model/io/pretokenizer.h"

namespace vtoken::model {
namespace {

namespace fs = std::filesystem;
using Merge = std::pair<std::string, std::string>;

const std::vector<std::string> kSpecials = {"<|begin_of_text|>", "<|end_of_text|>"};

// Naive reference: recounts every pair of every word before each merge.
std::vector<Merge> NaiveMerges(std::string_view corpus, int num_merges) {
  std::map<std::string, int64_t> counts;
  for (std::string_view p : PreTokenize(SplitPattern::kLlama3, corpus)) ++counts[std::string(p)];
  std::vector<std::string> tokens;
  std::map<std::string, int32_t> ids;
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(ByteToUnicode(static_cast<uint8_t>(b)));
    ids[tokens.back()] = b;
  }
  std::vector<std::pair<std::vector<int32_t>, int64_t>> words;
  for (const auto& [w, c] : counts) {
    std::vector<int32_t> sym;
    for (char ch : w) sym.push_back(static_cast<uint8_t>(ch));
    words.emplace_back(sym, c);
  }
  std::vector<Merge> merges;
  while (static_cast<int>(merges.size()) < num_merges) {
    std::map<std::pair<int32_t, int32_t>, int64_t> pairs;
    for (const auto& [sym, c] : words) {
      for (size_t i = 0; i + 1 < sym.size(); ++i) pairs[{sym[i], sym[i + 1]}] += c;
    }
    if (pairs.empty()) break;
    auto best = pairs.begin();  // Ordered by ids, so the first maximum has the smallest ids.
    for (auto it = pairs.begin(); it != pairs.end(); ++it) {
      if (it->second > best->second) best = it;
    }
    auto [a, b] = best->first;
    merges.emplace_back(tokens[a], tokens[b]);
    auto [it, is_new] = ids.emplace(tokens[a] + tokens[b], static_cast<int32_t>(tokens.size()));
    if (is_new) tokens.push_back(tokens[a] + tokens[b]);
    for (auto& [sym, c] : words) {
      std::vector<int32_t> next;
      for (size_t i = 0; i < sym.size(); ++i) {
        bool hit = i + 1 < sym.size() && sym[i] == a && sym[i + 1] == b;
        next.push_back(hit ? it->second : sym[i]);
        i += hit;
      }
      sym = std::move(next);
    }
  }
  return merges;
}

TEST(BpeTrainerTest, MostFrequentPairIsMergedFirst) {
  auto tok = TrainByteLevelBpe("ab ab ab ab ab cd xy", 256 + 3 + 2, kSpecials);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  ASSERT_EQ(tok->num_merges(), 3);
  // (a, b) x5 beats (Ġ, a) x4; then (Ġ, ab) x4; then ties at 1 go to the smallest ids: (Ġ, c).
  EXPECT_EQ(tok->spec().merges, (std::vector<Merge>{{"a", "b"}, {"Ġ", "ab"}, {"Ġ", "c"}}));
  EXPECT_EQ(tok->vocab_size(), 261);
  EXPECT_EQ(tok->TokenId("Ġab"), 257);
  EXPECT_EQ(tok->TokenId("<|begin_of_text|>"), 259);
  EXPECT_EQ(tok->bos_id(), 259);
  EXPECT_EQ(tok->eos_id(), 260);
  EXPECT_EQ(tok->Encode("ab ab"), (std::vector<int32_t>{256, 257}));
}

TEST(BpeTrainerTest, MatchesNaiveReferenceOnRandomText) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const std::vector<std::string> words = {"the",  "then", "there", "he",    "her", "aaaa",
                                          "abab", "ba",   "'s",    "12345", "é",   "Ωμ"};
  std::string corpus;
  for (int i = 0; i < 2000; ++i) {
    corpus += words[rng() % words.size()];
    corpus += (rng() % 8 == 0) ? "\n" : (rng() % 4 == 0 ? ", " : " ");
  }
  const int num_merges = 60;
  auto tok = TrainByteLevelBpe(corpus, 256 + num_merges + 2, kSpecials);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ(tok->spec().merges, NaiveMerges(corpus, num_merges));
}

TEST(BpeTrainerTest, SaveLoadRoundTrip) {
  const std::string corpus =
      "In the beginning God created the heaven and the earth.\n"
      "And the earth was without form, and void; and darkness was upon the face of the deep.\n"
      "<|end_of_text|>And God said, Let there be light: and there was light.\n";
  auto tok = TrainByteLevelBpe(corpus, 320, kSpecials);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ(tok->vocab_size(), 320);
  // Special tokens are split out of the corpus, never learned from.
  for (const auto& [a, b] : tok->spec().merges) EXPECT_EQ((a + b).find('|'), std::string::npos);

  fs::path path =
      fs::temp_directory_path() / ("vtoken_bpe_trainer_" + std::to_string(::getpid()) + ".json");
  ASSERT_TRUE(tok->Save(path.string()).ok());
  auto loaded = Tokenizer::Load(path.string());
  fs::remove(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->vocab_size(), 320);
  EXPECT_EQ(loaded->spec().merges, tok->spec().merges);
  const std::string text = "<|begin_of_text|>And the light was good. 1234 naïve\n\n";
  EXPECT_EQ(loaded->Encode(corpus), tok->Encode(corpus));
  EXPECT_EQ(loaded->Encode(text), tok->Encode(text));
  EXPECT_EQ(loaded->Decode(loaded->Encode(text)), text);
  EXPECT_EQ(tok->Decode(tok->Encode(corpus)), corpus);
  EXPECT_EQ(loaded->Encode(text)[0], 318);
}

TEST(BpeTrainerTest, RejectsBadArguments) {
  auto small = TrainByteLevelBpe("abc", 257, kSpecials);
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(small.status().message(), "vocab size 257 is below 256 byte tokens + 2 special tokens");

  auto repeated = TrainByteLevelBpe("abc", 300, {"<s>", "<s>"});
  ASSERT_FALSE(repeated.ok());
  EXPECT_EQ(repeated.status().message(), "special token '<s>' is empty, repeated or not UTF-8");

  auto invalid = TrainByteLevelBpe("abc", 300, {"\xFF"});
  ASSERT_FALSE(invalid.ok());
  EXPECT_EQ(invalid.status().code(), StatusCode::kInvalidArgument);
}

TEST(BpeTrainerTest, StopsWhenThePairsRunOut) {
  auto tok = TrainByteLevelBpe("abc", 400, {});
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ(tok->spec().merges, (std::vector<Merge>{{"a", "b"}, {"ab", "c"}}));
  EXPECT_EQ(tok->vocab_size(), 258);
}

}  // namespace
}  // namespace vtoken::model
